"""`auto` prices the draft's prefill: a call whose prompts cost the draft more to score than drafting
can save over its budget runs plain target steps, and its output is still the target's."""
from __future__ import annotations

import asyncio
import logging

import pytest

from conftest import noisy_copy, reference_greedy, tiny_model
from seed_tot import Engine, SamplingParams
from seed_tot.engine.policies import check_policy_options
from seed_tot.engine.policies.auto import AutoPolicy, Costs, decode_saving
from seed_tot.engine.model_runtime import ModelRuntime
from seed_tot.engine.shared_prefill import MIN_SHARED, PrefixStore, _can_share, prefill_prompts, tokens_to_score
from test_attention_types import build

# a GPU-like target (flat to 16 query tokens) and a draft whose prompt tokens cost 10 ms each
FLAT = Costs(0.05, 0.0, 0.005, ((1, 0.05), (16, 0.05), (64, 0.2)), ((1, 0.005), (32, 0.3), (128, 1.26)))
GREEDY_2 = SamplingParams(max_new_tokens=2, temperature=0)
GREEDY_40 = SamplingParams(max_new_tokens=40, temperature=0)


@pytest.fixture(scope="module")
def engine():
    target = tiny_model("llama", seed=3)
    return Engine(target, noisy_copy(target, 0.005))


def _prompts(n: int, length: int, shared: int) -> list[list[int]]:
    """n prompts of `length` tokens that agree on their first `shared`."""
    return [[7] * shared + [(11 * i + j) % 90 + 1 for j in range(length - shared)] for i in range(n)]


def test_tokens_to_score_counts_each_shared_stretch_once(engine):
    runtime = engine.draft_runtime
    prompts = _prompts(3, 100, 60)
    # each prompt is scored but its last token; the 60-token stretch once, then 39 per prompt
    assert tokens_to_score(runtime, prompts) == 60 + 3 * 39
    assert tokens_to_score(runtime, prompts + prompts) == 60 + 3 * 39  # copies fork one cache
    assert tokens_to_score(runtime, prompts[:1]) == 99


@pytest.mark.parametrize("arch", ["llama", "falcon-mqa"])  # falcon-mqa: a model that cannot share a prefix
def test_tokens_to_score_is_what_prefill_scores_and_never_more(arch):
    runtime = ModelRuntime(tiny_model("llama", seed=5) if arch == "llama" else build(arch))
    assert _can_share(runtime) == (arch == "llama")

    def scored(prompts):
        return sum(cost.tokens for cost in prefill_prompts(runtime, prompts)[1])

    for prompts in (_prompts(3, 100, 60), _prompts(2, 80, 50) * 2, [[5], [6], [5]],
                    [[7] * 40 + [x] for x in (10, 11, 12)]):  # the last: prompts that differ in their last token only
        assert tokens_to_score(runtime, prompts) == pytest.approx(scored(prompts)), prompts
    short = [[9] * 10 + [x] * 20 for x in (1, 2, 3)]  # a common stretch under MIN_SHARED, scored per prompt
    assert tokens_to_score(runtime, short) <= scored(short)


def test_tokens_to_score_leaves_out_what_the_prefix_store_holds(engine):
    prompt = _prompts(1, 100, 0)[0]
    store = PrefixStore()
    prefill_prompts(engine.draft_runtime, [prompt[:50] + [3]], store=store)  # stores the first 50 tokens
    assert store.covered(prompt) == 50 >= MIN_SHARED
    assert tokens_to_score(engine.draft_runtime, [prompt], store) == 99 - 50


def test_saving_is_zero_where_no_plan_beats_plain_steps_and_positive_where_drafts_are_cheap():
    steep = Costs(0.1, 0.05, 0.05)  # every verified token costs half a forward
    assert decode_saving(0.5, steep, 4, 8) == 0.0
    assert decode_saving(0.9, FLAT, 4, 1) > 0.0


def test_a_call_drafts_only_when_its_budget_can_repay_the_drafts_prefill():
    policy = AutoPolicy(FLAT, max_len=4, prior=0.8)
    long_budget = SamplingParams(max_new_tokens=512, temperature=0)
    assert policy.drafts_call(30, 2, long_budget)
    assert not policy.drafts_call(2000, 2, GREEDY_2)
    assert AutoPolicy(FLAT, max_len=4, prior=0.8, prefill="free").drafts_call(2000, 2, GREEDY_2)


@pytest.mark.parametrize("mode", ["sd", "seed"])
def test_a_declined_call_decodes_without_the_draft_and_equals_the_target_alone(engine, caplog, mode):
    prompts = _prompts(3, 150, 0)
    policy = AutoPolicy(FLAT, max_len=4, prior=0.8)
    with caplog.at_level(logging.INFO, logger="seed_tot.engine.policies.auto"):
        results = engine.generate(prompts, GREEDY_2, mode=mode, draft_policy=policy)
    assert "decodes without its draft" in caplog.text
    assert [r.token_ids for r in results] == [reference_greedy(engine.target, p, 2) for p in prompts]
    assert sum(r.stats.draft_forwards + r.stats.draft_prefills for r in results) == 0


def test_a_call_that_repays_its_prefill_drafts_and_equals_the_target_alone(engine):
    prompts = [[5, 9, 2], [4, 4, 8, 1]]
    policy = AutoPolicy(FLAT, max_len=4, prior=0.8)
    results = engine.generate(prompts, GREEDY_40, mode="seed", draft_policy=policy)
    assert [r.token_ids for r in results] == [reference_greedy(engine.target, p, 40) for p in prompts]
    assert sum(r.stats.draft_forwards for r in results) > 0 and sum(r.stats.accepted for r in results) > 0


def test_one_policy_declines_one_call_while_another_call_drafts_beside_it(engine):
    declined, repaid = _prompts(3, 150, 0), [[5, 9, 2], [4, 4, 8, 1]]
    policy = AutoPolicy(FLAT, max_len=4, prior=0.8)

    async def both():
        return await asyncio.gather(engine.agenerate(declined, GREEDY_2, mode="seed", draft_policy=policy),
                                    engine.agenerate(repaid, GREEDY_40, mode="seed", draft_policy=policy))

    plain, drafted = asyncio.run(both())
    assert [r.token_ids for r in plain] == [reference_greedy(engine.target, p, 2) for p in declined]
    assert [r.token_ids for r in drafted] == [reference_greedy(engine.target, p, 40) for p in repaid]
    assert sum(r.stats.draft_prefills for r in plain) == 0 < sum(r.stats.draft_forwards for r in drafted)


def test_sd_prices_its_rows_alone_since_they_never_share_a_forward(engine):
    # flat to 2 query tokens, then steep: a row alone gains from one drafted token, rows together do not
    alone_gains = Costs(0.1, 0.0, 0.001, ((1, 0.1), (2, 0.1), (3, 0.15), (64, 3.2)), ((1, 0.001), (128, 0.128)))
    assert decode_saving(0.8, alone_gains, 4, 3) == 0.0 < decode_saving(0.8, alone_gains, 4, 1)
    prompts = _prompts(3, 20, 0)
    params = SamplingParams(max_new_tokens=8, temperature=0)
    for mode, drafts in (("sd", True), ("seed", False)):
        results = engine.generate(prompts, params, mode=mode, draft_policy=AutoPolicy(alone_gains, max_len=4, prior=0.8))
        assert [r.token_ids for r in results] == [reference_greedy(engine.target, p, 8) for p in prompts]
        assert (sum(r.stats.draft_prefills for r in results) > 0) == drafts, mode


def test_a_declined_sampled_call_samples_what_parallel_samples(engine):
    prompts = _prompts(4, 150, 100)
    params = SamplingParams(max_new_tokens=3, temperature=1.0, top_k=20, seed=5)
    declined = engine.generate(prompts, params, mode="seed", draft_policy=AutoPolicy(FLAT, max_len=4))
    plain = engine.generate(prompts, params, mode="parallel")
    assert sum(r.stats.draft_prefills for r in declined) == 0
    assert [r.token_ids for r in declined] == [r.token_ids for r in plain]


def test_an_unknown_prefill_setting_is_refused_before_any_model_loads():
    with pytest.raises(ValueError, match="prefill='sometimes' must be one of priced, free"):
        check_policy_options("auto", {"prefill": "sometimes"})


def test_declined_calls_probe_now_and_then_where_a_better_draft_could_repay_the_prefill():
    """A low estimate declines; a declined call observes nothing, so without probes it would decline forever."""
    policy = AutoPolicy(FLAT, max_len=4, prior=0.05, probe_every=2)
    budget = SamplingParams(max_new_tokens=64, temperature=0)
    assert decode_saving(0.05, FLAT, 4, 1) * 64 <= FLAT.draft(100) < decode_saving(1.0, FLAT, 4, 1) * 64
    decisions = [policy.drafts_call(100, 1, budget) for _ in range(14)]
    # probes after 2 declines, then 4, then 8: the gap doubles as long as the estimate stays low
    assert [i for i, d in enumerate(decisions) if d] == [1, 5, 13]


def test_no_call_probes_where_even_a_perfect_draft_could_not_repay_the_prefill():
    policy = AutoPolicy(FLAT, max_len=4, prior=0.05, probe_every=1)
    assert decode_saving(1.0, FLAT, 4, 1) * 2 <= FLAT.draft(2000)
    assert not any(policy.drafts_call(2000, 1, GREEDY_2) for _ in range(20))


def _row(index: int, greedy: bool = True):
    from types import SimpleNamespace
    params = SamplingParams(max_new_tokens=8, temperature=0 if greedy else 1.0)
    return SimpleNamespace(index=index, done=False, draft=None, pending=lambda draft: [1],
                           rule=SimpleNamespace(params=params))


# a forward whose cost steps with its query rows: 2 tokens cost twice 1, and 9 no more than 2
STEPPED = Costs(0.1, 0.0, 0.005, ((1, 0.1), (2, 0.2), (9, 0.2), (64, 0.8)), ((1, 0.005), (32, 0.05)))


def test_a_row_drafts_what_its_batch_plan_gives_even_where_alone_it_would_not():
    policy = AutoPolicy(STEPPED, max_len=2, prior=0.6)
    rows = [_row(i) for i in range(3)]
    assert policy.choose(_row(9)) == 0  # alone, a draft never pays on this forward
    policy.plan_batch(rows, 3)
    assert [policy.choose(r) for r in rows] == [2, 2, 2]  # 3 rows x 3 tokens: the cheap 9-token forward


def test_greedy_rows_start_from_what_earlier_sequences_saw_and_sampled_rows_from_the_prior():
    from seed_tot.engine.draft_tree import DraftTree
    from seed_tot.engine.verify import Acceptance
    import torch
    policy = AutoPolicy(FLAT, max_len=4, prior=0.5)
    earlier = _row(0)
    tree = DraftTree([-1, 0, 1, 2], [0] * 4, torch.empty(0, 4), q_index=[-1] * 4)
    for _ in range(10):  # every drafted token accepted
        policy.observe(earlier, tree, Acceptance([0, 1, 2, 3], [0] * 5, False))
    assert policy.call_alpha() > 0.9
    assert policy.alpha(_row(1, greedy=True)) > 0.9
    assert policy.alpha(_row(2, greedy=False)) == pytest.approx(0.5)
    # the same holds for a call's price: a sampled call is priced at the prior, never probed
    budget = SamplingParams(max_new_tokens=16, temperature=1.0)
    greedy_budget = SamplingParams(max_new_tokens=16, temperature=0)
    assert decode_saving(0.5, FLAT, 4, 2) * 32 <= FLAT.draft(20) < decode_saving(0.95, FLAT, 4, 2) * 32
    assert policy.drafts_call(20, 2, greedy_budget)
    assert not any(policy.drafts_call(20, 2, budget) for _ in range(20))


def test_a_call_is_priced_at_what_earlier_calls_of_its_kind_output_not_at_its_budget():
    policy = AutoPolicy(FLAT, max_len=4, prior=0.8)
    answer = SamplingParams(max_new_tokens=64, temperature=0, stop=("\n",))
    # at the whole budget drafting repays 100 prompt tokens; at 2 tokens per row it does not
    assert decode_saving(0.8, FLAT, 4, 2) * 2 * 2 <= FLAT.draft(100) < decode_saving(0.8, FLAT, 4, 2) * 2 * 64
    assert policy.drafts_call(100, 2, answer)
    policy.call_finished(answer, [2, 2])
    assert policy.expected_new_tokens(answer) == pytest.approx(2.0)
    assert not policy.drafts_call(100, 2, answer)
    # another kind of call (other stop strings, another budget) keeps its own budget
    assert policy.drafts_call(100, 2, SamplingParams(max_new_tokens=64, temperature=0))
    assert policy.drafts_call(100, 2, SamplingParams(max_new_tokens=63, temperature=0, stop=("\n",)))
    # later calls of the kind that run long move the estimate back up
    for _ in range(30):
        policy.call_finished(answer, [64, 64])
    assert policy.expected_new_tokens(answer) > 60 and policy.drafts_call(100, 2, answer)


def test_a_sampled_call_under_load_greedy_is_priced_at_its_budget_whatever_ran_before():
    policy = AutoPolicy(FLAT, max_len=4, prior=0.8)
    sampled = SamplingParams(max_new_tokens=64, temperature=1.0)
    policy.call_finished(sampled, [1, 1, 1])
    assert policy.expected_new_tokens(sampled, pooled=False) == 64
    assert policy.drafts_call(100, 2, sampled)


class _Recording(AutoPolicy):
    def call_finished(self, params, new_tokens, cost=None):
        self.finished = getattr(self, "finished", []) + [(params.max_new_tokens, new_tokens)]
        self.costs_seen = getattr(self, "costs_seen", []) + [cost]
        super().call_finished(params, new_tokens, cost)


def test_the_engine_reports_every_priced_call_s_output_lengths_and_decode_cost_drafted_or_declined(engine):
    policy = _Recording(FLAT, max_len=4, prior=0.8)
    declined = engine.generate(_prompts(3, 150, 0), GREEDY_2, mode="seed", draft_policy=policy)
    drafted = engine.generate([[5, 9, 2], [4, 4, 8, 1]], GREEDY_40, mode="seed", draft_policy=policy)
    assert sum(r.stats.draft_prefills for r in declined) == 0 < sum(r.stats.draft_prefills for r in drafted)
    assert policy.finished == [(2, [len(r.token_ids) for r in declined]), (40, [len(r.token_ids) for r in drafted])]
    # and what each decoded at: whether it ran the draft model, its new tokens, its seconds after the prefill
    assert [(c.drafted, c.new_tokens) for c in policy.costs_seen] == [
        (False, sum(len(r.token_ids) for r in declined)), (True, sum(len(r.token_ids) for r in drafted))]
    assert all(c.decode_s > 0 for c in policy.costs_seen)
