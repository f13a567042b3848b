"""Small solved runs for the tree page's tests: a scripted engine (tests/scripted_engine.py) solves
tests/short_task.py's task, so every record is a real solve's, node_work included."""
from __future__ import annotations

import json
from pathlib import Path

from scripted_engine import ScriptedEngine
from short_task import ShortTask

from seed_tot.search import solve_dataset
from seed_tot.search.config import RunSettings
from seed_tot.search.protocol import SearchConfig

QUESTIONS = ("apples", "pens", "pages")
DEPTH, N_GENERATE, BREADTH = 2, 3, 2


def respond(user: str, copy: int) -> str:
    """Thoughts that differ per sample and carry markup (the page must show it as text), ratings
    whose vowel count (the value) depends on the state, answers right except for "pages"."""
    if user.startswith("rate"):
        return "aeiou"[: (len(user) + copy) % 5 + 1] + " </script> rating"
    if user.startswith("answer"):
        return "no" if "pages" in user else "yes"
    return f"<b>idea {copy}</b> after {user[-12:]}"


def solve_run(directory: Path, *, temperature: float = 0.0, algorithm: str = "bfs") -> Path:
    """A 3-problem run (depth 2, 3 thoughts per state, 2 kept per step; DFS: kept = rated 5 or
    more, at most 4 expansions) in `directory`."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    data = directory.parent / f"{directory.name}-data.jsonl"
    data.write_text("".join(json.dumps({"question": q, "answer": "yes"}) + "\n" for q in QUESTIONS))
    task = ShortTask()
    settings = RunSettings(search=SearchConfig(depth=DEPTH, n_generate=N_GENERATE, breadth=BREADTH, max_new_tokens=6,
                                               temperature=temperature, value_threshold=5.0),
                           algorithm=algorithm, max_expansions=4)
    solve_dataset(ScriptedEngine(respond), task, task.load(str(data)), settings=settings, output_dir=directory)
    return directory


def records(directory: Path) -> list[dict]:
    return [json.loads(line) for line in (directory / "results.jsonl").read_text().splitlines()]


def rewrite(directory: Path, change) -> None:
    """Apply change(records) to a run's results.jsonl (plant a difference, drop fields)."""
    rows = records(directory)
    change(rows)
    (directory / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
