"""Fixed-shape forwards compiled with torch.compile (inductor), one specialization per bucket.

A graphed forward (graphed_forward.py) replays the kernels of the stock transformers forward: every
RMSNorm, rotary embedding and elementwise chain is its own handful of kernels, each reading and
writing the activations again. Compiled by inductor, those chains fuse into a few kernels, and the CUDA
graph that graphed_forward.py captures records the compiled kernels instead, so a replay reads the
activations fewer times (gpt-fast's recipe: torch.compile over a static cache).

The compile is the stock model's forward, with the row-attention batch (row_attention.py) as its
`past_key_values`, at the bucket's fixed shapes (`dynamic=False`): each bucket is compiled once, on
its first forward (on CUDA that is the first warm-up run before the capture), and inductor's own
caches (its FX graph and autotuning caches, on by default) make a later process's compile of the same
bucket cheaper. The mode never asks inductor for CUDA graphs of its own ("default", or
"max-autotune-no-cudagraphs"): graphed_forward.py captures the graph itself, around its static buffers.

A model or bucket that cannot compile (dynamo or inductor raise on its run) runs the stock forward
instead, as before: logged once per model, the bucket remembered. A graph break is no failure: the
pieces are compiled and the forward stays exact.
Every bucket's first-run time (the compile, mostly) is kept in `compile_seconds` for the benchmarks.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)

MODES = ("default", "max-autotune-no-cudagraphs")  # inductor modes that leave CUDA graphs to graphed_forward.py
# Every model and bucket compiles the same code (`_call`): torch keeps one specialization per bucket,
# model and KV pool size on it (a grown pool is a new input shape), so its default limit (8) would stop
# compiling after a few buckets. Raised process-wide, once, never lowered: raising it only lets more
# compiles happen. (A per-call config.patch would race between SEED's draft and target threads.)
RECOMPILE_LIMIT = 1024


@dataclass(frozen=True)
class CompileSettings:
    """Whether a model's fixed-shape forwards are compiled. enabled None: on CUDA only (on the CPU the
    fixed shapes are not run by default: graphed_forward.bucket); True: everywhere (the CPU tests)."""

    enabled: bool | None = None
    mode: str = "default"
    # Compile time is bounded by the buckets compiled: buckets wider than `max_width` query entries per
    # row (prefill chunks, whose matrix products dwarf what fusion saves) and buckets past the first
    # `max_buckets` of a model run the stock forward (still graphed on CUDA).
    max_width: int = 8
    max_buckets: int = 16

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"compile mode {self.mode!r}: expected one of {', '.join(MODES)} "
                             "(graphed_forward.py captures the CUDA graph itself)")
        for name in ("max_width", "max_buckets"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"compile {name} must be a non-negative integer, got {value!r}")

    @classmethod
    def of(cls, value: "CompileSettings | bool | None") -> "CompileSettings":
        """Settings from what a caller passes: settings, or True / False / None for `enabled` alone."""
        if isinstance(value, cls):
            return value
        if value is None or isinstance(value, bool):
            return cls(enabled=value)
        raise TypeError(f"compile must be a CompileSettings, True, False or None (on CUDA only), got {value!r}")

    def on(self, device: torch.device) -> bool:
        return self.enabled if self.enabled is not None else device.type == "cuda"


def _call(model, inputs: dict):
    """The forward torch.compile traces: the stock model's, unchanged."""
    return model(**inputs)


class CompiledForward:
    """The compiled fixed-shape forwards of one model (owned by its GraphedForward)."""

    def __init__(self, name: str, settings: CompileSettings):
        self.name, self.settings = name, settings  # name: the model's class, for the log
        config = torch._dynamo.config
        config.recompile_limit = max(config.recompile_limit, RECOMPILE_LIMIT)
        config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, RECOMPILE_LIMIT)
        self.function = torch.compile(_call, backend="inductor", mode=settings.mode, dynamic=False)
        self.compile_seconds: dict = {}  # bucket -> seconds of its first compiled run (compile + one run)
        self.refused: dict = {}  # bucket -> why it runs the stock forward
        self.failures = 0  # buckets that fell back (the log says only the first)

    def __call__(self, model, shape, inputs: dict):
        """The model's forward of one bucket: compiled, or the stock forward where compiling failed."""
        first = shape not in self.compile_seconds
        if shape in self.refused or (first and not self._admit(shape)):
            return model(**inputs)
        start = time.perf_counter()
        try:
            out = self.function(model, inputs)
        except Exception as exc:  # noqa: BLE001 - any compile failure: the stock forward is exact
            self._refuse(shape, exc)
            return model(**inputs)
        if first:  # host time: the compile is seconds, the run's queued kernels milliseconds (no sync:
            # a step synchronises once, in its verification)
            self.compile_seconds[shape] = seconds = time.perf_counter() - start
            log.info("compiled %s's forward at %s in %.1f s", self.name, shape, seconds)
        return out

    def _admit(self, shape) -> bool:
        """Whether a bucket seen for the first time is compiled (the settings' bounds)."""
        settings = self.settings
        if shape.width > settings.max_width:
            why = f"wider than {settings.max_width} entries per row"
        elif len(self.compile_seconds) >= settings.max_buckets:
            why = f"past the first {settings.max_buckets} compiled buckets"
        else:
            return True
        self.refused[shape] = why
        log.info("%s's forward at %s runs uncompiled: %s", self.name, shape, why)
        return False

    def _refuse(self, shape, exc: Exception) -> None:
        self.refused[shape] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        self.failures += 1
        if self.failures == 1:
            log.warning("%s's fixed-shape forwards run uncompiled where torch.compile fails (first: %s, %s)",
                        self.name, shape, self.refused[shape])
        else:
            log.debug("%s's forward at %s runs uncompiled: %s", self.name, shape, self.refused[shape])


def compile_report(runtime) -> dict:
    """What a model runtime (model_runtime.py) compiled so far: buckets compiled, their first-run seconds in
    all, and buckets that run uncompiled (the bench's JSON and its closing line)."""
    graphed = runtime.graphed
    compiled = graphed.compiled if graphed is not None else None
    if compiled is None:
        return dict(buckets=0, seconds=0.0, uncompiled=0, failures=0)
    return dict(buckets=len(compiled.compile_seconds), seconds=round(sum(compiled.compile_seconds.values()), 2),
                uncompiled=len(compiled.refused), failures=compiled.failures)
