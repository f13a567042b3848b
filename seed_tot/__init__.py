"""seed-tot: tree-of-thoughts reasoning on a scheduled speculative decoding (SEED) engine."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["DecodeSpec", "Engine", "GenerationResult", "GenerationStats", "SamplingParams"]

if TYPE_CHECKING:
    from .engine import DecodeSpec, Engine, GenerationResult, GenerationStats, SamplingParams


def __getattr__(name: str) -> Any:
    # imported on first use, so that `seed-tot --help` (which imports this package) loads no torch
    if name in __all__:
        from . import engine
        return getattr(engine, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
