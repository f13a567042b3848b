"""Sampled trees that branch are decided on the device, every row of a verification at once
(tree_decision.tree_decisions): the output keeps the target's distribution for every tree shape,
and a row's tokens do not depend on the rows beside it.

The distribution check draws TRIALS sequences of POSITIONS tokens from a Markov target (p at a
position depends on the previous token, so the law is enumerable), each trial grown round by round
from trees of one shape, every round of every trial decided in one tree_decisions call. Each shape's
samples must lie within test_sampling_lossless's TV bound (the largest TV among simulated draws from
the exact law itself) of that law."""
from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest
import torch

from seed_tot.engine.draft_tree import DETERMINISTIC, DraftTree
from seed_tot.engine.tree_decision import tree_decisions
from seed_tot.engine.verify import Acceptance, accept_sampled, decide_alone, is_chain, row_uniforms
from test_chain_acceptance import random_rows
from test_sampling_lossless import tv, tv_bound

V = 4
POSITIONS = 3
TRIALS = 6_000  # per shape

# P[t, prev + 1] is the target's p at position t after token prev (prev = -1: nothing before);
# Q the same for the draft, far from P: some tokens q drafts the target never emits (and back)
_g = torch.Generator().manual_seed(1)
P = (torch.rand(POSITIONS, V + 1, V, generator=_g) * 4).softmax(-1)
P[:, :, 3] = 0.0
P[1, :, 0] = 0.0
P = P / P.sum(-1, keepdim=True)
Q = (torch.rand(POSITIONS, V + 1, V, generator=_g) * 4).softmax(-1).flip(-1)
Q[:, :, 1] = 0.0
Q = Q / Q.sum(-1, keepdim=True)

# tree shapes: per depth, (picked, sampled) children of every node at that depth; then whether the
# sampled siblings were drawn without replacement (with replacement each sibling draws from its own q)
SHAPES = {
    "root 2": ([(0, 2)], True),
    "2x2": ([(0, 2), (0, 2)], True),
    "3-1 with replacement": ([(0, 3), (0, 1)], False),
    "1-3 (branching deeper)": ([(0, 1), (0, 3)], True),
    "picked + sampled": ([(1, 2), (1, 1)], True),
    "picked + sampled, with replacement": ([(2, 1), (0, 2)], False),
    "picked only, then sampled": ([(2, 0), (0, 3)], True),
    "chain": ([(0, 1), (0, 1)], True),
}


def _markov_law(table: torch.Tensor) -> dict[tuple[int, ...], float]:
    return {s: math.prod(float(table[t, (s[t - 1] if t else -1) + 1, x]) for t, x in enumerate(s))
            for s in itertools.product(range(V), repeat=POSITIONS)}


def _q_for(at: int, prev: int, sibling: int) -> torch.Tensor:
    """The draft's q at position `at` after `prev`; with replacement, sibling j draws from its own
    (q rolled by j), so a verifier that reads the wrong sibling's q is wrong."""
    return Q[at, prev + 1].roll(sibling)


def _grow(levels, without_replacement: bool, at: int, prev: int, gen: torch.Generator):
    """A draft tree of the shape `levels` hung after token `prev` at position `at`, and its p rows."""
    parents, tokens, q_rows, q_index, p_rows = [], [], [], [], [P[at, prev + 1]]
    frontier = [(-1, prev)]  # (node, its token) whose children the next level adds
    for depth, (n_picked, n_sampled) in enumerate(levels):
        position = at + depth  # of the children added now
        next_frontier = []
        for node, token in frontier:
            children = [((token + 1 + j) % V, DETERMINISTIC) for j in range(n_picked)]  # a fixed guess
            if n_sampled and without_replacement:
                q_rows.append(_q_for(position, token, 0))
                drawn = torch.multinomial(q_rows[-1], n_sampled, replacement=False, generator=gen).tolist()
                children += [(x, len(q_rows) - 1) for x in drawn]
            else:
                for j in range(n_sampled):
                    q_rows.append(_q_for(position, token, j))
                    children.append((int(torch.multinomial(q_rows[-1], 1, generator=gen)), len(q_rows) - 1))
            for x, q_row in children:
                parents.append(node)
                tokens.append(x)
                q_index.append(q_row)
                p_rows.append(P[position + 1, x + 1])  # levels stop before the last position
                next_frontier.append((len(tokens) - 1, x))
        frontier = next_frontier
    draft_probs = torch.stack(q_rows) if q_rows else torch.empty(0, V)
    return DraftTree(parents, tokens, draft_probs, without_replacement, q_index), torch.stack(p_rows)


def _decode(tree: DraftTree, row: list[int]) -> Acceptance:
    path = [node for node in row[:-1] if node >= 0]
    return Acceptance(path, [tree.tokens[i] for i in path] + [row[-1]], (path[-1] if path else -1) in tree.parents)


def _decide(trees: list[DraftTree], probs: list[torch.Tensor], gens: list[torch.Generator]) -> list[Acceptance]:
    """tree_decisions on these rows (p padded to the largest tree), decoded."""
    width = max(len(p) for p in probs)
    padded = torch.stack([torch.cat([p, torch.full((width - len(p), V), 1 / V)]) for p in probs])
    decided = tree_decisions(trees, padded, [row_uniforms(t, g) for t, g in zip(trees, gens)]).tolist()
    return [_decode(tree, row) for tree, row in zip(trees, decided)]


def _sample_every_shape() -> dict[str, list[tuple[int, ...]]]:
    """TRIALS sequences per shape, every shape's trials side by side in each tree_decisions call."""
    gen = torch.Generator().manual_seed(0)
    names = list(SHAPES)
    out: list[list[int]] = [[] for _ in range(TRIALS * len(names))]
    while any(len(o) < POSITIONS for o in out):
        live = [b for b, o in enumerate(out) if len(o) < POSITIONS]
        trees, probs = [], []
        for b in live:
            levels, without_replacement = SHAPES[names[b % len(names)]]
            at = len(out[b])
            tree, p = _grow(levels[: POSITIONS - 1 - at], without_replacement, at, out[b][-1] if at else -1, gen)
            trees.append(tree)
            probs.append(p)
        for b, acc in zip(live, _decide(trees, probs, [gen] * len(trees))):
            out[b] += acc.tokens
    return {name: [tuple(o) for o in out[i::len(names)]] for i, name in enumerate(names)}


@pytest.fixture(scope="module")
def samples():
    return _sample_every_shape()


@pytest.mark.parametrize("shape", list(SHAPES))
def test_every_tree_shape_samples_the_target_distribution(samples, shape):
    exact = _markov_law(P)
    assert tv(Counter(samples[shape]), exact, TRIALS) < tv_bound(exact, TRIALS)
    assert all(s[0] != 3 and s[1] not in (0, 3) and s[2] != 3 for s in samples[shape])  # no mass: never emitted


def test_the_distribution_check_can_fail():
    """The statistic has power here: a verifier that kept q's draws would emit the draft's law."""
    exact, draft_law = _markov_law(P), _markov_law(Q)
    assert tv(Counter({s: p * TRIALS for s, p in draft_law.items()}), exact, TRIALS) > 3 * tv_bound(exact, TRIALS)


def test_drafts_are_both_accepted_and_rejected_at_every_depth():
    """So that a wrong residual (the target of a later sibling, or of the resampled token) would show."""
    gen = torch.Generator().manual_seed(3)
    rows = [_grow(SHAPES["2x2"][0], True, 0, -1, gen) for _ in range(2000)]
    accs = _decide([t for t, _ in rows], [p for _, p in rows], [gen] * len(rows))
    lengths = Counter(len(a.path) for a in accs)
    assert set(lengths) == {0, 1, 2} and min(lengths.values()) > 100
    assert Counter(a.path[0] for a in accs if a.path).keys() == {0, 1}  # the second sibling is accepted too


# chains, branching at the root, deeper, and both
SHAPES_BY_PARENTS = [[], [-1], [-1, -1], [-1, 0, 0, 1], [-1, -1, -1, 0, 2], [-1, 0, 1, 1], [-1, 0, 1, 2]]


def _random_rows(n_rows: int):
    """Rows of assorted shapes, the root's first child picked in every third, every other row drawn
    without replacement; their padded p and a fresh generator per row."""
    return random_rows(n_rows, shapes=SHAPES_BY_PARENTS, picked_every=3)


def test_a_row_decides_the_same_alone_or_beside_other_rows():
    trees, probs, gens = _random_rows(42)
    together = accept_sampled(trees, probs, [row_uniforms(t, g) for t, g in zip(trees, gens)])
    _, _, gens = _random_rows(42)  # the same seeds again
    alone = [decide_alone(t, probs[b, : len(t) + 1], False, gens[b]) for b, t in enumerate(trees)]
    assert together == alone
    assert {a.resampled for a in together} == {True, False}
    assert any(len(a.path) > 1 and not is_chain(t) for a, t in zip(together, trees))  # deep in a branching tree


def test_a_row_consumes_len_plus_one_uniforms_of_its_own_generator():
    """Chains and branching trees alike."""
    trees, probs, gens = _random_rows(14)
    accept_sampled(trees, probs, [row_uniforms(t, g) for t, g in zip(trees, gens)])
    _, _, fresh = _random_rows(14)
    for tree, used, ref in zip(trees, gens, fresh):
        torch.rand(len(tree) + 1, generator=ref)
        assert torch.equal(used.get_state(), ref.get_state())


def test_a_chain_walked_as_a_tree_accepts_what_the_chain_decision_accepts():
    """Both device decisions state one rule: on a chain, with the same uniforms, the same path."""
    trees, probs, gens = _random_rows(400)
    chains = [b for b, t in enumerate(trees) if is_chain(t)]
    uniforms = [row_uniforms(trees[b], gens[b]) for b in chains]
    as_chains = accept_sampled([trees[b] for b in chains], probs[chains], uniforms)
    as_trees = tree_decisions([trees[b] for b in chains], probs[chains], uniforms).tolist()
    assert [a.path for a in as_chains] == [_decode(trees[b], row).path for b, row in zip(chains, as_trees)]
    assert len({len(a.path) for a in as_chains}) > 2
