"""OPT-Tree builds the best n-node tree by path probability, and E(A) predicts the realized length."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from conftest import noisy_copy, reference_greedy, tiny_model
from seed_tot import Engine, SamplingParams
from seed_tot.engine.policies.opt_tree import OptTreePolicy

V = 3
SAMPLED = SamplingParams(max_new_tokens=64, temperature=1.0)


def hand_made(path: tuple[int, ...]) -> list[float]:
    """A tie-free next-token distribution for each path of a tiny 3-token vocabulary."""
    gen = torch.Generator().manual_seed(1000 + hash(path) % 100_000)
    return torch.softmax(torch.randn(V, generator=gen) * 1.5, -1).tolist()


def drive(policy, children_probs, params=SAMPLED):
    """Run one round against a stub draft whose distribution depends on the path from the root."""
    kv = SimpleNamespace(parents=[], committed=4)
    seq = SimpleNamespace(draft=kv, generated=[], generator=None, pending=lambda cache: [7])
    rnd = policy.begin(seq, params, V)
    feed, entry_path, first = rnd.first_feed(), [], True
    while feed is not None:
        paths = [() if first else entry_path[p] + (t,) for t, p in zip(feed.tokens, feed.parents)]
        entry_path += paths
        kv.parents += feed.parents
        first = False
        logits = torch.log(torch.tensor([children_probs(path) for path in paths]))
        feed = rnd.step(logits, None)
    return rnd.finish()


def brute_force_best(children_probs, n: int, max_depth: int) -> float:
    """max over parent-closed n-node subtrees (depth <= max_depth) of the sum of path probabilities."""
    best, seen = 0.0, set()

    def phat(path):
        return math.prod(children_probs(path[:d])[path[d]] for d in range(len(path)))

    def grow(chosen: frozenset, total: float) -> None:
        nonlocal best
        if chosen in seen:
            return
        seen.add(chosen)
        if len(chosen) == n:
            best = max(best, total)
            return
        for path in [()] + sorted(chosen):
            if len(path) < max_depth:
                for tok in range(V):
                    child = path + (tok,)
                    if child not in chosen:
                        grow(chosen | {child}, total + phat(child))

    grow(frozenset(), 0.0)
    return best


@pytest.mark.parametrize("n,max_depth", [(1, 3), (3, 2), (4, 3), (6, 4)])
def test_construction_equals_brute_force_best_subtree(n, max_depth):
    tree, _ = drive(OptTreePolicy(n=n, delta=0.0, max_depth=max_depth), hand_made)
    assert len(tree) == n
    assert sum(tree.path_probs) == pytest.approx(brute_force_best(hand_made, n, max_depth), abs=1e-6)


@pytest.mark.parametrize("n", [2, 5, 9])
def test_tree_is_closed_under_parent_and_topologically_ordered(n):
    tree, node_entry = drive(OptTreePolicy(n=n, delta=0.0, max_depth=5), hand_made)
    for i, parent in enumerate(tree.parents):
        assert -1 <= parent < i
        if parent >= 0:  # a child's p̂ is its parent's times the draft's probability of it
            assert tree.path_probs[i] < tree.path_probs[parent]
            assert parent in node_entry  # every parent was fed to the draft
    assert all(tree.deterministic(i) for i in range(len(tree)))


def test_delta_stops_growth_when_a_layer_adds_too_little():
    """A peaked draft, n = 4: the layers raise E_sub by 1.0, 0.76, 0.68, 0.61. A layer that adds less
    than delta is kept (its draft forward is spent) but no further draft forward is run."""
    peaked = lambda path: [0.9, 0.05, 0.05]  # noqa: E731
    depths = [drive(OptTreePolicy(n=4, delta=delta, max_depth=4), peaked)[0].depth() for delta in (1.5, 0.9, 0.7, 0.0)]
    assert depths == [1, 2, 3, 4]


def test_expected_accepted_length_matches_realized_with_draft_equal_to_target():
    """Draft = target at T > 0: P(reach a node) is exactly its p̂, so tokens per round has mean E(A)."""
    target = tiny_model("llama", seed=5)
    policy = OptTreePolicy(n=6, delta=0.0, max_depth=4)
    params = SamplingParams(max_new_tokens=48, temperature=1.0, top_k=8)
    Engine(target, target).generate([[1, 2, 3]] * 12, params, mode="sd", draft_policy=policy)
    rounds = policy.records
    diffs = torch.tensor([r["tokens"] - r["expected_tokens"] for r in rounds])
    mean_expected = sum(r["expected_tokens"] for r in rounds) / len(rounds)
    assert mean_expected > 1.5  # the trees do predict several tokens per round
    assert abs(float(diffs.mean())) < 4 * float(diffs.std()) / math.sqrt(len(rounds)) + 0.02


@pytest.mark.parametrize("mode", ["sd", "mcsd", "seed"])
def test_greedy_opt_tree_equals_target_alone(mode):
    target = tiny_model("qwen2", seed=3)
    prompts = [[5], [1, 2, 3, 4, 5, 6, 7], [9, 8, 7]]
    refs = [reference_greedy(target, p, 20) for p in prompts]
    for draft in (noisy_copy(target, 0.005), tiny_model("qwen2", seed=4)):
        results = Engine(target, draft).generate(prompts, SamplingParams(max_new_tokens=20, temperature=0), mode=mode,
                                                 draft_policy="opt-tree", policy_options={"n": "5", "delta": "0.1"})
        assert [r.token_ids for r in results] == refs
