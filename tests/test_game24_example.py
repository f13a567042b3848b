"""The custom-task example (examples/game24.py) end to end with BFS on a scripted engine."""
from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
from scripted_engine import ScriptedEngine

from seed_tot.search import DecodingSettings, LLMCaller, bfs, load_settings, solve_dataset
from seed_tot.search.protocol import State, Task

EXAMPLE_FILE = Path(__file__).resolve().parents[1] / "examples" / "game24.py"


@pytest.fixture(scope="module")
def game24():
    spec = importlib.util.spec_from_file_location("game24_example", EXAMPLE_FILE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# Replies for the puzzle "4 4 6 8", keyed on the numbers in the prompt.
STEPS = {
    "4 4 6 8": ["4 + 8 = 12 (left: 4 6 12)", "8 - 4 = 4 (left: 4 4 6)", "4 + 4 = 9 (left: 6 8 9)"],  # last: illegal
    "4 6 12": ["6 - 4 = 2 (left: 2 12)", "12 / 4 = 3 (left: 3 6)", "4 + 6 = 10 (left: 10 12)"],
    "4 4 6": ["4 * 4 = 16 (left: 6 16)"] * 3,
    "2 12": ["2 * 12 = 24 (left: 24)", "12 / 2 = 6 (left: 6)", "12 - 2 = 10 (left: 10)"],
    "3 6": ["3 * 6 = 18 (left: 18)", "6 / 3 = 2 (left: 2)", "6 - 3 = 3 (left: 3)"],
}
VERDICTS = {"4 6 12": "12 * (6 - 4) = 24. sure", "4 4 6": "4 * 6 = 24 but 4 is left. likely",
            "2 12": "2 * 12 = 24. sure", "3 6": "3 * 6 = 18, 6 + 3 = 9. likely", "10 12": "10 + 12 = 22. impossible",
            "6 16": "16 + 6 = 22. likely"}


def respond(user: str, copy: int) -> str:
    if user.rstrip().endswith("Next step:"):
        numbers = re.findall(r"Input: (.*)", user)[-1]
        return STEPS[numbers][copy]
    if "sure, likely or impossible" in user:
        return VERDICTS[re.findall(r"Numbers: (.*)", user)[-1]]
    if "Steps:" in user:
        return " (6 - 4) * (4 + 8) = 24"
    raise AssertionError(f"unexpected prompt {user!r}")


def test_game24_is_a_task(game24):
    assert isinstance(game24.Game24(), Task)


def test_bfs_solves_the_scripted_puzzle(game24):
    task = game24.Game24()
    example = task.load(limit=1)[0]
    engine = ScriptedEngine(respond)
    caller = LLMCaller(engine, DecodingSettings(max_new_tokens=task.config.max_new_tokens))
    result = bfs(caller, task, example, task.config)

    first, second, third = result.steps
    assert first["values"] == [20.0, 1.0, 0.0]  # sure, likely, illegal (no model call for it)
    assert len(engine.calls[1].prompts) == 2
    assert first["kept"] == [0, 1]  # breadth 2
    assert len(engine.calls[2].prompts) == 2 * 3
    assert second["values"] == [20.0, 1.0, 0.001, 1.0, 0.0, 0.0]  # the repeated 6 16 states are valued once
    assert second["kept"] == [0, 1]  # "3 6" and "6 16" tie at 1: the earlier wins
    # the last level is valued by prior_value (one number left), so step 3 is a single thought call
    assert third["values"][:3] == [20.0, 0.001, 0.001]
    assert len(engine.calls) == 2 + 2 + 1 + 1
    assert result.state.thoughts[-1] == "2 * 12 = 24 (left: 24)"
    assert result.prediction == "(6 - 4) * (4 + 8)"
    assert task.score(example, result.prediction)["correct"] is True


def test_game24_through_solve_dataset(game24, tmp_path: Path):
    task = game24.Game24()
    settings = load_settings(None, base=task.config)
    summary = solve_dataset(ScriptedEngine(respond), task, task.load(limit=1), settings=settings,
                            output_dir=tmp_path, resume=False)
    assert summary["n"] == 1 and summary["accuracy"] == 1.0
    record = json.loads((tmp_path / "results.jsonl").read_text())
    assert record["input"]["puzzle"] == "4 4 6 8" and len(record["steps"]) == 3


@pytest.mark.parametrize("expression, correct", [
    ("(6 - 4) * (4 + 8)", True),
    ("(8 - 4) * 6 * 4 / 4", False),  # a number too many
    ("4 * 6", False),  # numbers missing
    ("4 + 4 + 6 + 8", False),  # 22
    ("(4 + 4) * (8 - 6) + 8", False),
    ("__import__('os').system('true')", False),  # never evaluated
    ("", False),
])
def test_scorer(game24, expression: str, correct: bool):
    task = game24.Game24()
    example = task.load(limit=1)[0]
    assert task.score(example, expression)["correct"] is correct


def test_other_builtin_puzzles_have_solutions_the_scorer_accepts(game24):
    task = game24.Game24()
    examples = {e.data["puzzle"]: e for e in task.load()}
    assert set(examples) == set(game24.PUZZLES)
    assert task.score(examples["2 9 10 12"], "12 * 2 * (10 - 9)")["correct"]
    assert task.score(examples["1 1 4 6"], "4 * 6 * 1 * 1")["correct"]
    assert not task.score(examples["1 1 4 6"], "(1 + 1) * 4 * 6 / 2")["correct"]  # 2 is not given


def test_illegal_steps_are_valued_without_the_model(game24):
    task = game24.Game24()
    example = task.load(limit=1)[0]
    assert task.prior_value(example, State(("4 + 8 = 13 (left: 4 6 13)",))) == game24.ILLEGAL
    assert task.prior_value(example, State(("7 + 8 = 15 (left: 4 4 6 15)",))) == game24.ILLEGAL
    assert task.prior_value(example, State(("4 + 8 = 12 (left: 4 6 12)",))) is None
    assert task.parse_value("10 + 14 = 24. sure") == 20.0 and task.parse_value("no idea") == 0.001
