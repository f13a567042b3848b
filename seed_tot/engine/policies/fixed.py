"""`fixed`: today's k_config shapes, k_config[d] children per node at depth d+1.

Sampled decoding draws each sibling group without replacement from q; greedy decoding takes the
draft's top-`width` tokens, which are deterministic candidates (no q row is kept for them).
Greedy picks and a sampled chain's draws stay on the device until the verification reads them with
its one transfer (a read per draft step would make every draft step wait for the device); a sampled
sibling group draws on the host, since how many distinct tokens q can give is known only there.
"""
from __future__ import annotations

import torch

from ..params import SamplingParams, check_k_config
from ..sampling import inverse_cdf, multinomial, process_logits, processing_key
from ..token_rows import to_device
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
        self.draws_on_device = not builder.params.greedy and all(k == 1 for k in self.k_config)

    def first_feed(self) -> Feed:
        return self.b.pending_feed()

    def step(self, logits: torch.Tensor, hidden: torch.Tensor | None, top: torch.Tensor | None = None,
             drawn: tuple[torch.Tensor, torch.Tensor] | None = None) -> Feed | None:
        """From `step_rows`: top (greedy) [frontier nodes, >= width] their top tokens; drawn (a sampled
        chain) the node's token and the q it was drawn from; both on the device."""
        b, params = self.b, self.b.params
        if self.draws_on_device and drawn is None:  # alone: the same draw step_rows makes for it
            return type(self).step_rows([self], [logits], [hidden])[0]
        frontier = self._frontier(logits)
        width = self.k_config[self.depth]
        if drawn is not None:
            token, q = drawn
            return self._next(b.add_picked([frontier[0][0]], token, q), token)
        if top is not None:  # picked on the device and left there: the next draft forward reads them
            picks = top[:, :width].reshape(-1)
            level = b.add_picked([node for node, _ in frontier for _ in range(width)], picks)
            return self._next(level, picks)
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
        return self._next(level)

    def _next(self, level: list[int], tokens: torch.Tensor | None = None) -> Feed | None:
        self.depth += 1
        if self.depth == len(self.k_config):
            return None
        self.level = level
        return self.b.feed_nodes(level, tokens)

    def _frontier(self, logits: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
        """(node, the logits after it) for every node whose children this step draws; -1: the root."""
        return [(-1, logits[-1])] if self.depth == 0 else list(zip(self.level, logits))

    @classmethod
    def step_rows(cls, rounds: list["FixedRound"], logits: list[torch.Tensor],
                  hidden: list[torch.Tensor | None]) -> list[Feed | None]:
        """Every greedy row's frontier in one top-k, whose picks stay on the device (the next draft
        forward takes them as they are; the verification reads them with its one transfer). A row's
        picks are its own logits' top tokens, whatever shares the batch. Sampled chains draw on the
        device together (`_draw_chains`); sampled sibling groups draw alone, on the host. Every sampled
        row draws from its own generator."""
        greedy = [i for i, r in enumerate(rounds) if r.b.params.greedy]
        tops: dict[int, torch.Tensor] = {}
        if greedy:
            vocab = rounds[greedy[0]].b.vocab_size  # one engine's rows: one vocabulary
            frontiers = [[node_logits[:vocab] for _, node_logits in rounds[i]._frontier(logits[i])] for i in greedy]
            width = max(rounds[i].k_config[rounds[i].depth] for i in greedy)
            picked = torch.topk(torch.stack([x for f in frontiers for x in f]).float(), width).indices
            at = 0
            for i, f in zip(greedy, frontiers):
                tops[i], at = picked[at: at + len(f)], at + len(f)
        chains = [i for i, r in enumerate(rounds) if r.draws_on_device]
        drawn = dict(zip(chains, cls._draw_chains([rounds[i] for i in chains], [logits[i] for i in chains])))
        return [r.step(row_logits, None, tops.get(i), drawn.get(i)) for i, (r, row_logits) in enumerate(zip(rounds, logits))]

    @staticmethod
    def _draw_chains(rounds: list["FixedRound"], logits: list[torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per sampled chain: its next node's token (a 1-element device tensor) and the q it was drawn
        from. q is the row's processed distribution (rows of equal params processed together); the
        token is q's inverse CDF at a float64 uniform the row draws from its own generator on the host,
        so the draw reads nothing back and depends on nothing but the row. Every row's uniform reaches
        the device in one copy."""
        if not rounds:
            return []
        vocab = rounds[0].b.vocab_size  # one engine's rows: one vocabulary
        groups: dict[tuple, list[int]] = {}
        for j, r in enumerate(rounds):
            groups.setdefault(processing_key(r.b.params), []).append(j)
        order = [j for members in groups.values() for j in members]
        q = torch.cat([process_logits(torch.stack([rounds[j]._frontier(logits[j])[0][1] for j in members]),
                                      rounds[members[0]].b.params, vocab) for members in groups.values()])
        u = torch.cat([torch.rand(1, dtype=torch.float64, generator=rounds[j].b.seq.generator) for j in order])
        tokens = inverse_cdf(q, to_device(u, q.device))
        out: list = [None] * len(rounds)
        for at, j in enumerate(order):
            out[j] = (tokens[at: at + 1], q[at])
        return out

    def finish(self):
        return self.b.tree()
