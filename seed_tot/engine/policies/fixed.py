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

    def step(self, logits: torch.Tensor, hidden: torch.Tensor | None,
             top: list[list[int]] | None = None) -> Feed | None:
        """top (greedy, from `step_rows`): each frontier node's top tokens, read already."""
        b, params = self.b, self.b.params
        frontier = self._frontier(logits)
        width = self.k_config[self.depth]
        level = []
        for j, (node, node_logits) in enumerate(frontier):
            if params.greedy:  # deterministic candidates: the draft's top-`width` tokens
                picks = (top[j][:width] if top is not None
                         else torch.topk(node_logits[: b.vocab_size].float(), width).indices.tolist())
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

    def _frontier(self, logits: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
        """(node, the logits after it) for every node whose children this step draws; -1: the root."""
        return [(-1, logits[-1])] if self.depth == 0 else list(zip(self.level, logits))

    @classmethod
    def step_rows(cls, rounds: list["FixedRound"], logits: list[torch.Tensor],
                  hidden: list[torch.Tensor | None]) -> list[Feed | None]:
        """Every greedy row's frontier in one top-k and one transfer (sampled rows draw alone, each
        from its own generator): a row's picks are still its own logits' top tokens, whatever shares the batch."""
        greedy = [i for i, r in enumerate(rounds) if r.b.params.greedy]
        tops: dict[int, list[list[int]]] = {}
        if len(greedy) > 1:
            vocab = rounds[greedy[0]].b.vocab_size  # one engine's rows: one vocabulary
            frontiers = [[node_logits[:vocab] for _, node_logits in rounds[i]._frontier(logits[i])] for i in greedy]
            width = max(rounds[i].k_config[rounds[i].depth] for i in greedy)
            picked = torch.topk(torch.stack([x for f in frontiers for x in f]).float(), width).indices.tolist()
            at = 0
            for i, f in zip(greedy, frontiers):
                tops[i], at = picked[at: at + len(f)], at + len(f)
        return [r.step(row_logits, None, tops.get(i)) for i, (r, row_logits) in enumerate(zip(rounds, logits))]

    def finish(self):
        return self.b.tree()
