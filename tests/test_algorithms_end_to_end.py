"""Every algorithm on real parts: greedy records identical across ar, parallel and seed on tiny
models, and the custom-task guide's Game of 24 (examples/game24.py) under each algorithm."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from scripted_engine import ScriptedEngine
from short_task import ShortTask
from test_game24_example import STEPS, VERDICTS, game24  # noqa: F401 -- game24 is the module fixture

from seed_tot.engine import Engine
from seed_tot.search import apply_overrides, load_settings, solve_dataset

ALGORITHMS = ("bfs", "dfs", "cot", "cot-sc", "mcts")
OPTIONS = {"samples": 3, "iterations": 3, "parallel_leaves": 2, "max_expansions": 3}


@pytest.fixture(scope="module")
def engine(tiny_model_dirs):
    target, draft = tiny_model_dirs
    return Engine.from_pretrained(target=target, draft=draft, device="cpu")


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_greedy_records_are_identical_across_ar_parallel_seed_and_concurrency(engine, tmp_path: Path, algorithm: str):
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"question": q, "answer": "1"}) + "\n" for q in ("apples", "pens")))
    task = ShortTask()
    trees = {}
    for mode, concurrency in (("ar", 1), ("parallel", 1), ("seed", 1), ("seed", 2)):
        settings = apply_overrides(load_settings(None, base=task.config), mode=mode, temperature=0.0,
                                   algorithm=algorithm, **OPTIONS)
        out = tmp_path / f"{mode}-{concurrency}"
        summary = solve_dataset(engine, task, task.load(str(data)), settings=settings, output_dir=out,
                                concurrency=concurrency)
        records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
        trees[out.name] = {r["id"]: (r["prediction"], r["steps"], r["best_state"]) for r in records}
        assert summary["algorithm"] == algorithm and summary["mean_new_tokens"] > 0
    assert trees["parallel-1"] == trees["ar-1"] and trees["seed-1"] == trees["ar-1"]
    assert trees["seed-2"] == trees["ar-1"]  # two problems searched at once on the one engine
    assert all(steps for _, steps, _ in trees["ar-1"].values())


def respond(user: str, copy: int) -> str:
    """The guide test's script, with a move and a verdict for the states only other searches reach."""
    if user.rstrip().endswith("Next step:"):
        numbers = re.findall(r"Input: (.*)", user)[-1]
        return STEPS.get(numbers, ["1 + 1 = 3 (left: 3)"] * 3)[copy]  # illegal: valued 0 without the model
    if "sure, likely or impossible" in user:
        return VERDICTS.get(re.findall(r"Numbers: (.*)", user)[-1], "impossible")
    if "Steps:" in user:
        return " (6 - 4) * (4 + 8) = 24"
    raise AssertionError(f"unexpected prompt {user!r}")


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_the_game24_custom_task_runs_under_each_algorithm(game24, tmp_path: Path, algorithm: str):  # noqa: F811
    task = game24.Game24()
    settings = apply_overrides(load_settings(None, base=task.config), algorithm=algorithm,
                               iterations=6, parallel_leaves=2, samples=3)
    engine = ScriptedEngine(respond)
    summary = solve_dataset(engine, task, task.load(limit=1), settings=settings, output_dir=tmp_path)
    record = json.loads((tmp_path / "results.jsonl").read_text())
    assert summary["n"] == 1 and summary["accuracy"] == 1.0 and record["steps"]
    assert record["cost"]["engine_calls"] == len(engine.calls)
    if algorithm == "mcts":  # the search reached 24 along the scripted "sure" path
        assert record["best_state"][-1] == "2 * 12 = 24 (left: 24)"


def test_seed_tot_view_draws_mcts_and_cot_sc_trees_in_a_browser(tmp_path: Path):
    """The page opens both runs' problem without script errors and shows MCTS's visits, mean reward
    and expansion order on the nodes, and CoT-SC's chains with their predictions and the vote."""
    from click.testing import CliRunner
    from test_algorithms import solve

    from seed_tot.cli import main
    from seed_tot.view.browser import console_errors, headless_chromium, missing_reason, open_page

    if missing_reason() is not None:
        pytest.skip(f"no headless browser: {missing_reason()}")
    solve(tmp_path / "mcts", "mcts", iterations=3, parallel_leaves=2)
    solve(tmp_path / "cot-sc", "cot-sc", samples=3)
    page = tmp_path / "page.html"
    result = CliRunner().invoke(main, ["view", str(tmp_path / "mcts"), str(tmp_path / "cot-sc"), "-o", str(page)])
    assert result.exit_code == 0, result.output
    with headless_chromium() as driver:
        open_page(driver, page, "#e1")
        mcts_col, cot_col = driver.find_elements("css selector", ".tree-col")
        badges = [b.text for b in mcts_col.find_elements("css selector", "li.node > .head .badge")]
        assert any(b.startswith("N 2 Q ") for b in badges) and "#2 expanded" in badges
        assert 'Vote: "b/b2" 3' in cot_col.text
        assert len([b for b in cot_col.find_elements("css selector", ".badge") if b.text == "→ b/b2"]) == 3
        assert console_errors(driver) == []


def test_the_command_line_runs_each_algorithm_and_compares_the_runs(tmp_path: Path, tiny_model_dirs):
    """What the benchmark note's commands do, on tiny models: solve under each algorithm (with
    --resume of a finished run), then one `seed-tot compare` table with a row per run."""
    from click.testing import CliRunner

    from seed_tot.cli import main
    target, draft = tiny_model_dirs
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"question": "apples", "answer": "1"}) + "\n")
    task = f"{Path(__file__).resolve().parent / 'short_task.py'}:ShortTask"
    flags = {"cot": [], "cot-sc": ["--samples", "3"], "bfs": [], "dfs": [],
             "mcts": ["--iterations", "3", "--parallel-leaves", "2", "--exploration", "1.4", "--mcts-answer", "value"]}
    runs = []
    for algorithm, extra in flags.items():
        out = str(tmp_path / algorithm)
        args = ["solve", task, "--data", str(data), "--target", target, "--draft", draft, "--mode", "seed",
                "--algorithm", algorithm, *extra, "--output", out]
        for again in ([], ["--resume"]):
            result = CliRunner().invoke(main, args + again)
            assert result.exit_code == 0, result.output
        runs.append(out)
    settings = json.loads((tmp_path / "mcts" / "summary.json").read_text())["settings"]
    assert (settings["iterations"], settings["parallel_leaves"], settings["exploration"], settings["mcts_answer"]) \
        == (3, 2, 1.4, "value")
    result = CliRunner().invoke(main, ["compare", *runs])
    assert result.exit_code == 0, result.output
    rows = result.output.splitlines()[2:]
    assert [row.split("|")[3].strip() for row in rows] == ["cot", "cot-sc k=3", "bfs", "dfs", "mcts it=3 m=2"]
