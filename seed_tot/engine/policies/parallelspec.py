"""`parallelspec`: a whole draft in ONE forward of a ParallelSpec drafter (engine/drafters/).

The round feeds the tokens the drafter's cache has not seen followed by MASK_1..MASK_m (a chain,
m = depth - 1). The output at the last real token is q_1 and the output at MASK_j is q_{j+1};
depth-t nodes of the tree are drawn from q_t (sampled: each sibling group draws `width` tokens
without replacement from q_t, the verifier gets that q_t; greedy: the top-`width` tokens of q_t,
deterministic candidates). q_t does not depend on which depth-(t-1) token was drafted, which is
what makes one forward enough; the verifier needs only that each candidate was drawn from the q it
is given, so the round is lossless.

No tree node is fed to the drafter, so `finish` reports no node entries and the verifier's commit
keeps just the pending real tokens: the mask entries never stay in the drafter's cache (accepted
tokens are fed as real tokens at the start of the next round).

Shape: `depth` levels (at most k+1, the drafter's reach; default: the "depth" its drafter.json
names, else k+1), width k_config[d] at depth
d+1 and 1 past the end of k_config, so sd (all ones) and the default seed k_config draft a chain of
k+1; `--k-config 2,2` gives a tree whose first two levels branch.
"""
from __future__ import annotations

import torch

from ..params import SamplingParams
from .base import DraftPolicy, DraftRound, Feed, TreeBuilder, option


class ParallelSpecPolicy(DraftPolicy):
    name = "parallelspec"

    def __init__(self, drafter, k_config=(1,), depth: int | None = None):
        n_masks = getattr(drafter, "n_masks", 0)
        if not n_masks:
            raise ValueError("draft policy 'parallelspec' needs a ParallelSpec drafter with [MASK] tokens as the draft "
                             "model: pass --draft DIR (Engine.from_pretrained(draft=DIR)) with a directory from "
                             "`seed-tot train-drafter --method parallelspec`")
        self.mask_ids = [drafter.mask_id(j) for j in range(1, n_masks + 1)]
        if depth is None:  # a drafter directory may name the depth it drafts best at ("depth" in drafter.json)
            depth = getattr(drafter, "default_depth", None) or n_masks + 1
        self.depth = depth
        if not 1 <= self.depth <= n_masks + 1:
            raise ValueError(f"draft policy 'parallelspec': depth={depth} must be in 1..{n_masks + 1} "
                             f"(this drafter has k={n_masks} masks)")
        self.widths = tuple(k_config[d] if d < len(k_config) else 1 for d in range(self.depth))

    @classmethod
    def from_options(cls, engine, k_config, params, depth=None) -> "ParallelSpecPolicy":
        return cls(engine.draft, k_config, None if depth is None else option(cls.name, "depth", depth, int, 1))

    def begin(self, seq, params: SamplingParams, vocab_size: int) -> DraftRound:
        return ParallelSpecRound(TreeBuilder(seq, params, vocab_size), self.widths, self.mask_ids)


class ParallelSpecRound(DraftRound):
    def __init__(self, builder: TreeBuilder, widths: tuple[int, ...], mask_ids: list[int]):
        self.b = builder
        self.widths = widths[: max(1, builder.remaining)]  # no point drafting past the budget
        self.mask_ids = mask_ids[: len(self.widths) - 1]

    def first_feed(self) -> Feed:
        feed = self.b.pending_feed()
        # the masks continue the chain after the last pending token, at the positions of the tokens they predict
        first = self.b.next_entry
        parents = ([self.b.root_entry] + [first + j for j in range(len(self.mask_ids) - 1)]) if self.mask_ids else []
        self.b.next_entry += len(self.mask_ids)
        # only q_1.. are read: the LM head (most of a small drafter's forward) skips the earlier pending tokens
        features = feed.features
        if features is not None and self.mask_ids:  # each mask reads its anchor's f, as in training
            features = torch.cat([features, features[-1:].expand(len(self.mask_ids), -1)])
        return Feed(feed.tokens + self.mask_ids, feed.parents + parents, keep=len(self.widths), features=features)

    def step(self, logits: torch.Tensor, hidden: torch.Tensor | None) -> None:
        b, params = self.b, self.b.params
        rows = logits[-len(self.widths):]  # q_1 (after the last real token), then q_2.. (after each mask)
        level = [-1]
        for depth, width in enumerate(self.widths):
            if params.greedy:  # deterministic candidates: q_t's top tokens
                picks = torch.topk(rows[depth][: b.vocab_size].float(), width).indices.tolist()
                level = [b.add(node, tok, None) for node in level for tok in picks]
                continue
            q = b.q(rows[depth])
            n = min(width, int((q > 0).sum()))
            nxt = []
            for node in level:  # each sibling group is its own draw from q_t (what the verifier assumes)
                picks = torch.multinomial(q, n, replacement=False, generator=b.seq.generator).tolist()
                nxt += [b.add(node, tok, q) for tok in picks]
            level = nxt
        return None

    def finish(self):
        tree, _ = self.b.tree()
        return tree, {}  # no node was fed: the drafter's cache keeps only real tokens
