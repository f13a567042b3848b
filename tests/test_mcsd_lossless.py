"""mcsd (one row per forward, candidate trees from k_config) keeps the target's law with every kind of
drafter the other modes are proven with: a ParallelSpec one-pass drafter, one that reads the target's
hidden states, one over a draft vocabulary, the `lookup` policy and parallelspec's lookup graft.

The sampled tests are the TV test of test_sampling_lossless (800 samples against the simulated null's
maximum: flaky about 1 run in 50,000, and a TV of 0.10-0.11 is caught); its helper also asserts that
drafts were both accepted and rejected (0.05 < acceptance < 0.95), so a verifier that mishandled
either would move the distribution. Each tree test also asserts that most rounds really held
siblings, so that what is proven is the tree path, not a chain that mcsd happened to draft.
These counts do catch real biases here: a verifier that kept a rejected sibling's mass in the residual,
or drew a round's last token from p instead of the residual, fails every tree test; one that kept a
rejected guess in the residual fails both lookup tests (checked by mutating verify.py and
tree_decision.py when these tests were written)."""
from __future__ import annotations

import pytest

from conftest import reference_greedy, tiny_model
from test_draft_vocab import half_vocab_drafter
from test_sampling_lossless import SAMPLES, assert_policy_samples_follow_the_target, parallelspec_pair
from test_target_features import feature_drafter
from seed_tot import Engine, SamplingParams
from seed_tot.engine.policies.parallelspec import ParallelSpecPolicy

TREE = (2, 2)  # two candidates at each of the fixture's two positions: six nodes a round


def _tree_rounds(policy) -> int:
    """Rounds whose tree held more nodes than its depth: siblings were verified."""
    return sum(r["drafted"] > r["depth"] for r in policy.records)


def _sample_trees(target, drafter, setting: str, lookup: int = 0) -> list:
    """SAMPLES mcsd continuations through a parallelspec policy with TREE's widths, asserted to follow
    the target's law; most rounds must have held siblings."""
    policy = ParallelSpecPolicy(drafter, TREE, lookup=lookup)
    results = assert_policy_samples_follow_the_target(target, drafter, policy, setting, "mcsd", TREE, 1)
    assert _tree_rounds(policy) > SAMPLES // 2
    return results


def test_mcsd_parallelspec_trees_sample_the_target_distribution():
    target, drafter = parallelspec_pair(confident=True)
    _sample_trees(target, drafter, "top_k")


def test_mcsd_trees_from_a_drafter_reading_target_features_sample_the_target_distribution():
    """Every sibling's q comes from one forward over the true f_{p-1}: whichever is accepted, the next
    round's features are the target's at the accepted path."""
    target, _ = parallelspec_pair()
    _sample_trees(target, feature_drafter(target, n_masks=1), "temperature")


def test_mcsd_trees_over_a_draft_vocabulary_sample_the_target_distribution_and_emit_undraftable_tokens():
    """q is 0 on the odd tokens: every sibling group is drawn from the even half, and the residual
    alone emits the odd tokens, at the target's rate (top_p: groups may outnumber q's support)."""
    target, _ = parallelspec_pair()
    results = _sample_trees(target, half_vocab_drafter(target, 1), "top_p")
    assert any(t % 2 for r in results for t in r.token_ids)


def test_mcsd_greedy_trees_over_a_draft_vocabulary_equal_the_target_alone():
    """Greedy siblings are q's top-2 over the even tokens; where the target wants an odd one, every
    candidate is rejected and the target's own token is emitted."""
    target = tiny_model("llama", seed=3)
    drafter = half_vocab_drafter(target, 3)
    policy = ParallelSpecPolicy(drafter, TREE)
    prompts = [[3, 17, 42, 8, 61, 5], [9, 1, 77]]
    results = Engine(target, drafter).generate(prompts, SamplingParams(max_new_tokens=20, temperature=0),
                                               mode="mcsd", k_config=TREE, draft_policy=policy)
    for prompt, result in zip(prompts, results):
        assert result.token_ids == reference_greedy(target, prompt, 20)
    assert any(t % 2 for r in results for t in r.token_ids)  # the target did want undraftable tokens
    assert sum(r.stats.accepted for r in results) > 0 and _tree_rounds(policy) > 0


def _after_context(monkeypatch, context: list[int]) -> None:
    """Sample after `context`, the TV fixture's prompt with a continuation of it in front, so that a
    lookup guesses from the first round; the exact law is taken after the same context."""
    import test_sampling_lossless as fixture

    monkeypatch.setattr(fixture, "PROMPT", context)


# "4 2" occurred before: the guess is "4 1", whose "4" the target samples about half the time, so that the
# guess is accepted and rejected often (a rejected guess must leave the residual without it)
GUESS_41 = [1, 4, 2, 4, 1, 4, 2]


def test_mcsd_with_the_lookup_policy_samples_the_target_distribution(monkeypatch):
    """The named policy under a tree k_config: no draft model, a picked chain of len(k_config) a round."""
    _after_context(monkeypatch, GUESS_41)
    target, _ = parallelspec_pair()
    results = assert_policy_samples_follow_the_target(target, None, "lookup", "temperature", "mcsd", TREE, 1)
    assert sum(r.stats.draft_forwards + r.stats.draft_prefills for r in results) == 0


def test_mcsd_parallelspec_trees_with_a_lookup_graft_sample_the_target_distribution(monkeypatch):
    """A picked guess beside sampled sibling groups: tried first, the draws then against the residual."""
    _after_context(monkeypatch, GUESS_41)
    target, drafter = parallelspec_pair()
    policy = ParallelSpecPolicy(drafter, TREE, lookup=2)
    assert_policy_samples_follow_the_target(target, drafter, policy, "top_k", "mcsd", TREE, 1)
    # TREE's levels hold at most 2 + 4 nodes: a round with more carried the grafted guess
    assert sum(r["drafted"] > 6 for r in policy.records) > SAMPLES // 2
