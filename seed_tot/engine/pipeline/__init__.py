"""PipeDec: pipeline-parallel decoding with a dynamic prediction tree, on torch.distributed.

stages.py  the target split into layer ranges (stock decoder layers, per-stage KV)
tree.py    the dynamic prediction tree (layer update, reroot/restart)
roles.py   what the draft process and each target-stage process do
schedule.py  tick loops: PipeDec, PP (no draft), STPP (static tree, the engine's verifier)
comm.py    in-memory and torch.distributed transports
launcher.py  simulation, local multi-process launch, joining a torchrun group
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Defined here, where no torch is imported, for the command line's --mode choices (schedule.py uses it).
PIPELINE_MODES = ("pipedec", "pp", "stpp")

__all__ = ["ModelSource", "PipelineConfig", "PipelineOutput", "PipelineStats", "PIPELINE_MODES", "TargetStage",
           "build_stages", "join_group", "launch", "simulate", "split_layers"]

if TYPE_CHECKING:
    from .launcher import ModelSource, PipelineConfig, PipelineOutput, join_group, launch, simulate
    from .schedule import PipelineStats
    from .stages import TargetStage, build_stages, split_layers

_LAZY = {**dict.fromkeys(("ModelSource", "PipelineConfig", "PipelineOutput", "join_group", "launch", "simulate"),
                         ".launcher"),
         "PipelineStats": ".schedule", **dict.fromkeys(("TargetStage", "build_stages", "split_layers"), ".stages")}


def __getattr__(name: str) -> Any:
    # the stages import torch: loaded on first use, so that `seed-tot generate --help` stays fast
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
