"""seed-tot: tree-of-thoughts reasoning on a scheduled speculative decoding (SEED) engine."""
from .engine import Engine, GenerationResult, GenerationStats, SamplingParams

__all__ = ["Engine", "GenerationResult", "GenerationStats", "SamplingParams"]
