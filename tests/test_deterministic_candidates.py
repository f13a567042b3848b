"""Picked (deterministic) draft candidates are verified with the rule that is exact for them.

The verifier accepts a picked candidate c with probability p(c) given the earlier candidates were
rejected (one-hot proposals without replacement). These tests check the emitted token follows p
for any choice of candidates, and that the ratio test against q -- the biased alternative -- is
caught by the same statistic.
"""
from __future__ import annotations

import pytest
import torch

from seed_tot.engine.draft_tree import DETERMINISTIC, DraftTree
from seed_tot.engine.verify import accept_tokens

P = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05, 0.0])
Q = torch.tensor([0.9, 0.02, 0.0, 0.02, 0.03, 0.03])  # the draft is overconfident in token 0


def _first_token_distribution(tree: DraftTree, trials: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    counts = torch.zeros(len(P))
    target_probs = P.expand(len(tree) + 1, -1)
    for _ in range(trials):
        counts[accept_tokens(tree, target_probs, greedy=False, generator=gen).tokens[0]] += 1
    return counts / trials


@pytest.mark.parametrize("candidates", [[0], [0, 1], [3, 0, 5], [5], [1, 2, 3, 4]])
def test_picked_candidates_emit_the_target_distribution(candidates):
    tree = DraftTree([-1] * len(candidates), candidates, torch.empty(0, len(P)),
                     q_index=[DETERMINISTIC] * len(candidates))
    empirical = _first_token_distribution(tree, 20000)
    assert 0.5 * (empirical - P).abs().sum() < 0.02
    assert empirical[5] == 0  # a token the target gives no mass is never emitted


def test_ratio_test_against_q_on_picked_candidates_is_biased():
    """q(0) = 0.9, p(0) = 0.5: treating the argmax pick as a q-sample and using min(1, p/q) after
    (wrongly) assuming it was drawn from q accepts 0.556 instead of emitting 0 with probability 0.5."""
    sampled_view = DraftTree([-1], [0], Q[None])  # claims token 0 was drawn from q
    biased = _first_token_distribution(sampled_view, 20000, seed=1)
    assert abs(float(biased[0]) - 0.5) > 0.03  # the statistic sees the bias ...
    exact = DraftTree([-1], [0], torch.empty(0, len(P)), q_index=[DETERMINISTIC])
    assert abs(float(_first_token_distribution(exact, 20000, seed=1)[0]) - 0.5) < 0.015  # ... and the exact rule has none


def test_picked_chain_second_level_is_conditioned_on_the_first():
    """A two-level picked chain: P(x1, x2) = p(x1) p(x2 | x1) whatever the picks."""
    gen = torch.Generator().manual_seed(2)
    p2 = torch.tensor([0.1, 0.6, 0.1, 0.1, 0.1, 0.0])
    tree = DraftTree([-1, 0], [0, 4], torch.empty(0, len(P)), q_index=[DETERMINISTIC] * 2)
    target_probs = torch.stack([P, p2, P])
    trials, joint = 20000, {}
    for _ in range(trials):
        toks = accept_tokens(tree, target_probs, greedy=False, generator=gen).tokens[:2]
        if toks[0] == 0:
            joint[toks[1]] = joint.get(toks[1], 0) + 1
    n0 = sum(joint.values())
    assert abs(n0 / trials - 0.5) < 0.015
    empirical = torch.tensor([joint.get(t, 0) / n0 for t in range(len(P))])
    assert 0.5 * (empirical - p2).abs().sum() < 0.03


def test_tree_keeps_no_vocabulary_row_for_picked_nodes():
    tree = DraftTree([-1, -1, 0], [1, 2, 3], torch.empty(0, 50_000), q_index=[DETERMINISTIC] * 3)
    assert tree.draft_probs.numel() == 0 and all(tree.deterministic(i) for i in range(3))


def test_tree_rejects_siblings_of_mixed_kinds():
    with pytest.raises(ValueError, match="deterministic child after a sampled one"):
        DraftTree([-1, -1], [1, 2], torch.ones(1, 6) / 6, q_index=[0, DETERMINISTIC])
