"""`suffix`: draft from the text the run already holds, with no model at all (engine/suffix_index.py:
the row's prompt and output, its search's other rows and earlier calls, earlier problems' outputs).

Each round drafts the continuation the longest match's occurrences agree on, scored by branch counts,
no longer than the match (SuffixDecoding): a chain by default, a small tree with width > 1. Its
tokens are picked, not drawn, so the verifier takes each as a one-hot proposal (verify.py): exact for
greedy and sampled rows alike. Rows need no draft cache and no draft prefill (`uses_draft_model`).

How it differs from `lookup`: lookup copies what followed the most recent match in the row's own
context; suffix reads every occurrence it finds in three scopes, so siblings of one ToT prompt draft
from each other and a value call's reply from the replies before it, and the count of each branch
picks the continuation most occurrences agree on, with a draft as long as the match is.

Options: depth (most tokens a round drafts; default 8), width (children a node may have; 1, the
default, drafts a chain), min_prob (a node's least share of the occurrences; default 0.1), factor
(draft length per matched token; default 1.0), candidates (occurrences read per scope; default 32),
run_tokens (the run scope's bound; default 65536, 0: no run scope), share (greedy, the default: which
rows read other rows' text, suffix_index.py; all; off: each row its own text only), unigram (tokens
drafted from a one-token match in the row's own text where no scope matches two; default 3, 0: none),
unigram_rows (which rows may: greedy, the default, or all).
"""
from __future__ import annotations

import torch

from ..host_to_device import to_device
from ..params import SamplingParams
from ..suffix_index import SHARES, UNIGRAM_ROWS, DraftNode, SuffixScopes
from .base import DraftPolicy, DraftRound, TreeBuilder, choice_option, option
from .fixed import FixedRound


class SuffixSource:
    """The scopes and the draft settings, shared by `suffix` and by the policies that graft its drafts."""

    OPTIONS = ("depth", "width", "min_prob", "factor", "candidates", "run_tokens", "share", "unigram", "unigram_rows")

    def __init__(self, depth: int = 8, width: int = 1, min_prob: float = 0.1, factor: float = 1.0,
                 candidates: int = 32, run_tokens: int = 1 << 16, share: str = "greedy", unigram: int = 3,
                 unigram_rows: str = "greedy"):
        if depth < 1 or width < 1 or candidates < 1 or run_tokens < 0 or unigram < 0 or factor <= 0 \
                or not 0 <= min_prob <= 1:
            raise ValueError("a suffix source needs depth, width, candidates >= 1, run_tokens, unigram >= 0, "
                             "factor > 0 and 0 <= min_prob <= 1")
        self.depth, self.width, self.min_prob, self.factor = depth, width, min_prob, factor
        self.scopes = SuffixScopes(run_tokens, share=share, candidates=candidates, unigram=unigram,
                                   unigram_rows=unigram_rows)

    @classmethod
    def parse(cls, policy: str, depth=None, width=1, min_prob=0.1, factor=1.0, candidates=32, run_tokens=1 << 16,
              share="greedy", unigram=3, unigram_rows="greedy") -> dict:
        return {"depth": None if depth is None else option(policy, "depth", depth, int, 1),
                "width": option(policy, "width", width, int, 1),
                "min_prob": option(policy, "min_prob", min_prob, float, 0, high=1),
                "factor": option(policy, "factor", factor, float, 1e-9),
                "candidates": option(policy, "candidates", candidates, int, 1),
                "run_tokens": option(policy, "run_tokens", run_tokens, int, 0),
                "share": choice_option(policy, "share", str(share).lower(), SHARES),
                "unigram": option(policy, "unigram", unigram, int, 0),
                "unigram_rows": choice_option(policy, "unigram_rows", str(unigram_rows).lower(), UNIGRAM_ROWS)}

    def clear(self) -> None:
        scopes = self.scopes
        self.scopes = SuffixScopes(scopes.run.max_tokens if scopes.run is not None else 0, scopes.max_searches,
                                   scopes.share, scopes.candidates, scopes.max_match, scopes.unigram,
                                   scopes.unigram_rows)

    def draft(self, seq, limit: int) -> list[DraftNode]:
        return self.scopes.draft(seq, min(self.depth, limit), self.width, self.min_prob, self.factor)

    def observe(self, seq) -> None:
        if seq.done:
            self.scopes.finish(seq)
        else:
            self.scopes.sync(seq)


def add_host_nodes(b: TreeBuilder, nodes: list[DraftNode]) -> list[int]:
    """`nodes` (parents first) as picked host nodes below the root; the builder's ids."""
    ids: list[int] = []
    for n in nodes:
        ids.append(b.add(-1 if n.parent < 0 else ids[n.parent], n.token, None, n.prob))
    return ids


def add_device_nodes(b: TreeBuilder, nodes: list[DraftNode], device: torch.device) -> list[int]:
    """`nodes` as picked nodes whose tokens go to the device with the rest of a tree whose tokens are
    there (a draft model's picks, `TreeBuilder.add_picked`): one small host-to-device copy, no read."""
    if not nodes:
        return []
    first = len(b.tokens)
    parents = [-1 if n.parent < 0 else first + n.parent for n in nodes]
    return b.add_picked(parents, to_device(torch.tensor([n.token for n in nodes]), device))


class SuffixPolicy(DraftPolicy):
    name = "suffix"
    uses_draft_model = False

    def __init__(self, source: SuffixSource | None = None):
        self.source = source or SuffixSource()
        self.drafts_trees = self.source.width > 1

    @classmethod
    def parse_options(cls, depth=None, width=1, min_prob=0.1, factor=1.0, candidates=32, run_tokens=1 << 16,
                      share="greedy", unigram=3, unigram_rows="greedy") -> dict:
        return SuffixSource.parse(cls.name, depth, width, min_prob, factor, candidates, run_tokens, share, unigram,
                                  unigram_rows)

    @classmethod
    def may_draft_trees(cls, engine, k_config, options) -> bool:
        return options["width"] > 1

    @classmethod
    def from_options(cls, engine, k_config, params, **options) -> "SuffixPolicy":
        o = cls.parse_options(**options)
        o["depth"] = o["depth"] or 8
        return cls(SuffixSource(**o))

    def clear_text(self) -> None:
        self.source.clear()

    def begin(self, seq, params: SamplingParams, vocab_size: int) -> DraftRound:
        b = TreeBuilder(seq, params, vocab_size)
        return SuffixRound(b, self.source.draft(seq, b.remaining))

    def observe(self, seq, tree, acceptance) -> None:
        super().observe(seq, tree, acceptance)
        self.source.observe(seq)


class SuffixRound(DraftRound):
    """A round with no model forward: the draft is known when it begins."""

    def __init__(self, builder: TreeBuilder, nodes: list[DraftNode]):
        self.b, self.nodes = builder, nodes

    def first_feed(self) -> None:
        return None

    def finish(self):
        add_host_nodes(self.b, self.nodes)
        return self.b.tree()


class GraftRound(FixedRound):
    """`choose`'s round of the draft model's chain with the suffix chain grafted beside it off the
    root. The suffix nodes are added first (picked nodes before the model's draws in the root's
    sibling group, as the verifier takes them), their tokens copied to the device where the model's
    picks wait, at the first draft step (when that device is known); never fed to the draft model."""

    def __init__(self, builder: TreeBuilder, k_config: tuple[int, ...], chain: list):
        super().__init__(builder, k_config)
        self.chain = chain

    def step(self, logits, hidden, drawn=None):
        if drawn is not None and self.chain:
            add_device_nodes(self.b, self.chain, logits.device)
            self.chain = []
        return super().step(logits, hidden, drawn)
