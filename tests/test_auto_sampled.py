"""`auto` under its default prefill=priced, sampled: a call that its price lets draft keeps the target's
distribution (the TV test of test_sampling_lossless) with sampled rows planned alone (load=greedy) or
together (load=all), and a declined call under load=all samples what `parallel` samples.
(test_policy_lossless covers prefill=free; test_draft_prefill_pricing the declined call under load=greedy.)"""
from __future__ import annotations

import pytest

from conftest import noisy_copy, tiny_model
from seed_tot import Engine, SamplingParams
from seed_tot.engine.policies.auto import AutoPolicy, Costs
from test_draft_prefill_pricing import FLAT, _prompts
from test_sampling_lossless import assert_policy_samples_follow_the_target, pair  # noqa: F401 (pair: a fixture)


# test_policy_lossless's auto-load costs: flat to 15 target tokens, so 8 rows at once draft 0, 1 or 2,
# and a draft whose prompt tokens cost little, so a call of 800 rows x 2 tokens repays its prefill
CHEAP_DRAFT = Costs(0.1, 0.0, 0.001, ((1, 0.1), (15, 0.1), (64, 1.0)), ((1, 0.001), (32, 0.002)))


@pytest.mark.parametrize("load,setting", [("greedy", "temperature"), ("all", "top_p")])
def test_a_priced_sampled_call_that_drafts_follows_the_target_distribution(pair, load, setting):
    target, draft = pair
    policy = AutoPolicy(CHEAP_DRAFT, max_len=2, prior=0.8, load=load)  # prefill="priced": the default
    results = assert_policy_samples_follow_the_target(target, draft, policy, setting, "seed", (1,), None)
    assert sum(r.stats.draft_prefills for r in results) > 0  # the price let it draft


def test_a_declined_sampled_call_under_load_all_samples_what_parallel_samples():
    target = tiny_model("llama", seed=3)
    engine = Engine(target, noisy_copy(target, 0.005))
    prompts = _prompts(4, 150, 100)
    params = SamplingParams(max_new_tokens=3, temperature=1.0, top_k=20, seed=5)
    declined = engine.generate(prompts, params, mode="seed", draft_policy=AutoPolicy(FLAT, max_len=4, load="all"))
    plain = engine.generate(prompts, params, mode="parallel")
    assert sum(r.stats.draft_prefills + r.stats.draft_forwards for r in declined) == 0
    assert [r.token_ids for r in declined] == [r.token_ids for r in plain]
