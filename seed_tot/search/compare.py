"""`seed-tot compare RUN...`: accuracy at equal tokens, one row per run.

Each row: the run's task, algorithm (with its k, or its iterations and leaves) and decoding mode,
its problems, accuracy with the Wilson 95% interval, mean new tokens, prompt tokens and engine
calls per problem, and problems per hour (problems over the solving wall time of the run's
sittings, so a concurrent run counts what it did at once). Figures come from
results.jsonl (every record the run holds, resumed parts included); the settings from summary.json,
else run.json.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Sequence

from .accounting import problems_per_hour, wilson
from .results_file import summarize_records

log = logging.getLogger(__name__)

COLUMNS = ("run", "task", "algorithm", "mode", "n", "accuracy", "95% interval", "new tok/problem",
           "prompt tok/problem", "calls/problem", "problems/h")


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return value if isinstance(value, dict) else None


def read_records(directory: Path) -> list[dict[str, Any]]:
    results = directory / "results.jsonl"
    if not results.is_file():
        raise FileNotFoundError(f"{directory}: no results.jsonl; give a directory `seed-tot solve --output` wrote")
    records = []
    for line in results.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a run killed mid-write leaves a cut last line
        if isinstance(record, dict) and "id" in record:
            records.append(record)
    return records


def algorithm_label(settings: dict[str, Any], algorithm: str | None) -> str:
    if algorithm == "cot-sc":
        return f"cot-sc k={settings.get('samples', '?')}"
    if algorithm == "mcts":
        return f"mcts it={settings.get('iterations', '?')} m={settings.get('parallel_leaves', '?')}"
    return str(algorithm or "?")


def run_row(directory: str | Path) -> dict[str, Any]:
    directory = Path(directory)
    records = read_records(directory)
    summary = _read_json(directory / "summary.json") or {}
    identity = _read_json(directory / "run.json") or {}
    settings = summary.get("settings") or identity.get("settings") or {}
    algorithm = summary.get("algorithm") or settings.get("algorithm")
    figures = summarize_records(records)
    scored = [r for r in records if "correct" in r]
    right = sum(bool(r["correct"]) for r in scored)
    low, high = wilson(right, len(scored))
    return {"run": str(directory), "task": summary.get("task") or identity.get("task"),
            "algorithm": algorithm_label(settings, algorithm), "mode": summary.get("mode") or settings.get("mode"),
            "n": len(records), "scored": len(scored), "correct": right,
            "accuracy": right / len(scored) if scored else None, "interval": [low, high] if scored else None,
            "mean_new_tokens": figures.get("mean_new_tokens"), "mean_prompt_tokens": figures.get("mean_prompt_tokens"),
            "mean_engine_calls": figures.get("mean_engine_calls"), "problems_per_h": problems_per_hour(figures.get("mean_wall_s"), summary.get("sittings") or ())}


def _cell(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """A Markdown table (it reads as plain text too, and pastes into the benchmark journal)."""
    lines = [[r["run"], _cell(r["task"]), r["algorithm"], _cell(r["mode"]), str(r["n"]),
              "-" if r["accuracy"] is None else f"{r['accuracy']:.3f} ({r['correct']}/{r['scored']})",
              "-" if r["interval"] is None else f"{r['interval'][0]:.3f}-{r['interval'][1]:.3f}",
              _cell(r["mean_new_tokens"]), _cell(r["mean_prompt_tokens"]), _cell(r["mean_engine_calls"]),
              _cell(r["problems_per_h"])] for r in rows]
    widths = [max(len(c), *(len(line[i]) for line in lines)) for i, c in enumerate(COLUMNS)]
    fmt = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    return "\n".join([fmt(COLUMNS), fmt(["-" * w for w in widths]), *map(fmt, lines)])
