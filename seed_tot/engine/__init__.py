"""The SEED engine: AR, Parallel, SD, MCSD and SEED over one lossless tree verifier."""
from .draft_tree import DraftTree
from .engine import Engine, summarize
from .params import GenerationResult, GenerationStats, SamplingParams
from .verify import accept_tokens

__all__ = ["DraftTree", "Engine", "GenerationResult", "GenerationStats", "SamplingParams", "accept_tokens", "summarize"]
