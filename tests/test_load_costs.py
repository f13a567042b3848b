"""`choose` prices rounds with the costs measured at the run's load (load_costs.py): a decayed fit of
the verification forwards the scheduler reports, starting from the calibration. The fit follows
what it is shown and never makes more tokens cheaper; the choice it feeds declines a draft the
measured load makes dear, only for rows whose drafts cannot change their tokens; every forward is
reported once per policy; draft steps on the CPU are priced at their measured ratio to the
calibration; and greedy output stays the target's."""
from __future__ import annotations

from dataclasses import replace as dataclasses_replace

import pytest
from conftest import reference_greedy, tiny_model

from seed_tot import Engine, SamplingParams
from seed_tot.engine import seed as seed_module
from seed_tot.engine.cost_model import Costs
from seed_tot.engine.load_costs import COST_PRICING, LoadCosts
from seed_tot.engine.policies.base import choice_option
from seed_tot.engine.policies import check_policy_options
from seed_tot.engine.policies.choose import ChoosePolicy, SuffixOnly
from seed_tot.engine.policies.choose_pricing import best_option
from seed_tot.engine.policies.suffix import SuffixSource

CHEAP_TOKENS = Costs(0.06, 0.001, 0.001)  # the calibration: a drafted token costs 1/60 of a step
REPEATING = [3, 17, 42, 8, 61, 5, 3, 17, 42, 8]
PROMPTS = [REPEATING, [9, 1, 77], [5, 5, 5, 5, 2]]


def truth(rows: int, tokens: int) -> float:
    return 0.1 + 0.02 * tokens + 0.01 * rows


def test_before_any_forward_the_fit_is_the_calibration():
    costs = LoadCosts(CHEAP_TOKENS)
    for rows, tokens in ((1, 1), (6, 6), (6, 9), (20, 40)):
        assert costs.target(rows, tokens) == pytest.approx(CHEAP_TOKENS.target(tokens), rel=1e-6)
    assert costs.at(6).draft(4) == CHEAP_TOKENS.draft(4)


def test_the_fit_follows_the_measured_forwards():
    costs = LoadCosts(CHEAP_TOKENS)
    for i in range(200):
        rows = 1 + i % 9
        tokens = rows + (i * 7) % (2 * rows + 1)  # plain rounds and rounds with drafts
        costs.observe(rows, tokens, truth(rows, tokens))
    for rows, tokens in ((1, 1), (6, 6), (6, 12), (9, 27)):
        assert costs.target(rows, tokens) == pytest.approx(truth(rows, tokens), rel=0.02)
    view = costs.at(6)
    assert view.extra_token(6) == pytest.approx(0.02, rel=0.05)  # what a drafted token adds to a round


def test_a_change_of_load_is_followed():
    costs = LoadCosts(CHEAP_TOKENS)
    for i in range(100):
        rows = 2 + i % 5
        costs.observe(rows, rows + i % 3, 0.05)
    for i in range(150):
        rows = 2 + i % 5
        tokens = rows + i % 3
        costs.observe(rows, tokens, 2 * truth(rows, tokens))
    assert costs.target(4, 5) == pytest.approx(2 * truth(4, 5), rel=0.05)


def test_noise_never_makes_more_tokens_or_rows_cheaper():
    costs = LoadCosts(CHEAP_TOKENS)
    for i in range(100):
        tokens = 4 + i % 8
        costs.observe(4, tokens, 0.2 - 0.01 * tokens)  # a dip: more tokens timed faster
    assert costs.target(4, 12) >= costs.target(4, 4)
    assert costs.target(8, 8) >= costs.target(4, 8)
    costs.observe(0, 4, 1.0)  # refused: no rows
    costs.observe(4, 2, 1.0)  # refused: fewer tokens than rows
    costs.observe(4, 4, 0.0)  # refused: no time
    assert costs.forwards == 100


def test_a_bad_costs_option_is_refused_before_any_forward():
    assert choice_option("choose", "costs", "measured", COST_PRICING) == "measured"
    with pytest.raises(ValueError, match="option costs='timed' must be one of measured, calibrated"):
        check_policy_options("choose", {"costs": "timed"})


def test_choose_declines_a_draft_the_measured_load_makes_dear():
    policy = ChoosePolicy(CHEAP_TOKENS, SuffixSource(depth=4), max_len=3)
    greedy = SamplingParams(max_new_tokens=8, temperature=0)
    invariant = SamplingParams(max_new_tokens=8, temperature=1.0, seed=1, draft_invariant=True)
    sampled = SamplingParams(max_new_tokens=8, temperature=1.0, seed=1)
    # at the calibration, a suffix draft accepted at 0.4 a token pays in a round of 6 rows
    assert best_option(0.0, 0.4, 3, policy._costs(greedy, 6), 3, 6, graft=True) != (0, 0)
    for i in range(60):  # the run's forwards: a drafted token adds 0.7 of a plain row's share at 6 rows
        rows = 4 + i % 4
        tokens = rows + i % 5
        policy.observe_forward(rows, tokens, 0.05 + 0.02 * tokens)
    for params in (greedy, invariant):  # drafts cannot change these rows' tokens: the load prices them
        assert best_option(0.0, 0.4, 3, policy._costs(params, 6), 3, 6, graft=True) == (0, 0)
        assert best_option(0.0, 0.9, 3, policy._costs(params, 6), 3, 6, graft=True) != (0, 0)  # a sure one still pays
    # an ordinary sampled row keeps the calibration: the machine's speed must not steer its sample
    assert policy._costs(sampled, 6) is CHEAP_TOKENS
    assert best_option(0.0, 0.4, 3, policy._costs(sampled, 6), 3, 6, graft=True) != (0, 0)
    calibrated = ChoosePolicy(CHEAP_TOKENS, SuffixSource(depth=4), max_len=3, costs_at="calibrated")
    calibrated.observe_forward(6, 12, 5.0)
    assert calibrated.load_costs is None and calibrated._costs(greedy, 6) is CHEAP_TOKENS


@pytest.mark.parametrize("batch", [1, None])
def test_every_verification_forward_is_reported_once_and_greedy_output_is_the_targets(batch, monkeypatch):
    target = tiny_model("llama", seed=21)
    engine = Engine(target, tiny_model("llama", seed=5))
    policy = ChoosePolicy(CHEAP_TOKENS, SuffixSource(depth=4), max_len=3)  # costs measured (the default)
    assert SuffixOnly(policy).owner is policy  # a declined call's reports reach the policy it belongs to
    forwards = []
    score_rows = seed_module.score_rows
    monkeypatch.setattr(seed_module, "score_rows",
                        lambda runtime, jobs: forwards.append(len(jobs)) or score_rows(runtime, jobs))
    params = SamplingParams(max_new_tokens=24, temperature=0, search_key="s", phase="thought")
    for _ in range(2):
        results = engine.generate(PROMPTS, params, mode="seed", draft_batch=batch, verify_batch=batch,
                                  draft_policy=policy)
        assert [r.token_ids for r in results] == [reference_greedy(target, p, 24) for p in PROMPTS]
    assert policy.load_costs.forwards == len(forwards) > 0
    if batch is None:
        assert max(forwards) > 1  # batched rounds were reported with their rows


class _Row:
    def __init__(self, params):
        self.rule = type("Rule", (), {"params": params})()


def test_a_parallelspec_joint_cut_is_priced_at_the_measured_load_and_choose_shares_its_fit():
    """parallelspec's joint cut (rows whose drafts cannot change their tokens) reads the fit of the
    forwards it is told of; costs=calibrated keeps the calibration; inside choose the cut reads
    choose's own fit, which the scheduler reports to once (choose is the owner)."""
    from seed_tot.engine.drafters import ParallelDrafter
    from seed_tot.engine.policies.parallelspec import ParallelSpecPolicy
    drafter = ParallelDrafter(tiny_model("llama", seed=3), n_masks=3, n_layers=1).eval()
    greedy = SamplingParams(max_new_tokens=8, temperature=0)
    measured = ParallelSpecPolicy(drafter, (1,), depth=4, costs=CHEAP_TOKENS, load_costs=LoadCosts(CHEAP_TOKENS))
    calibrated = ParallelSpecPolicy(drafter, (1,), depth=4, costs=CHEAP_TOKENS)
    for i in range(60):  # a drafted token adds 0.7 of a plain row's share at 6 rows
        rows = 4 + i % 4
        tokens = rows + i % 5
        for policy in (measured, calibrated):
            policy.observe_forward(rows, tokens, 0.05 + 0.02 * tokens)
    chains = [[[(0, 5, None, p)] for p in (0.6, 0.5, 0.4, 0.3)] for _ in range(6)]
    kept = {}
    for name, policy in (("measured", measured), ("calibrated", calibrated)):
        rows = [_Row(greedy) for _ in range(6)]
        policy.plan_batch(rows, 6)
        cut = policy._joint[id(rows[0])]
        for row, chain in zip(rows, chains):  # what each row's drafter forward gave (p̂ per level)
            cut.levels[id(row)] = chain
        kept[name] = sorted(cut.kept(id(r)) for r in rows)
    assert kept["calibrated"] == [4] * 6  # the calibration: every level looks nearly free
    assert max(kept["measured"]) < 4  # the measured load: the unsure levels are cut
    choose = ChoosePolicy(CHEAP_TOKENS, SuffixSource(depth=4), max_len=3, model=ParallelSpecPolicy(
        drafter, (1,), depth=4, costs=CHEAP_TOKENS, load_costs=LoadCosts(CHEAP_TOKENS)))
    assert choose.model.load_costs is choose.load_costs  # one fit, fed once per forward through choose
    with pytest.raises(ValueError, match="option costs='timed' must be one of measured, calibrated"):
        check_policy_options("parallelspec", {"costs": "timed"})


def test_draft_steps_are_priced_at_their_measured_ratio_to_the_calibration():
    costs = LoadCosts(CHEAP_TOKENS)
    assert costs.draft_scale() == 1.0
    for i in range(200):
        entries = 1 + i % 12
        costs.observe_draft(entries, 2 * CHEAP_TOKENS.draft(entries))  # every step twice its calibrated price
    view = costs.at(6)
    assert view.draft(4) == pytest.approx(2 * CHEAP_TOKENS.draft(4), rel=0.1)  # held a little toward 1 by its prior
    assert view.draft_step_s / CHEAP_TOKENS.draft_step_s == pytest.approx(view.draft(4) / CHEAP_TOKENS.draft(4))
    costs.observe_draft(0, 5.0)  # nothing fed, or no time: not a forward
    costs.observe_draft(3, 0.0)
    assert costs.at(6).draft(4) == pytest.approx(view.draft(4))


@pytest.mark.parametrize("batch", [1, None])
def test_every_draft_forward_on_the_cpu_is_reported_once_and_greedy_output_is_the_targets(batch):
    from seed_tot.engine.policies.fixed import FixedPolicy

    class Recording(FixedPolicy):
        def __init__(self):
            super().__init__((1, 1))
            self.steps = []

        def observe_draft_forward(self, tokens, seconds):
            self.steps.append((tokens, seconds))

    target = tiny_model("llama", seed=21)
    policy = Recording()
    params = SamplingParams(max_new_tokens=16, temperature=0)
    results = Engine(target, tiny_model("llama", seed=5)).generate(PROMPTS, params, mode="seed", draft_batch=batch,
                                                                   verify_batch=batch, draft_policy=policy)
    assert [r.token_ids for r in results] == [reference_greedy(target, p, 16) for p in PROMPTS]
    assert len(policy.steps) == round(sum(r.stats.draft_forwards for r in results)) > 0
    assert all(tokens >= 1 and seconds > 0 for tokens, seconds in policy.steps)
    if batch is None:
        assert max(tokens for tokens, _ in policy.steps) > 1  # a batched step reports every row's entries
    choose = ChoosePolicy(CHEAP_TOKENS, SuffixSource(depth=4), max_len=3, prefill="free")
    Engine(target, tiny_model("llama", seed=5)).generate(PROMPTS, dataclasses_replace(params, phase="thought"),
                                                         mode="seed", draft_policy=choose)
    assert choose.load_costs._draft_priced > 0  # choose's fit was told of its draft forwards
