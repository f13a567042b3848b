"""A first solve on a machine calibrates the costs of a policy that prices with them (auto; choose,
seed's CPU default) before the first problem's clock starts, and says so (INFO log, -v); a run that finds them cached says nothing."""
from __future__ import annotations

import logging

import pytest
from click.testing import CliRunner

from seed_tot.cli import main


def _solve(tmp_path, tiny_model_dirs, name: str, policy: str) -> None:
    target, draft = tiny_model_dirs
    result = CliRunner().invoke(main, [
        "solve", "gsm8k", "--data", "tests/fixtures/gsm8k_small.jsonl", "--limit", "1", "--mode", "seed",
        "--draft-policy", policy, "--target", target, "--draft", draft, "--temperature", "0",
        "--max-new-tokens", "6", "--depth", "1", "--output", str(tmp_path / name)], catch_exceptions=False)
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("policy", ["auto", "choose"])
def test_the_first_solve_calibrates_before_its_first_problem_and_says_so(tmp_path, tiny_model_dirs, monkeypatch,
                                                                         caplog, policy):
    from seed_tot.engine import cost_model
    from seed_tot.search import solve as solve_module

    monkeypatch.setenv("SEED_TOT_CACHE_DIR", str(tmp_path / "cache"))  # a machine that never calibrated
    events: list[str] = []
    measure, solve_example = cost_model.measure, solve_module.solve_example  # measure: the timing load_costs runs
    monkeypatch.setattr(cost_model, "measure", lambda *a, **k: events.append("calibrate") or measure(*a, **k))
    monkeypatch.setattr(solve_module, "solve_example",
                        lambda *a, **k: events.append("problem") or solve_example(*a, **k))
    caplog.set_level(logging.INFO, logger="seed_tot")
    _solve(tmp_path, tiny_model_dirs, "first", policy)
    assert events == ["calibrate", "problem"]  # the problem's clock starts after the calibration ended
    said = [r.getMessage() for r in caplog.records if r.name == "seed_tot.engine.policy_warmup"]
    assert len(said) == 2 and said[0].startswith(f"calibrating: the {policy} policy times this machine's") and \
        said[1].startswith(f"calibrated for the {policy} policy in") and "recalibrate=true" in said[1], said

    events.clear()
    caplog.clear()
    _solve(tmp_path, tiny_model_dirs, "second", policy)  # cached now: no calibration, no word of it
    assert events == ["problem"]
    assert not [r for r in caplog.records if r.name == "seed_tot.engine.policy_warmup"]
