"""solve ends with a few lines for a person (JSON only with --json, always in summary.json), and
score says what it counted."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from scripted_engine import ScriptedEngine

import seed_tot.cli
from seed_tot.cli import main
from seed_tot.search.solve import describe_summary

FIXTURES = Path(__file__).parent / "fixtures"
SUMMARY = {"task": "gsm8k", "n": 4, "accuracy": 0.75, "mean_wall_s": 2.5, "tokens_per_s": 12.25, "mode": "seed",
           "acceptance_rate": 0.4321}


def test_the_summary_names_task_problems_result_speed_acceptance_and_files(tmp_path):
    text = describe_summary(SUMMARY, tmp_path, wall_s=10.04)
    assert text.splitlines()[0] == "gsm8k: 4 problems, accuracy 0.750 (3/4)"
    assert "wall 10.0 s" in text and "12.2 tokens/s" in text and "acceptance 0.432" in text
    assert f"results {tmp_path / 'results.jsonl'}" in text and f"summary {tmp_path / 'summary.json'}" in text
    assert "tree" not in text
    (tmp_path / "tree.html").write_text("<html></html>")
    assert f"tree {tmp_path / 'tree.html'}" in describe_summary(SUMMARY, tmp_path)


def test_after_a_resume_the_wall_time_and_the_per_problem_figures_each_say_what_they_cover(tmp_path):
    text = describe_summary({**SUMMARY, "solved_this_run": 1}, tmp_path, wall_s=3.0)
    assert text.splitlines()[1] == ("this run: wall 3.0 s for 1 problem, 3 solved before it; all 4 problems: "
                                    "2.5 s per problem, 12.2 tokens/s, mode seed, acceptance 0.432")


def test_a_run_that_solved_every_problem_keeps_the_short_speed_line(tmp_path):
    text = describe_summary({**SUMMARY, "solved_this_run": 4}, tmp_path, wall_s=10.04)
    assert text.splitlines()[1] == "wall 10.0 s, 2.5 s per problem, 12.2 tokens/s, mode seed, acceptance 0.432"


def test_a_mode_without_a_draft_reports_no_acceptance(tmp_path):
    assert "acceptance" not in describe_summary({**SUMMARY, "mode": "ar"}, tmp_path)


@pytest.fixture
def scripted_models(monkeypatch):
    monkeypatch.setattr(seed_tot.cli, "load_engine", lambda *a, **k: ScriptedEngine(lambda user, copy: "7"))


def _solve(out: Path, *extra: str) -> str:
    result = CliRunner().invoke(main, ["solve", "gsm8k", "--data", str(FIXTURES / "gsm8k_small.jsonl"), "--limit", "2",
                                       "--output", str(out), *extra])
    assert result.exit_code == 0, result.output
    return result.stdout


def test_solve_ends_with_lines_for_a_person_and_keeps_the_json_in_summary_json(tmp_path, scripted_models):
    out = _solve(tmp_path / "run")
    assert out.startswith("gsm8k: 2 problems, accuracy ") and len(out.splitlines()) == 3
    assert str(tmp_path / "run" / "results.jsonl") in out and "{" not in out
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["n"] == 2


def test_a_resumed_solve_says_its_wall_time_covers_only_the_problems_it_solved(tmp_path, scripted_models):
    run = tmp_path / "run"
    CliRunner().invoke(main, ["solve", "gsm8k", "--data", str(FIXTURES / "gsm8k_small.jsonl"), "--limit", "1",
                              "--output", str(run)])
    speed = _solve(run, "--resume").splitlines()[1]
    assert speed.startswith("this run: wall ") and " s for 1 problem, 1 solved before it; all 2 problems: " in speed
    assert json.loads((run / "summary.json").read_text())["solved_this_run"] == 1


def test_solve_json_prints_the_summary_numbers(tmp_path, scripted_models):
    out = json.loads(_solve(tmp_path / "run", "--json"))
    assert out["n"] == 2 and "settings" not in out


def test_score_says_the_records_without_a_prediction_are_not_counted(tmp_path):
    data = FIXTURES / "gsm8k_small.jsonl"
    first = json.loads(data.read_text().splitlines()[0])
    preds = tmp_path / "p.jsonl"
    preds.write_text(json.dumps({"id": "0", "prediction": first["answer"].split("####")[-1].strip()}) + "\n")
    result = CliRunner().invoke(main, ["score", "gsm8k", "--data", str(data), "--predictions", str(preds)])
    assert result.exit_code == 0, result.output
    total = len(data.read_text().splitlines())
    assert result.stdout.splitlines() == [
        "gsm8k: 1 prediction scored: correct 1, accuracy 1.000",
        f"{total - 1} of the {total} records in the data have no prediction (not counted above)"]


def test_a_resume_with_nothing_left_says_so_in_plain_words():
    summary = {"task": "gsm8k", "n": 1, "solved_this_run": 0, "mean_wall_s": 2.0, "tokens_per_s": 5.0, "mode": "ar"}
    speed = describe_summary(summary, "runs/x", wall_s=0.0).splitlines()[1]
    assert speed == "this run: nothing left to solve; the 1 problem: 2.0 s per problem, 5.0 tokens/s, mode ar"
