"""`choose` prices the draft model's prefill per call, as `auto` does: a call whose prompts cost the
draft more to score than the model's chains could save drafts from the suffix source alone (no draft
cache, no draft prefill, no draft forward), and its output is still the target's: greedy tokens
equal the target alone's, sampled ones follow its distribution and, keyed, equal `ar`'s. Where the
suffix source already offers chains in a phase, the model is priced at what it adds beside them."""
from __future__ import annotations

import dataclasses
import logging

import pytest

from conftest import noisy_copy, reference_greedy, tiny_model
from test_sampling_lossless import SETTINGS, assert_policy_samples_follow_the_target
from seed_tot import Engine, SamplingParams
from seed_tot.engine import summarize
from seed_tot.engine.cost_model import Costs
from seed_tot.engine.policies import check_policy_options
from seed_tot.engine.policies.call_pricing import CallCost, call_kind
from seed_tot.engine.policies.choose import FALLBACK, ChoosePolicy, SuffixOnly
from seed_tot.engine.policies.choose_pricing import Coverage, Estimate, option_saving
from seed_tot.engine.policies.suffix import SuffixSource

# a GPU-like target (flat to 16 query tokens) and a draft whose prompt tokens cost about 10 ms each
PRICED = Costs(0.05, 0.0, 0.005, ((1, 0.05), (16, 0.05), (64, 0.2)), ((1, 0.005), (32, 0.3), (128, 1.26)))
# a draft whose every forward past one token costs a minute: no call can repay its prefill
DEAR_PREFILL = Costs(0.05, 0.0, 0.005, ((1, 0.05), (16, 0.05), (64, 0.2)), ((1, 0.005), (2, 60.0)))
REPEATING = [3, 17, 42, 8, 61, 5]
LONG = [REPEATING * 25, [9, 1] + REPEATING * 24, [5, 5] + REPEATING * 24]  # 150-token prompts that repeat
THOUGHT_12 = SamplingParams(max_new_tokens=12, temperature=0, search_key="s", phase="thought")


@pytest.fixture(scope="module")
def pair():
    target = tiny_model("llama", seed=3)
    return target, noisy_copy(target, 0.005)


def _policy(costs: Costs, **options) -> ChoosePolicy:
    return ChoosePolicy(costs, SuffixSource(depth=4), max_len=3, **options, costs_at="calibrated")


def test_a_call_keeps_the_model_only_where_its_chains_can_repay_the_prefill():
    policy = _policy(PRICED)
    assert policy.drafts_call(30, 2, SamplingParams(max_new_tokens=512, temperature=0))
    assert not policy.drafts_call(3 * 149, 3, THOUGHT_12)
    assert isinstance(policy.declined(), SuffixOnly) and not policy.declined().uses_draft_model
    assert _policy(PRICED, prefill="free").drafts_call(3 * 149, 3, THOUGHT_12)


@pytest.mark.parametrize("mode,batch", [("sd", 1), ("seed", None)])
def test_a_declined_call_drafts_from_the_suffix_alone_and_equals_the_target_alone(pair, caplog, mode, batch):
    target, draft = pair
    engine, policy = Engine(target, draft), _policy(PRICED)
    with caplog.at_level(logging.INFO, logger="seed_tot.engine.policies.choose"):
        calls = [engine.generate(LONG, THOUGHT_12, mode=mode, draft_batch=batch, verify_batch=batch,
                                 draft_policy=policy) for _ in range(2)]  # the second drafts from the first's text
    assert "drafts from the suffix source alone" in caplog.text
    for results in calls:
        assert [r.token_ids for r in results] == [reference_greedy(target, p, 12) for p in LONG]
    total = summarize([r for results in calls for r in results])
    assert total.draft_prefills == total.draft_forwards == 0
    assert total.drafted > 0 and total.accepted > 0  # the suffix source drafted, and the target took some


def test_a_call_that_repays_the_prefill_runs_the_model_and_equals_the_target_alone(pair):
    target, draft = pair
    prompts = [[5, 9, 2], [4, 4, 8, 1]]
    params = SamplingParams(max_new_tokens=40, temperature=0, phase="thought")
    results = Engine(target, draft).generate(prompts, params, mode="seed", draft_policy=_policy(PRICED))
    assert [r.token_ids for r in results] == [reference_greedy(target, p, 40) for p in prompts]
    assert sum(r.stats.draft_prefills for r in results) > 0 and sum(r.stats.draft_forwards for r in results) > 0


def test_a_declined_sampled_call_follows_the_target_distribution(monkeypatch):
    import test_sampling_lossless as fixture

    monkeypatch.setattr(fixture, "PROMPT", [1, 4, 2, 4, 1, 4, 2])
    target = tiny_model("llama", seed=21, vocab=fixture.VOCAB)
    policy = ChoosePolicy(DEAR_PREFILL, SuffixSource(depth=2, factor=2, share="all"), max_len=2, costs_at="calibrated")
    results = assert_policy_samples_follow_the_target(target, noisy_copy(target, 0.6, seed=22), policy,
                                                      "temperature", "seed", (1, 1), None)
    assert sum(r.stats.draft_prefills + r.stats.draft_forwards for r in results) == 0


def test_a_declined_keyed_sample_is_the_one_ar_writes(pair):
    target, draft = pair
    params = dataclasses.replace(SETTINGS["temperature"], max_new_tokens=12, seed=11, search_key="k",
                                 draft_invariant=True)
    reference = [r.token_ids for r in Engine(target).generate(LONG, params, mode="ar")]
    results = Engine(target, draft).generate(LONG, params, mode="seed", draft_policy=_policy(DEAR_PREFILL))
    assert [r.token_ids for r in results] == reference
    assert sum(r.stats.draft_prefills for r in results) == 0


def test_an_unknown_prefill_setting_is_refused_before_any_model_loads():
    with pytest.raises(ValueError, match="prefill='sometimes' must be one of priced, free"):
        check_policy_options("choose", {"prefill": "sometimes"})


def _covered(policy: ChoosePolicy, phase: str, share_rounds: int, length: int, acceptance: float,
             kind: str = "suffix") -> None:
    """The phase's pooled rows saw a suffix chain of `length` and `kind` in every round of `share_rounds`,
    and the target took `acceptance` of its tokens."""
    for _ in range(share_rounds):
        policy._coverage.setdefault(phase, Coverage()).add(kind, length, 0.99)
        policy._phases.setdefault((phase, kind), Estimate()).add(round(acceptance * length), length, 0.9)


def test_a_sure_suffix_chain_leaves_the_model_little_to_add():
    alone = option_saving(0.5, 0.9, 6, PRICED, 0, 2, graft=True)  # the suffix chain alone, no draft step
    both = option_saving(0.5, 0.9, 6, PRICED, 3, 2, graft=True)
    assert alone > 0 and both - alone < 0.1 * alone
    assert option_saving(0.5, 0.0, 0, PRICED, 3, 2, graft=True) > 0 == option_saving(0.5, 0.0, 0, PRICED, 0, 2,
                                                                                      graft=True)


def test_where_the_suffix_source_covers_a_phase_the_model_is_priced_at_what_it_adds_beside_it():
    policy, greedy = _policy(PRICED), SamplingParams(max_new_tokens=64, temperature=0, phase="thought")
    sampled = dataclasses.replace(greedy, temperature=1.0, seed=3)
    assert policy.drafts_call(30, 2, greedy) and policy.drafts_call(30, 2, sampled)
    _covered(policy, "thought", 100, 6, 0.9)
    assert not policy.drafts_call(30, 2, greedy)  # the suffix chains draft for free what the model would
    assert policy.drafts_call(30, 2, dataclasses.replace(greedy, phase="value"))  # another phase: not covered
    # a sampled row must not read other rows: its call is priced as before, whatever the phase's text gave
    assert policy.drafts_call(30, 2, sampled)


def test_rounds_covered_by_one_token_fallback_chains_are_priced_at_the_fallbacks_own_acceptance():
    """Longer matches are right 0.9 of the time, but every covered round offered a fallback chain the
    target never took: those rounds are priced at the fallback's acceptance, so the model still pays
    its prefill. Once longer matches cover the phase as well, the model is declined."""
    policy, greedy = _policy(PRICED), SamplingParams(max_new_tokens=64, temperature=0, phase="thought")
    policy._phases.setdefault(("thought", "suffix"), Estimate()).add(90, 100, 0.9)
    _covered(policy, "thought", 100, 6, 0.0, kind=FALLBACK)
    for _ in range(200):  # a long record of wrong fallback guesses, not a decayed one
        policy._phases["thought", FALLBACK].add(0, 6, 1.0)
    cover = policy._coverage["thought"]
    assert cover.kinds() == [FALLBACK] and cover.share(FALLBACK) > 0.6 and cover.share("suffix") == 0
    assert policy.drafts_call(30, 2, greedy)
    _covered(policy, "thought", 300, 6, 0.9)  # now the longer matches offer a chain in most rounds
    assert cover.share("suffix") > 0.9 and cover.length("suffix") == 6
    assert not policy.drafts_call(30, 2, greedy)


def test_calls_declined_once_the_suffix_source_covers_them_equal_the_target_alone(pair):
    """Repeated calls of one phase: the first ones score their prompts through the draft; once the
    suffix source offers chains in most rounds the later ones do not, and every call's tokens are the
    target's."""
    target, draft = pair
    engine, policy = Engine(target, draft), _policy(PRICED)
    prompts, params = [[5, 9, 2] * 5, [4, 4, 8, 1] * 5], SamplingParams(max_new_tokens=60, temperature=0,
                                                                        phase="thought", search_key="s")
    prefills = []
    for _ in range(7):
        results = engine.generate(prompts, params, mode="seed", draft_policy=policy)
        assert [r.token_ids for r in results] == [reference_greedy(target, p, 60) for p in prompts]
        prefills.append(sum(r.stats.draft_prefills for r in results))
    assert prefills[0] > 0 and prefills[-1] == 0


def _spent(policy: ChoosePolicy, params: SamplingParams, model_s: float, text_s: float) -> None:
    """One finished call of each group, 100 new tokens each, at these decode seconds."""
    policy.call_finished(params, [50, 50], CallCost(True, 100, model_s))
    policy.call_finished(params, [50, 50], CallCost(False, 100, text_s))


def test_a_kind_of_greedy_call_whose_model_calls_cost_more_per_token_than_its_text_calls_declines_the_model():
    """The rounds' price says the model pays (a cheap draft, a long budget); the calls of that kind that
    ran it took 0.1 s per new token where those without it took 0.05 s, so the next call drafts from
    the suffix source alone. A sampled call (under load=greedy) must not read wall-clock seconds:
    it keeps the rounds' price."""
    greedy = SamplingParams(max_new_tokens=512, temperature=0, phase="thought", search_key="s")
    sampled = dataclasses.replace(greedy, temperature=1.0, seed=3)
    policy = _policy(PRICED)
    assert policy.drafts_call(30, 2, greedy)
    _spent(policy, greedy, model_s=10.0, text_s=5.0)
    assert policy.ledger.saving(greedy) == pytest.approx(-0.05)
    assert not policy.drafts_call(30, 2, greedy)
    assert policy.drafts_call(30, 2, sampled)
    _spent(policy, sampled, model_s=10.0, text_s=5.0)  # not kept: its calls' seconds may not steer a sample
    assert policy.drafts_call(30, 2, sampled)
    other = _policy(PRICED)  # the same kind of call where the model's calls were the faster: it drafts
    _spent(other, greedy, model_s=5.0, text_s=10.0)
    assert other.ledger.saving(greedy) == pytest.approx(0.05) and other.drafts_call(30, 2, greedy)


def test_a_kind_whose_calls_all_run_the_model_lends_the_4th_12th_and_28th_to_the_suffix_source():
    greedy = SamplingParams(max_new_tokens=512, temperature=0, phase="thought", search_key="s")
    policy = _policy(PRICED)
    declined = [i for i in range(1, 41) if not policy.drafts_call(30, 2, greedy)]
    assert declined == [4, 12, 28]
    sampled = dataclasses.replace(greedy, temperature=1.0, seed=3)  # its call must depend on nothing before it
    assert all(policy.drafts_call(30, 2, sampled) for _ in range(40))


def test_calls_lent_to_the_suffix_source_equal_the_target_alone_and_report_what_they_cost(pair):
    """The engine reports each finished call's decode cost, with or without the model, to the ledger;
    the 4th call runs without the draft model (no draft prefill) and every call's tokens are the
    target's."""
    target, draft = pair
    engine, policy = Engine(target, draft), _policy(PRICED)
    prompts = [[5, 9, 2], [4, 4, 8, 1]]
    params = SamplingParams(max_new_tokens=40, temperature=0, phase="thought", search_key="s")
    prefills = []
    for _ in range(4):
        results = engine.generate(prompts, params, mode="seed", draft_policy=policy)
        assert [r.token_ids for r in results] == [reference_greedy(target, p, 40) for p in prompts]
        prefills.append(sum(r.stats.draft_prefills for r in results))
    assert all(prefills[:3]) and prefills[3] == 0
    assert policy.ledger.saving(params) is not None  # both groups finished calls
    model, text = (policy.ledger.spent[call_kind(params), drafted] for drafted in (True, False))
    assert model[2] == 3 and text[2] == 1 and text[0] == sum(len(r.token_ids) for r in results) and text[1] > 0



# a target round that costs a lone row 1.0 s and twelve rows 1.1 s, past which each verified token adds
# 0.094 s (a CPU's compute-bound forward); a draft no call can repay the prefill of
ROUND_OF_12 = Costs(1.0, 0.0, 0.005, ((1, 1.0), (12, 1.1), (64, 6.0)), ((1, 0.005), (2, 60.0)))


def _drafted_share(engine, prompts: list[list[int]]) -> float:
    """The share of rounds a declined call's rows drafted in, its tokens checked against the target's."""
    policy, params = _policy(ROUND_OF_12), dataclasses.replace(THOUGHT_12, max_new_tokens=40)
    results = engine.generate(prompts, params, mode="seed", draft_policy=policy)
    assert [r.token_ids for r in results] == [reference_greedy(engine.target, p, 40) for p in prompts]
    assert sum(r.stats.draft_prefills for r in results) == 0  # declined: the suffix source alone
    rounds = [rec["drafted"] for rec in policy.records]
    return sum(d > 0 for d in rounds) / len(rounds)


def test_a_declined_calls_rows_are_priced_at_the_forward_they_share(pair):
    """A row alone pays 0.009 s a drafted token for a step of 1.0 s, so its suffix chains pay; twelve
    rows sharing a 1.1 s step pay 0.094 s a drafted token, more than a plain step's 0.092 s a token,
    so only the probes draft. The suffix source drafts a row as soon as it is verified, on its own:
    priced at that one row (as before 2026-12-02), the twelve drafted more often than the row alone."""
    target, draft = pair
    engine = Engine(target, draft)
    prompts = [[k] + REPEATING * 8 for k in range(12)]
    alone, crowd = _drafted_share(engine, prompts[:1]), _drafted_share(engine, prompts)
    assert alone > 0.3 and crowd < alone / 3
