"""Prompt lookup: guess the next tokens by copying what followed the context's last n tokens the last
time they occurred (Saxena 2023, "prompt lookup decoding"; transformers' `prompt_lookup_num_tokens`,
vLLM's n-gram speculator). It costs no model forward.

Why the ParallelSpec policy grafts it beside its drafter: a ToT step's thoughts copy the question's
names, numbers and phrases, which a one-layer drafter over a draft vocabulary guesses badly, while a
lookup of the last few tokens finds them in the prompt and is often right exactly where the drafter
is wrong (docs/benchmarks.md, "Prompt lookup beside the drafter").

The guess is deterministic (picked, not drawn from a q), so the verifier takes it as a one-hot
proposal (verify.py): exact for greedy and sampled rows alike.
"""
from __future__ import annotations

import torch

from ..params import SamplingParams
from .base import DraftPolicy, DraftRound, TreeBuilder, option


def lookup_continuation(tokens: list[int], ngram: int, length: int) -> list[int]:
    """Up to `length` tokens that followed the most recent earlier occurrence of the last n tokens of
    `tokens`, trying n = ngram down to 1; [] when no n finds a match (or length < 1)."""
    if length < 1 or len(tokens) < 2:
        return []
    t = torch.tensor(tokens)
    for n in range(min(ngram, len(tokens) - 1), 0, -1):
        # windows that start at 0..len-1-n: each has a token after it, and the suffix itself is not one
        windows = t[:-1].unfold(0, n, 1)
        hits = (windows == t[-n:]).all(-1).nonzero()
        if hits.numel():
            start = int(hits[-1]) + n
            return tokens[start: start + length]
    return []


def graft_chain(builder, chain: list[int], shared: list[int]) -> list[int]:
    """Add `chain` below the root as picked nodes, sharing the `shared` nodes already drafted on its
    path (a trie): follow a shared child with the chain's token while there is one, then add the
    rest as a new branch. Returns the new nodes (the builder's ids).

    Only picked nodes may be shared. Sharing a sampled node would make whether the guess is tried
    depend on the draws (tried only when no draw equals it), and the draws that remain would no
    longer be samples of q: with one draw x ~ q and a guess c, c would come out with probability
    q(c) min(1, p(c)/q(c)) + (1 - q(c)) p(c), above p(c). Kept apart, the guess is tried first and
    the draws, still independent samples of q, run against the residual (verify.py)."""
    children: dict[int, dict[int, int]] = {}
    for node in sorted(shared):
        children.setdefault(builder.parents[node], {}).setdefault(builder.tokens[node], node)
    parent, added = -1, []
    for token in chain:
        existing = None if added else children.get(parent, {}).get(token)
        if existing is not None:
            parent = existing
            continue
        parent = builder.add(parent, token, None, 0.0)
        added.append(parent)
    return added


def picked_first(parents: list[int], q_index: list[int], nodes: list[int]) -> list[int]:
    """`nodes` (parent-closed) in an order the verifier can take: parents before children, and in
    every sibling group the picked nodes before the sampled ones, sampled ones in draw order."""
    depth: dict[int, int] = {}
    for n in sorted(nodes):
        depth[n] = 1 + depth.get(parents[n], 0)
    return sorted(nodes, key=lambda n: (depth[n], q_index[n] >= 0, n))


class PromptLookupPolicy(DraftPolicy):
    """`lookup`: draft with no model at all. Each round's draft is the lookup's continuation of the
    sequence (`lookup_continuation`), a chain of up to `depth` picked tokens; a round whose context
    has no match drafts nothing and is a plain target step. vLLM's n-gram speculator and transformers'
    prompt lookup decoding do the same.

    Why it is a policy of its own: with a draft model that costs a third of the target's forward
    (issue 10's Qwen 0.5B/1.5B pair on a CPU) no draft plan beats batched AR (`parallel`), but a
    draft that costs nothing can, wherever the output copies its prompt: a ToT value prompt's
    verdict repeats the state it judges, a thought repeats the question's names and numbers. Its
    rows need no draft cache and no draft prefill (`uses_draft_model`), so an engine without a draft
    model serves it, and a SEED worker drafts it inline instead of waiting for a draft forward.

    Options: ngram (the longest suffix matched, falling back to shorter ones; default 3) and depth
    (tokens drafted per round; default len(k_config), the chain `sd` drafts)."""

    name = "lookup"
    uses_draft_model = False
    drafts_trees = False  # one guessed chain per round

    def __init__(self, ngram: int = 3, depth: int = 3):
        if ngram < 1:
            raise ValueError(f"draft policy 'lookup': ngram={ngram} must be >= 1")
        if depth < 1:
            raise ValueError(f"draft policy 'lookup': depth={depth} must be >= 1")
        self.ngram, self.depth = ngram, depth

    @classmethod
    def parse_options(cls, ngram=3, depth=None) -> dict:
        return {"ngram": option(cls.name, "ngram", ngram, int, 1),
                "depth": None if depth is None else option(cls.name, "depth", depth, int, 1)}

    @classmethod
    def from_options(cls, engine, k_config, params, **options) -> "PromptLookupPolicy":
        o = cls.parse_options(**options)
        return cls(o["ngram"], len(k_config) if o["depth"] is None else o["depth"])

    def begin(self, seq, params: SamplingParams, vocab_size: int) -> DraftRound:
        return _LookupRound(TreeBuilder(seq, params, vocab_size), self.ngram, self.depth)


class _LookupRound(DraftRound):
    def __init__(self, builder: TreeBuilder, ngram: int, depth: int):
        self.b, self.ngram, self.depth = builder, ngram, depth

    def first_feed(self) -> None:
        return None  # no model forward: the whole round is in finish()

    def finish(self):
        b = self.b
        # picked, not drawn: the verifier takes each as a one-hot proposal, exact at any temperature
        graft_chain(b, lookup_continuation(b.seq.tokens, self.ngram, min(self.depth, b.remaining)), [])
        return b.tree()
