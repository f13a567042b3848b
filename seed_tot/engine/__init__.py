"""The SEED engine: AR, Parallel, SD, MCSD and SEED over one lossless tree verifier."""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .decode_spec import DecodeSpec
from .params import GenerationResult, GenerationStats, SamplingParams, summarize

__all__ = ["DecodeSpec", "DraftTree", "Engine", "GenerationResult", "GenerationStats", "SamplingParams", "accept_tokens", "summarize"]

if TYPE_CHECKING:
    from .draft_tree import DraftTree
    from .engine import Engine
    from .verify import accept_tokens

# the names whose modules import torch: loaded on first use, so that the command line's parsing
# and --help (which import this package for its plain types) stay fast
_LAZY = {"DraftTree": ".draft_tree", "Engine": ".engine", "accept_tokens": ".verify"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
