"""`fixed`: today's k_config shapes, k_config[d] children per node at depth d+1.

Sampled decoding draws each sibling group without replacement from q; greedy decoding takes the
draft's top-`width` tokens, which are deterministic candidates (no q row is kept for them).
"""
from __future__ import annotations

import torch

from ..params import SamplingParams, check_k_config
from ..sampling import multinomial
from .base import DraftPolicy, DraftRound, Feed, TreeBuilder


class FixedPolicy(DraftPolicy):
    name = "fixed"

    def __init__(self, k_config=(1, 1, 1)):
        self.k_config = check_k_config(k_config)
        self.drafts_trees = self.may_draft_trees(None, self.k_config, {})

    @classmethod
    def may_draft_trees(cls, engine, k_config, options) -> bool:
        return any(k > 1 for k in check_k_config(k_config))

    @classmethod
    def from_options(cls, engine, k_config, params) -> "FixedPolicy":
        return cls(k_config)

    def begin(self, seq, params: SamplingParams, vocab_size: int) -> DraftRound:
        return FixedRound(TreeBuilder(seq, params, vocab_size), self.k_config)


class FixedRound(DraftRound):
    """One draft forward per tree level but the last (the first forward feeds the pending tokens)."""

    def __init__(self, builder: TreeBuilder, k_config: tuple[int, ...]):
        self.b = builder
        self.k_config = k_config[: max(1, builder.remaining)]  # no point drafting past the budget
        self.depth = 0
        self.level: list[int] = []

    def first_feed(self) -> Feed:
        return self.b.pending_feed()

    def step(self, logits: torch.Tensor, hidden: torch.Tensor | None) -> Feed | None:
        b, params = self.b, self.b.params
        frontier = [(-1, logits[-1])] if self.depth == 0 else list(zip(self.level, logits))
        width = self.k_config[self.depth]
        level = []
        for node, node_logits in frontier:
            if params.greedy:  # deterministic candidates: the draft's top-`width` tokens
                picks = torch.topk(node_logits[: b.vocab_size].float(), width).indices.tolist()
                level += [b.add(node, tok, None) for tok in picks]
                continue
            q = b.q(node_logits)  # `width` draws without replacement from q (what the verifier assumes)
            n = min(width, int((q > 0).sum()))
            picks = multinomial(q, n, b.seq.generator).tolist()
            level += [b.add(node, tok, q) for tok in picks]
        self.depth += 1
        if self.depth == len(self.k_config):
            return None
        self.level = level
        return b.feed_nodes(level)

    def finish(self):
        return self.b.tree()
