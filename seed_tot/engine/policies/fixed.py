"""`fixed`: today's k_config shapes, k_config[d] children per node at depth d+1.

Sampled decoding draws each sibling group without replacement from q (at most top_k wide when the
params set one); greedy decoding takes the draft's top-`width` tokens, which are deterministic
candidates (no q row is kept for them).
Greedy picks and sampled draws stay on the device until the verification reads them with its one
transfer (a read per draft step would make every draft step wait for the device).
"""
from __future__ import annotations

import torch

from ..params import SamplingParams, check_k_config
from ..sampling import draw_without_replacement, process_by_params
from ..host_to_device import to_device
from ..keyed_draws import level_uniform
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
    def from_options(cls, engine, k_config, params, **options) -> "FixedPolicy":
        cls.parse_options(**options)  # fixed takes none: its shape is k_config
        return cls(k_config)

    def begin(self, seq, params: SamplingParams, vocab_size: int) -> DraftRound:
        return FixedRound(TreeBuilder(seq, params, vocab_size), self.k_config)


class FixedRound(DraftRound):
    """One draft forward per tree level but the last (the first forward feeds the pending tokens)."""

    def __init__(self, builder: TreeBuilder, k_config: tuple[int, ...]):
        self.b = builder
        k_config = k_config[: max(1, builder.remaining)]  # no point drafting past the budget
        if not builder.params.greedy and builder.params.top_k > 0:
            # q holds top_k tokens (more only where logits tie): a wider group's further draws would
            # mostly be tokens of no mass, which the verifier always rejects, drafted and scored for
            # nothing; a width that depends on the params alone is still exact, and the tree's shape
            # is known without reading q
            k_config = tuple(min(k, builder.params.top_k) for k in k_config)
        self.k_config = k_config
        self.depth = 0
        self.level: list[int] = []

    def first_feed(self) -> Feed:
        return self.b.pending_feed()

    def step(self, logits: torch.Tensor, hidden: torch.Tensor | None,
             drawn: "tuple[torch.Tensor, list[torch.Tensor] | None] | None" = None) -> Feed | None:
        """drawn (from `step_rows`): the frontier's children's tokens, `width` per frontier node, on the
        device, and per child the q it was drawn from (None: greedy picks)."""
        if drawn is None:  # alone: the same draw step_rows makes for it among other rows
            return type(self).step_rows([self], [logits], [hidden])[0]
        picks, qs = drawn
        width = self.k_config[self.depth]
        parents = [node for node, _ in self._frontier(logits) for _ in range(width)]
        return self._next(self.b.add_picked(parents, picks, qs), picks)

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
        """Every row's next level, chosen on the device and left there (the next draft forward takes the
        tokens as they are; the verification reads them with its one transfer): greedy rows' picks in
        one top-k per width, sampled rows' draws together (`_draw`). A row's tokens are its own
        logits' (and its own generator's), whatever shares the batch."""
        greedy = [i for i, r in enumerate(rounds) if r.b.params.greedy]
        sampled = [i for i, r in enumerate(rounds) if not r.b.params.greedy]
        drawn: dict[int, tuple] = {}
        by_width: dict[int, list[int]] = {}
        for i in greedy:
            by_width.setdefault(rounds[i].k_config[rounds[i].depth], []).append(i)
        for width, members in by_width.items():
            # one top-k per width: torch.topk orders tied logits differently for different k, so a row
            # picks what it picks alone only under its own k
            vocab = rounds[members[0]].b.vocab_size  # one engine's rows: one vocabulary
            frontiers = [[node_logits[:vocab] for _, node_logits in rounds[i]._frontier(logits[i])] for i in members]
            picked = torch.topk(torch.stack([x for f in frontiers for x in f]).float(), width).indices
            at = 0
            for i, f in zip(members, frontiers):
                drawn[i] = (picked[at: at + len(f)].reshape(-1), None)
                at += len(f)
        if sampled:
            drawn.update(zip(sampled, cls._draw([rounds[i] for i in sampled], [logits[i] for i in sampled])))
        return [r.step(row_logits, None, drawn[i]) for i, (r, row_logits) in enumerate(zip(rounds, logits))]

    @staticmethod
    def _draw(rounds: list["FixedRound"], logits: list[torch.Tensor]) -> list[tuple[torch.Tensor, list[torch.Tensor]]]:
        """Per sampled row: its frontier nodes' children, `width` per node drawn without replacement from
        the node's q, on the device, and per child that q. q is the row's processed distribution (rows
        of equal params processed together); the draws (sampling.draw_without_replacement) read float64
        uniforms the row draws from its own generator on the host. So nothing is read back, a row's
        draws depend on nothing but the row, and a tree keeps its k_config's shape whatever q is."""
        vocab = rounds[0].b.vocab_size  # one engine's rows: one vocabulary
        frontiers = [[node_logits for _, node_logits in r._frontier(x)] for r, x in zip(rounds, logits)]
        widths = [r.k_config[r.depth] for r in rounds]
        q, order = process_by_params([torch.stack(f) for f in frontiers], [r.b.params for r in rounds], vocab)
        width = max(widths)
        u = torch.zeros(q.shape[0], width, dtype=torch.float64)
        at = 0
        for j in order:
            n = len(frontiers[j])
            u[at: at + n, : widths[j]] = torch.rand(n, widths[j], dtype=torch.float64, generator=rounds[j].b.seq.generator)
            if rounds[j].b.params.draft_invariant:  # the first child at the target's own keyed uniform (keyed_draws.py)
                u[at: at + n, 0] = level_uniform(rounds[j].b.seq, rounds[j].depth)
            at += n
        u = to_device(u, q.device)  # every row's uniforms in one copy
        tokens = draw_without_replacement(q, u)
        out: list = [None] * len(rounds)
        at = 0
        for j in order:
            n, w = len(frontiers[j]), widths[j]
            node_q = [q[at + f] for f in range(n)]  # one object per node: its children share one q row
            out[j] = (tokens[at: at + n, :w].reshape(-1), [x for x in node_q for _ in range(w)])
            at += n
        return out

    def finish(self):
        return self.b.tree()
