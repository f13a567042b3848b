"""PipeDec: pipeline-parallel decoding with a dynamic prediction tree, on torch.distributed.

stages.py  the target split into layer ranges (stock decoder layers, per-stage KV)
tree.py    the dynamic prediction tree (layer update, reroot/restart)
roles.py   what the draft process and each target-stage process do
schedule.py  tick loops: PipeDec, PP (no draft), STPP (static tree, the engine's verifier)
comm.py    in-memory and torch.distributed transports
launch.py  simulation, local multi-process launch, joining a torchrun group
"""
from .launch import ModelSource, PipelineConfig, PipelineOutput, join_group, launch, simulate
from .schedule import PIPELINE_MODES, PipelineStats
from .stages import TargetStage, build_stages, split_layers

__all__ = ["ModelSource", "PipelineConfig", "PipelineOutput", "PipelineStats", "PIPELINE_MODES", "TargetStage",
           "build_stages", "join_group", "launch", "simulate", "split_layers"]
