"""The draft tree: the one structure every draft policy hands to the verifier.

A chain (SD, SEED with k_config (1,1,1)) is a tree with one child per node; MCSD's k_config
products, OPT-Tree's adaptive trees or SpecDec++'s variable-length chains are other shapes of it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class DraftTree:
    """Nodes in topological order (a parent comes before its children, siblings in draw order).

    parents[i]     index of node i's parent, -1 for a child of the root (the sequence's last token)
    tokens[i]      the drafted token
    draft_probs[i] the processed draft distribution q that token i was drawn from, float32 [V]
    without_replacement: siblings were drawn one after another from the same q with earlier
        siblings removed (MCSD, Yang et al. 2024); False means each sibling was an independent draw
        from its own draft_probs row (SpecInfer-style multi-draft).
    """

    parents: list[int]
    tokens: list[int]
    draft_probs: torch.Tensor
    without_replacement: bool = True

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if len(self.parents) != n or (n and self.draft_probs.shape[0] != n):
            raise ValueError(f"draft tree has {n} tokens, {len(self.parents)} parents, "
                             f"{self.draft_probs.shape[0] if n else 0} draft distributions")
        for i, p in enumerate(self.parents):
            if not -1 <= p < i:
                raise ValueError(f"draft tree node {i} has parent {p}; parents must precede children")

    @classmethod
    def empty(cls, vocab_size: int) -> "DraftTree":
        return cls([], [], torch.empty(0, vocab_size))

    def __len__(self) -> int:
        return len(self.tokens)

    def children(self, node: int) -> list[int]:
        return [i for i, p in enumerate(self.parents) if p == node]

    def depth(self) -> int:
        depths: list[int] = []
        for p in self.parents:
            depths.append(1 + (depths[p] if p >= 0 else 0))
        return max(depths, default=0)
