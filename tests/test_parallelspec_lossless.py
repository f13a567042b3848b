"""An untrained ParallelSpec drafter keeps the target's distribution (the TV test of
test_sampling_lossless), chain and tree, in sd, mcsd and seed: q_t does not depend on the drafted
path, and the verifier sees the q each candidate was drawn from."""
from __future__ import annotations

from collections import Counter

import pytest
import torch

from test_sampling_lossless import LENGTH, SAMPLES, SETTINGS, pair, sample_through_engine, tv, tv_bound  # noqa: F401 (pair: a fixture)
from seed_tot import SamplingParams
from seed_tot.engine.drafters import ParallelDrafter


@pytest.mark.parametrize("mode,k_config,setting,batch", [("sd", (1,), "temperature", 1),
                                                         ("seed", (2, 2), "top_p", None)])  # None: batched forwards
def test_parallelspec_samples_follow_the_target_distribution(pair, mode, k_config, setting, batch):
    target, _ = pair
    torch.manual_seed(0)
    drafter = ParallelDrafter(target, n_masks=1, n_layers=1).eval()  # untrained: drafts 2 tokens per forward
    results, exact = sample_through_engine(target, drafter, setting, mode, k_config, batch, draft_policy="parallelspec")
    stats = [r.stats for r in results]
    forwards, rounds = sum(s.draft_forwards for s in stats), sum(s.verifications for s in stats)
    assert forwards == rounds if batch == 1 else forwards < rounds  # one draft forward a round (shared when batched)
    assert tv(Counter(tuple(r.token_ids) for r in results), exact, SAMPLES) < tv_bound(exact, SAMPLES)


def test_parallelspec_drops_draws_past_q_and_keeps_the_target_distribution(pair, monkeypatch):
    """top_k=2 under groups of three: q_1 holds two tokens, so each root group's third draw (a token
    of no mass) is dropped with its subtree; the samples still follow the target."""
    target, _ = pair
    torch.manual_seed(0)
    drafter = ParallelDrafter(target, n_masks=1, n_layers=1).eval()
    monkeypatch.setitem(SETTINGS, "narrow", SamplingParams(max_new_tokens=LENGTH, temperature=1.0, top_k=2))
    results, exact = sample_through_engine(target, drafter, "narrow", "seed", (3, 2), None, draft_policy="parallelspec")
    assert tv(Counter(tuple(r.token_ids) for r in results), exact, SAMPLES) < tv_bound(exact, SAMPLES)


@pytest.mark.parametrize("mode,batch,load", [("sd", 1, "greedy"), ("seed", None, "greedy"), ("seed", None, "all")])
def test_choose_with_a_parallelspec_drafter_keeps_the_target_distribution(pair, mode, batch, load):
    """The embedded default's path: `choose` over a ParallelSpec drafter's rounds, the suffix chain grafted
    beside them, on a forward that makes every option pay; a sampled row priced at its constant load
    (load=greedy) or jointly with the rows beside it (load=all)."""
    from seed_tot.engine.cost_model import Costs
    from seed_tot.engine.policies.choose import ChoosePolicy
    from seed_tot.engine.policies.parallelspec import ParallelSpecPolicy
    from seed_tot.engine.policies.suffix import SuffixSource
    from test_sampling_lossless import assert_policy_samples_follow_the_target

    target, _ = pair
    torch.manual_seed(0)
    drafter = ParallelDrafter(target, n_masks=1, n_layers=1).eval()
    policy = ChoosePolicy(Costs(0.1, 0.0, 0.001), SuffixSource(depth=2, share="all"), load=load, costs_at="calibrated",
                          model=ParallelSpecPolicy(drafter, (1,), depth=2, load=load))
    assert_policy_samples_follow_the_target(target, drafter, policy, "temperature", mode, (1,), batch)
    assert sum(rec["drafted"] > 0 for rec in policy.records) > len(policy.records) // 2  # rounds that drafted
