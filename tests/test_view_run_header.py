"""The page's run header says what ran: an interrupted run (no summary.json) is described from
run.json, a mode that drafts nothing shows no draft policy or k_config, a drafting run names the
policy the engine resolved (never "default"), and a one-problem page opens its problem."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from view_runs import rewrite, solve_run

from seed_tot.cli import main
from seed_tot.engine.policies import POLICIES
from seed_tot.view.browser import headless_chromium, missing_reason, open_page
from seed_tot.view.page import write_page
from seed_tot.view.page_data import build_page_data, load_run

FIXTURES = "tests/fixtures"
CONFIG = ("task", "algorithm", "mode", "target", "draft", "policy", "policy_options", "k_config", "temperature",
          "depth", "n_generate", "breadth")


def _solve(tmp_path, models, mode, name):
    target, draft = models
    out = tmp_path / name
    result = CliRunner().invoke(main, ["solve", "gsm8k", "--data", f"{FIXTURES}/gsm8k_small.jsonl", "--limit", "1",
                                       "--mode", mode, "--target", target, "--draft", draft, "--temperature", "0",
                                       "--max-new-tokens", "8", "--output", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return out


def _header(directory):
    return build_page_data([load_run(directory)])["runs"][0]


def test_an_interrupted_runs_header_reads_run_json_and_names_the_policy_that_ran(tmp_path, tiny_model_dirs):
    out = _solve(tmp_path, tiny_model_dirs, "seed", "seed")
    finished = _header(out)
    assert finished["policy"] in POLICIES and finished["policy"] == json.loads((out / "run.json").read_text())["policy"]
    (out / "summary.json").unlink()  # as a Ctrl-C leaves it
    interrupted = _header(out)
    assert {k: interrupted[k] for k in CONFIG} == {k: finished[k] for k in CONFIG}
    assert interrupted["target"] == tiny_model_dirs[0] and interrupted["mode"] == "seed"
    assert not any("not recorded" in note for note in interrupted["notes"])
    assert any("run.json" in note for note in interrupted["notes"])


def test_a_mode_that_drafts_nothing_shows_no_policy_or_k_config(tmp_path, tiny_model_dirs):
    for mode in ("ar", "parallel"):
        header = _header(_solve(tmp_path, tiny_model_dirs, mode, mode))
        assert header["mode"] == mode
        for key in ("policy", "k_config", "policy_options"):
            assert str(header[key]).startswith("none"), (mode, key, header[key])


def test_a_drafting_run_without_a_recorded_policy_names_the_default_it_resolves_to(tmp_path):
    """Runs written before the policy was recorded: sd's default is fixed on every device."""
    run = solve_run(tmp_path / "run")
    summary = json.loads((run / "summary.json").read_text())
    summary.pop("policy", None)
    summary["mode"] = summary["settings"]["mode"] = "sd"
    (run / "summary.json").write_text(json.dumps(summary))
    assert _header(run)["policy"] == "fixed"


@pytest.mark.skipif(missing_reason() is not None, reason=f"no headless browser: {missing_reason()}")
def test_a_one_problem_page_opens_its_problem(tmp_path):
    run = solve_run(tmp_path / "run")
    rewrite(run, lambda rows: rows.__delitem__(slice(1, None)))
    page = write_page([run], tmp_path / "page.html")
    with headless_chromium() as driver:
        open_page(driver, page)
        assert driver.find_elements("css selector", "li.node")  # the tree is drawn without a click
