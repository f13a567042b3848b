"""`auto` prices a batched round by what shares its forwards: a row alone drafts a long chain, rows
sharing a compute-bound forward draft less (down to plain target steps), rows sharing a flat
(memory-bound) forward keep their chains; the plan is near the brute-force best; and the plans
keep batched SEED exact."""
from __future__ import annotations

import itertools
import random

import pytest

from conftest import noisy_copy, reference_greedy, rows_stopping_differently, tiny_model
from seed_tot import Engine, SamplingParams
from seed_tot.engine.policies.auto import AutoPolicy, Costs, batch_time, expected_tokens, plan_lengths

# a CPU-like target: flat up to 4 tokens, then 15 ms a token; a draft step 10 ms, 20 ms at 32 tokens
STEEP = Costs(0.1, 0.0, 0.01, ((1, 0.1), (4, 0.1), (64, 1.0)), ((1, 0.01), (32, 0.02)))
# a GPU-like target: flat up to 64 tokens
FLAT = Costs(0.1, 0.0, 0.01, ((1, 0.1), (64, 0.105)), ((1, 0.01), (32, 0.011)))


def test_batch_time_counts_each_shared_draft_step_at_its_width():
    costs = Costs(0.0, 0.0, 0.0, ((1, 1.0), (64, 64.0)), ((1, 0.1), (32, 3.2)))  # 1 s / 0.1 s per token
    # step 1 feeds the pending tokens of the rows that draft (2 + 1), steps 2 and 3 one row each;
    # the target verifies 0+1 + 1+1 + 3+1 tokens and 2 from elsewhere
    assert batch_time([0, 1, 3], [5, 2, 1], costs, other_tokens=2) == pytest.approx(0.3 + 0.1 + 0.1 + 9.0)
    assert batch_time([0, 0], [4, 4], costs) == pytest.approx(2.0)  # nobody drafts: no draft forward


def test_a_row_alone_drafts_long_and_rows_sharing_a_compute_bound_forward_draft_less():
    lengths = [plan_lengths([0.7] * n, [1] * n, STEEP, 6) for n in (1, 2, 4, 8, 16)]
    longest = [max(plan) for plan in lengths]
    assert longest == sorted(longest, reverse=True)
    assert lengths[0] == [3] and lengths[-1] == [0] * 16  # 16 rows: plain target steps, parallel's cost


def test_rows_sharing_a_flat_forward_keep_their_long_chains():
    assert plan_lengths([0.9] * 16, [1] * 16, FLAT, 6) == [6] * 16


def test_surer_rows_get_the_longer_drafts():
    mild = Costs(0.1, 0.0, 0.002, ((1, 0.1), (4, 0.1), (64, 0.4)), ((1, 0.002), (32, 0.004)))  # 5 ms a token
    plan = plan_lengths([0.95, 0.2, 0.8, 0.4], [1] * 4, mild, 6)
    assert plan[0] >= plan[2] >= plan[3] >= plan[1] and plan[0] > plan[1]


def test_the_plan_is_within_ten_percent_of_the_best_plan_found_by_brute_force():
    rng = random.Random(0)
    for _ in range(200):
        n, max_len = rng.randint(1, 4), 4
        alphas = [rng.random() for _ in range(n)]
        pending = [rng.randint(1, 3) for _ in range(n)]
        knee = rng.randint(2, 6)
        costs = Costs(0.1, 0.0, 0.01, ((1, 0.1), (knee, 0.1 + 0.05 * rng.random()), (64, rng.uniform(0.3, 3.0))),
                      ((1, rng.uniform(0.005, 0.05)), (32, rng.uniform(0.05, 0.2))))
        others = rng.randint(0, 5)

        def rate(lengths):
            tokens = sum(expected_tokens(a, k) for a, k in zip(alphas, lengths)) + others
            return tokens / batch_time(list(lengths), pending, costs, others)

        best = max(rate(p) for p in itertools.product(range(max_len + 1), repeat=n))
        assert rate(plan_lengths(alphas, pending, costs, max_len, others)) >= 0.9 * best


def test_rows_draft_nothing_while_four_share_a_compute_bound_forward_and_draft_once_two_remain():
    """EOS after 2 tokens and a stop string end two of four rows early. While four rows share the
    forwards, verifying a drafted token costs more than it is expected to bring, so nobody drafts;
    once two remain, they draft. Output equals each row generated alone."""
    target, prompts, tok, params, _ = rows_stopping_differently()
    engine = Engine(target, noisy_copy(target, 0.005), tokenizer=tok)
    alone = [engine.generate([p], params, mode="sd")[0] for p in prompts]
    # alone, a row at the prior drafts 3; prefill=free: at four rows no draft would repay its prefill,
    # and this test is about the plan inside a call that drafts
    policy = AutoPolicy(STEEP, max_len=6, prior=0.7, prefill="free")
    results = engine.generate(prompts, params, mode="seed", draft_policy=policy, draft_batch=None, verify_batch=None)
    assert [r.token_ids for r in results] == [a.token_ids for a in alone]
    assert {r.finish_reason for r in results} >= {"eos", "stop"}
    last = [r["drafted"] for r in policy.records if r["seq"] == 3]
    assert last[0] == 0 and max(last) >= 1


def test_greedy_load_aware_auto_equals_the_target_alone_with_rows_of_different_lengths():
    target = tiny_model("llama", seed=3)
    draft = noisy_copy(target, 0.005)
    prompts = [[5], [1, 2, 3, 4, 5, 6, 7], [9, 1, 77], [42, 17, 3, 3], [8]]
    # flat up to 8 tokens: at 5 rows some rows draft and others do not, and it changes as rows agree
    costs = Costs(0.1, 0.0, 0.01, ((1, 0.1), (8, 0.1), (64, 1.0)), ((1, 0.01), (32, 0.02)))
    policy = AutoPolicy(costs, max_len=6)
    results = Engine(target, draft).generate(prompts, SamplingParams(max_new_tokens=24, temperature=0),
                                             mode="seed", draft_policy=policy, draft_batch=None, verify_batch=None)
    assert [r.token_ids for r in results] == [reference_greedy(target, p, 24) for p in prompts]
    drafted = {r["drafted"] for r in policy.records}
    assert 0 in drafted and len(drafted) >= 3  # plans varied between rounds and rows


def test_sampled_rows_plan_alone_by_default_so_batched_seed_samples_what_sd_samples():
    """load=greedy (the default) plans only greedy rows together: a sampled row's draft lengths depend
    on its own history, so batched SEED reproduces sd's samples for the same seed; load=all plans
    them together too (test_policy_lossless checks that its distribution stays exact)."""
    target = tiny_model("llama", seed=3)
    draft = noisy_copy(target, 0.05)
    params = SamplingParams(max_new_tokens=16, temperature=0.9, seed=7)
    prompts = [[5, 9], [1, 2, 3, 4], [9, 1, 77]] * 2
    engine = Engine(target, draft)
    # prefill=free: both calls must draft (priced, the six rows of seed would not repay their prefill and
    # would sample as parallel does, while sd's rows, each alone in its forwards, would)
    sd = engine.generate(prompts, params, mode="sd", draft_policy=AutoPolicy(STEEP, max_len=6, prior=0.7, prefill="free"))
    seed = engine.generate(prompts, params, mode="seed", draft_policy=AutoPolicy(STEEP, max_len=6, prior=0.7, prefill="free"),
                           draft_batch=None, verify_batch=None)
    assert [r.token_ids for r in sd] == [r.token_ids for r in seed]
    assert sum(r.stats.draft_forwards for r in seed) > 0  # rows that drafted, not two runs of plain steps
    with pytest.raises(ValueError, match="load='sometimes' must be one of greedy, all, off"):
        AutoPolicy(STEEP, load="sometimes")
