"""Linear layers on a CPU through oneDNN's inner product instead of the BLAS `F.linear` calls.

Why: a decode step's cost on a CPU is its linear layers, and what that costs for a few rows is up to
the kernel. The MKL build torch ships runs a few rows as one matrix-vector pass per row on some
CPUs (AMD's among them: MKL picks its generic paths off Intel), so a 2-token forward cost twice a
1-token one, which is exactly what speculation cannot afford: verification adds rows to a forward.
oneDNN (the same library torch's own CPU compiler, Inductor, emits for frozen linears) reads the
weights once for all rows there. docs/benchmarks.md has the figures.

How: `use_onednn_linears` swaps the class of every plain `nn.Linear` of a model for `OneDnnLinear`,
a subclass with the same parameters (shared, not copied: tied heads stay tied, the state dict is
unchanged) whose forward calls `torch.ops.mkldnn._linear_pointwise`. Nothing of the stock
transformers modeling code changes; the swap is what quantization integrations do to leaf layers.

Where it falls back to `F.linear`: off the CPU, any dtype but float32, a 1-D input, an empty one,
and whenever autograd records the call (the oneDNN op has no backward; training reuses these
models). The two kernels round differently (a different summation order), so the swap is made when
the engine loads a model, before any output is produced: every mode then runs the same target, and
greedy output equals that target's own `generate` as before.
"""
from __future__ import annotations

import logging
import os

import torch
from torch import nn
from torch.nn import functional as F

log = logging.getLogger(__name__)

ONEDNN = "onednn"
STOCK = "stock"
CPU_LINEARS = (ONEDNN, STOCK)  # Engine.from_pretrained(cpu_linear=...)
ENV = "SEED_TOT_CPU_LINEAR"  # the default where cpu_linear is not given


def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class OneDnnLinear(nn.Linear):
    """`nn.Linear` whose inference forward on a CPU runs oneDNN's inner product (module doc)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        # every linear of every forward passes here: attribute reads only (x.device builds an object)
        if (not x.is_cpu or x.dtype != torch.float32 or weight.dtype != torch.float32
                or x.dim() < 2 or x.numel() == 0
                or (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))):
            return F.linear(x, weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, weight, self.bias, "none", [], "")


def use_onednn_linears(*models: nn.Module | None) -> int:
    """Swap every plain `nn.Linear` of each model (in place) for `OneDnnLinear`; returns how many.
    Subclasses of nn.Linear are left alone: their forward is their own. Idempotent; None, a model not
    on a CPU, or any model where torch has no oneDNN, is left as it is."""
    swapped = 0
    for model in models:
        parameter = next(model.parameters(), None) if model is not None else None
        if parameter is None or parameter.device.type != "cpu" or not onednn_available():
            continue
        layers = [m for m in model.modules() if type(m) is nn.Linear]
        for module in layers:
            module.__class__ = OneDnnLinear
        if layers:
            log.info("%s: %d linear layers run through oneDNN on the CPU", type(model).__name__, len(layers))
        swapped += len(layers)
    return swapped


def linear_kernel(model: nn.Module) -> str:
    """Which kernel `model`'s linear layers run on a CPU: onednn once any was swapped, else stock."""
    return ONEDNN if any(isinstance(m, OneDnnLinear) for m in model.modules()) else STOCK


def resolve_cpu_linear(value: str | None) -> str:
    """The kernel asked for: `value`, else $SEED_TOT_CPU_LINEAR (so that every command and a Ray
    actor started from this shell can run either without a flag of its own), else oneDNN."""
    source = "cpu_linear"
    if value is None:
        value, source = os.environ.get(ENV, ONEDNN), f"${ENV}"
    if value not in CPU_LINEARS:
        raise ValueError(f"{source} must be one of {', '.join(CPU_LINEARS)}, not {value!r}")
    return value
