"""The calibration's loaded round (cost_model.py): a forward of LOADED_ROWS rows with long histories,
and the same with one row scoring more tokens. It is timed once per machine and cached; a round read
at it prices one row's draft by what it adds to that forward; `choose` prices the rows it plans alone
(ordinarily sampled ones) with it, so that a draft a one-row forward makes look free is declined where
the loaded round makes it dear, while its sample for a seed still depends on nothing beside it; and
greedy output stays the target's."""
from __future__ import annotations

import json
from dataclasses import asdict

import pytest
from conftest import reference_greedy, tiny_model

from seed_tot import Engine, SamplingParams
from seed_tot.engine.cost_model import LOADED_EXTRA, LOADED_ROWS, TIMING, Costs, LoadedRound, cache_key, load_costs
from seed_tot.engine.load_costs import AtLoad
from seed_tot.engine.policies.base import SAMPLED_ROWS
from seed_tot.engine.policies.choose import ChoosePolicy
from seed_tot.engine.policies.choose_pricing import best_option
from seed_tot.engine.policies.suffix import SuffixSource

ONE_ROW = ((1, 0.05), (8, 0.056), (16, 0.064), (64, 0.2))  # a one-row forward: a token adds 1 ms
# eight long-history rows: 80 ms; one row drafting adds 10 ms for its first token, 1 ms for each next
LOADED = ((0, 0.08), (1, 0.09), (2, 0.091), (4, 0.093), (8, 0.097))
DEAR = Costs(0.05, 0.0, 0.001, ONE_ROW, ((1, 0.001), (32, 0.002)), LOADED)


def test_a_loaded_round_is_timed_once_and_cached(tmp_path, monkeypatch, llama_pair):
    monkeypatch.setenv("SEED_TOT_CACHE_DIR", str(tmp_path))
    engine = Engine(*llama_pair)
    costs = load_costs(engine)
    entry = json.loads((tmp_path / "calibration.json").read_text())[cache_key(engine)]
    assert entry["timing"] == TIMING
    assert [n for n, _ in entry["loaded_points"]] == list(LOADED_EXTRA)
    assert all(seconds > 0 for _, seconds in entry["loaded_points"])
    assert costs.at_load(SAMPLED_ROWS).target(SAMPLED_ROWS) == pytest.approx(costs.loaded_points[0][1])
    assert load_costs(engine) == costs  # read back, not measured again


def test_an_entry_without_the_loaded_round_is_measured_again(tmp_path, monkeypatch, llama_pair):
    monkeypatch.setenv("SEED_TOT_CACHE_DIR", str(tmp_path))
    engine = Engine(*llama_pair)
    fresh = asdict(load_costs(engine))
    stale = {**fresh, "loaded_points": [], "draft_step_s": 9.0, "timing": "rounds"}  # the version before it
    (tmp_path / "calibration.json").write_text(json.dumps({cache_key(engine): stale}))
    again = load_costs(engine)
    assert again.draft_step_s != 9.0 and len(again.loaded_points) == len(LOADED_EXTRA)


def test_a_round_read_at_the_loaded_round_adds_what_one_rows_tokens_added():
    assert LOADED_ROWS == SAMPLED_ROWS  # the calibration times the round a sampled row is priced at
    view = DEAR.at_load(LOADED_ROWS)
    assert isinstance(view, LoadedRound) and view.draft(4) == DEAR.draft(4)
    assert view.target(8) == pytest.approx(0.08)
    assert [view.target(8 + n) for n in (1, 2, 3, 4, 8)] == pytest.approx([0.09, 0.091, 0.092, 0.093, 0.097])
    assert view.target(8 + 12) == pytest.approx(0.101)  # past the last size: the last segment's slope
    assert view.extra_token(8) == pytest.approx(0.01)
    half = DEAR.at_load(4)  # fewer rows: the plain round's share of them, the draft's addition as timed
    assert half.target(4) == pytest.approx(0.04) and half.target(5) == pytest.approx(0.05)
    assert Costs(0.05, 0.001, 0.001).at_load(8) == Costs(0.05, 0.001, 0.001)  # no loaded round: the costs
    noisy = Costs(0.05, 0.0, 0.001, ONE_ROW, (), ((0, 0.08), (1, 0.09), (2, 0.085), (4, 0.093)))
    assert noisy.loaded_points[1][1] == noisy.loaded_points[2][1]  # read through the monotone fit


def test_a_sampled_row_declines_a_draft_the_loaded_round_makes_dear():
    policy = ChoosePolicy(DEAR, SuffixSource(depth=8), max_len=3)
    sampled = SamplingParams(max_new_tokens=8, temperature=1.0, seed=1)
    greedy = SamplingParams(max_new_tokens=8, temperature=0)
    one_row = Costs(DEAR.target_fixed_s, DEAR.target_per_token_s, DEAR.draft_step_s, DEAR.target_points,
                    DEAR.draft_points)
    # at the one-row calibration a drafted token costs 1 ms against a row's 7 ms: a 0.4 draft pays
    assert best_option(0.0, 0.4, 3, one_row, 3, SAMPLED_ROWS, graft=True) != (0, 0)
    # at the loaded round its first token costs more than a row: declined
    assert isinstance(policy._costs(sampled, SAMPLED_ROWS), LoadedRound)
    assert best_option(0.0, 0.4, 3, policy._costs(sampled, SAMPLED_ROWS), 3, SAMPLED_ROWS, graft=True) == (0, 0)
    # a long suffix match that is nearly always right still pays there, at its whole length
    assert best_option(0.0, 0.95, 8, policy._costs(sampled, SAMPLED_ROWS), 3, SAMPLED_ROWS, graft=True) == (0, 8)
    # a greedy row is priced at the load measured in the run (load_costs.py), as before
    assert isinstance(policy._costs(greedy, SAMPLED_ROWS), AtLoad)
    calibrated = ChoosePolicy(DEAR, SuffixSource(depth=8), max_len=3, costs_at="calibrated")
    assert isinstance(calibrated._costs(greedy, SAMPLED_ROWS), LoadedRound)


@pytest.mark.parametrize("mode", ["seed", "sd"])
def test_choose_priced_at_a_loaded_round_gives_the_targets_greedy_output(mode):
    target = tiny_model("llama", seed=21)
    engine = Engine(target, tiny_model("llama", seed=5))
    # a cheap loaded round: some rounds draft, the others step plainly
    cheap = Costs(0.05, 0.0, 0.001, ONE_ROW, ((1, 0.001), (32, 0.002)), ((0, 0.08), (1, 0.081), (8, 0.084)))
    prompts = [[3, 17, 42, 8, 61, 5, 3, 17, 42, 8], [9, 1, 77], [5, 5, 5, 5, 2]]
    policy = ChoosePolicy(cheap, SuffixSource(depth=4, share="all"), max_len=3, costs_at="calibrated")
    params = SamplingParams(max_new_tokens=24, temperature=0, search_key="s", phase="thought")
    results = engine.generate(prompts, params, mode=mode, draft_policy=policy)
    assert [r.token_ids for r in results] == [reference_greedy(target, p, 24) for p in prompts]
    assert sum(r.stats.drafted for r in results) > 0  # the loaded round's prices let drafts through


def test_a_sampled_rows_tokens_for_a_seed_do_not_depend_on_the_rows_beside_it():
    """Priced at the calibration's loaded round (a constant), a sampled row's choices, so its draws,
    are the same alone and beside other rows."""
    target = tiny_model("llama", seed=21)
    engine = Engine(target, tiny_model("llama", seed=5))
    cheap = Costs(0.05, 0.0, 0.001, ONE_ROW, ((1, 0.001), (32, 0.002)), ((0, 0.08), (1, 0.081), (8, 0.084)))
    params = SamplingParams(max_new_tokens=24, temperature=1.0, seed=7, search_key="s", phase="thought")
    prompt = [3, 17, 42, 8, 61, 5, 3, 17, 42, 8]

    def run(prompts):
        policy = ChoosePolicy(cheap, SuffixSource(depth=4), max_len=3)
        return engine.generate(prompts, params, mode="seed", draft_policy=policy)

    alone = run([prompt])[0]
    beside = run([prompt, [9, 1, 77], [5, 5, 5, 5, 2]])[0]
    assert alone.token_ids == beside.token_ids
    assert alone.stats.drafted > 0
