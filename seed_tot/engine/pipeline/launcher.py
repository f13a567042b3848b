"""Running a pipeline: simulated in one process, spawned as N + 1 local processes, or as one rank
of a group that torchrun (or a user, on several machines) started.

Rank 0 runs the draft, ranks 1..N the target's contiguous layer ranges. Processes are started by
torch's own machinery (`torch.multiprocessing.start_processes`) and talk over torch.distributed
(gloo). If any rank dies, the others are terminated and the caller gets one clear error naming
the rank; a run that outlives its timeout is killed the same way. Nothing is left behind.
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..cpu_threads import CpuThreads, share, usable_cores
from ..model_runtime import ModelRuntime
from ..params import GenerationResult, SamplingParams
from .comm import DistComm, LocalComm
from .roles import DraftRole, TargetRole, new_sequence
from .schedule import DRAFT_SEED_OFFSET, PIPELINE_MODES, PipelineStats, run_pipedec, run_stpp
from .stages import TargetStage, keep_only_stage, split_layers

log = logging.getLogger(__name__)


@dataclass
class PipelineConfig:
    mode: str = "pipedec"
    n_stages: int = 2
    width: int = 4  # PipeDec: nodes per tree layer
    children: int = 2  # PipeDec: children per node considered
    k_config: tuple[int, ...] = (2, 2, 1)  # STPP's static tree

    def __post_init__(self) -> None:
        if self.mode not in PIPELINE_MODES:
            raise ValueError(f"unknown pipeline mode {self.mode!r}; expected one of {', '.join(PIPELINE_MODES)}")
        if self.n_stages < 1 or self.width < 1 or self.children < 1:
            raise ValueError(f"--stages, --width and --children must be >= 1, got {self.n_stages}, "
                             f"{self.width}, {self.children}")


@dataclass
class ModelSource:
    """Models handed over as objects (tests, small models, an engine's) or as names each rank loads
    itself. A model a rank loads gets the linear kernel `Engine.from_pretrained` would give it
    (cpu_linear: "onednn", "stock", None for $SEED_TOT_CPU_LINEAR); objects are used as given."""

    target: Any
    draft: Any = None
    device: str = "cpu"
    dtype: str | None = None
    cpu_linear: str | None = None

    def load(self, which: str):
        obj = self.target if which == "target" else self.draft
        if not isinstance(obj, str):
            return obj
        from ..cpu_linear import ONEDNN, resolve_cpu_linear, use_onednn_linears
        from ..models import load_model_and_tokenizer
        linear = resolve_cpu_linear(self.cpu_linear)  # a bad value fails before the load
        dtype = getattr(torch, self.dtype) if self.dtype else None
        model = load_model_and_tokenizer(obj, torch.device(self.device), dtype)[0]
        if linear == ONEDNN:
            use_onednn_linears(model)
        return model


@dataclass
class PipelineOutput:
    result: GenerationResult
    stats: PipelineStats


def _roles(ranks, target, draft: ModelRuntime | None, prompt, params, cfg: PipelineConfig, vocab_size, eos_ids,
           tokenizer, seed):
    ranges = split_layers(target.config.num_hidden_layers, cfg.n_stages) if target is not None else None
    roles = []
    for rank in ranks:
        if rank == 0:
            seq = new_sequence(prompt, params, eos_ids, tokenizer, seed + DRAFT_SEED_OFFSET)
            roles.append(DraftRole(draft, seq, params, vocab_size, cfg.width, cfg.children, enabled=cfg.mode != "pp"))
        else:
            stage = TargetStage(target, ranges[rank - 1], rank == 1, rank == cfg.n_stages)
            roles.append(TargetRole(stage, rank, new_sequence(prompt, params, eos_ids, tokenizer, seed), params, vocab_size))
    return roles


def _run(roles, comm, cfg: PipelineConfig) -> PipelineOutput:
    if cfg.mode == "stpp":
        stats = run_stpp(roles, comm, cfg.n_stages, cfg.k_config)
    else:
        stats = run_pipedec(roles, comm, cfg.n_stages)
    seq = roles[0].seq
    # PipeDec verifies one root per emitted token (a hit is an accepted draft); STPP one tree per round
    seq.stats.accepted = stats.hits
    seq.stats.verifications = stats.tokens if cfg.mode != "stpp" else stats.rounds
    seq.stats.draft_depth = stats.tokens if cfg.mode != "stpp" else seq.stats.draft_depth
    seq.stats.target_forwards = stats.stage_forwards[-1]  # the last stage's: each covers one full target pass
    seq.stats.draft_forwards = stats.stage_forwards[0]
    return PipelineOutput(seq.result(), stats)


def _check(target_layers: int, cfg: PipelineConfig, has_draft: bool) -> None:
    split_layers(target_layers, cfg.n_stages)  # more stages than layers: a clear error before any process starts
    if cfg.mode != "pp" and not has_draft:
        raise ValueError(f"pipeline mode {cfg.mode!r} needs a draft model")


def simulate(target, draft, prompts: list[list[int]], params: SamplingParams, cfg: PipelineConfig, vocab_size: int,
             eos_ids=(), tokenizer=None) -> list[PipelineOutput]:
    """Every stage in this process, in lockstep: the reference the multi-process run must equal."""
    _check(target.config.num_hidden_layers, cfg, draft is not None)
    draft = ModelRuntime(draft) if draft is not None else None  # one for every prompt's draft role
    outputs = []
    for i, prompt in enumerate(prompts):
        roles = _roles(range(cfg.n_stages + 1), target, draft, prompt, params, cfg, vocab_size, eos_ids, tokenizer,
                       params.seed + i)
        outputs.append(_run(roles, LocalComm(), cfg))
    return outputs


def run_rank(rank: int, source: ModelSource, prompts, params, cfg: PipelineConfig, vocab_size, eos_ids,
             tokenizer) -> list[PipelineOutput]:
    """One rank's whole job inside an initialised process group (spawned, or joined via torchrun)."""
    world = dist.get_world_size()
    if world != cfg.n_stages + 1:
        raise ValueError(f"a {cfg.n_stages}-stage pipeline needs {cfg.n_stages + 1} processes, the group has {world}")
    target = draft = None
    for turn in range(world):  # load one rank at a time: peak memory is one model, not N + 1
        if turn == rank:
            if rank == 0:
                draft = ModelRuntime(source.load("draft")) if cfg.mode != "pp" else None
            else:
                target = source.load("target")
                keep_only_stage(target, split_layers(target.config.num_hidden_layers, cfg.n_stages)[rank - 1])
        dist.barrier()
    outputs = []
    for i, prompt in enumerate(prompts):
        roles = _roles([rank], target, draft, prompt, params, cfg, vocab_size, eos_ids, tokenizer, params.seed + i)
        comm = DistComm(cfg.n_stages, *(_activation_shape(roles[0])))
        outputs.append(_run(roles, comm, cfg))
    return outputs


def _activation_shape(role) -> tuple[int, torch.dtype]:
    if role.is_draft:
        return 0, torch.float32
    return role.stage.hidden_size, role.stage.dtype


def _worker(rank: int, port: int, timeout_s: float, results, *job) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    cfg = job[3]
    # the stages and the draft share this machine's cores evenly (cpu_threads.py), unless --threads pins them
    pinned = CpuThreads().pinned
    torch.set_num_threads(pinned or share(len(usable_cores()), cfg.n_stages + 1))
    dist.init_process_group("gloo", rank=rank, world_size=cfg.n_stages + 1, timeout=timedelta(seconds=timeout_s))
    try:
        outputs = run_rank(rank, *job)
        if rank == 0:
            results.put(outputs)
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_port(port: int) -> None:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            raise ValueError(f"port {port} on 127.0.0.1 is already in use: pick another --port "
                             f"(or leave it out for a free one)") from None


def launch(source: ModelSource, prompts: list[list[int]], params: SamplingParams, cfg: PipelineConfig, vocab_size: int,
           target_layers: int, eos_ids=(), tokenizer=None, port: int | None = None, timeout_s: float = 120.0,
           start_method: str | None = None) -> list[PipelineOutput]:
    """Spawn N + 1 local processes (rank 0 = draft, ranks 1..N = target stages) and run the pipeline."""
    _check(target_layers, cfg, source.draft is not None)
    if port is None:
        port = free_port()
    else:
        check_port(port)
    start_method = start_method or default_start_method()
    ctx = mp.get_context(start_method)
    results = ctx.SimpleQueue()
    job = (source, prompts, params, cfg, vocab_size, tuple(eos_ids), tokenizer)
    procs = mp.start_processes(_worker, args=(port, timeout_s, results, *job), nprocs=cfg.n_stages + 1, join=False,
                               start_method=start_method)
    deadline = time.monotonic() + timeout_s
    outputs = None
    try:
        while not procs.join(timeout=0.2):
            # read rank 0's outputs while it writes them: the queue is a pipe, and a put larger than the pipe's
            # buffer (64 KiB on Linux; many prompts or long outputs) blocks until it is read, so waiting for
            # every rank to exit first held rank 0 in its put until the timeout
            if outputs is None and not results.empty():
                outputs = results.get()
            if time.monotonic() > deadline:
                raise TimeoutError(f"the {cfg.n_stages}-stage pipeline did not finish within {timeout_s:.0f}s; "
                                   f"all its processes were stopped")
    except (mp.ProcessExitedException, mp.ProcessRaisedException) as err:
        _stop(procs)
        raise RuntimeError(_failure(err, procs, cfg)) from None
    finally:
        _stop(procs)
    return outputs if outputs is not None else results.get()


def _stop(procs) -> None:
    for proc in procs.processes:
        if proc.is_alive():
            proc.kill()
        proc.join()


def _failure(err, procs, cfg: PipelineConfig) -> str:
    """One line naming the rank that went first: a rank killed by a signal (not our own SIGTERM
    clean-up) explains the connection errors its neighbours raised after it."""
    for rank, proc in enumerate(procs.processes):
        code = proc.exitcode
        if code is not None and code < 0 and -code != signal.SIGTERM:
            return f"pipeline {_rank_name(rank, cfg)} died ({signal.Signals(-code).name}); the other ranks were stopped"
    if isinstance(err, mp.ProcessExitedException):
        return (f"pipeline {_rank_name(err.error_index, cfg)} died ({err.signal_name or f'exit code {err.exit_code}'}); "
                f"the other ranks were stopped")
    cause = str(err).strip().splitlines()[-1]
    return f"pipeline {_rank_name(err.error_index, cfg)} failed: {cause}; the other ranks were stopped"


def default_start_method() -> str:
    """fork where it is safe (Linux, no CUDA context yet: children start in a second instead of
    re-importing torch and transformers), else spawn."""
    if "fork" in mp.get_all_start_methods() and not torch.cuda.is_initialized():
        return "fork"
    return "spawn"


def _rank_name(rank: int, cfg: PipelineConfig) -> str:
    return "rank 0 (draft)" if rank == 0 else f"rank {rank} (target stage {rank} of {cfg.n_stages})"


def join_group(source: ModelSource, prompts, params, cfg: PipelineConfig, vocab_size, eos_ids=(), tokenizer=None,
               timeout_s: float = 600.0) -> list[PipelineOutput]:
    """Run as one rank of a group started by torchrun (RANK, WORLD_SIZE, MASTER_ADDR/PORT in the environment)."""
    missing = [v for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
    if missing:
        raise ValueError(f"joining a process group needs {', '.join(missing)} in the environment (start with torchrun)")
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
    try:
        return run_rank(dist.get_rank(), source, prompts, params, cfg, vocab_size, tuple(eos_ids), tokenizer)
    finally:
        dist.destroy_process_group()
