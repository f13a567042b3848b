"""Run a search over a dataset: one JSON line per problem as it finishes, then a summary.

results.jsonl is flushed and fsynced after every problem, so a killed run loses at most the
problem in flight; `resume=True` picks up after the last complete line. The summary covers every
requested problem in results.jsonl, those solved before a resume included.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from tqdm import tqdm

from seed_tot.engine.params import GenerationStats

from .bfs import bfs
from .config import RunSettings
from .dfs import dfs
from .expansion import SearchResult, state_to_json
from .llm import GenerationEngine, LLMCaller
from .protocol import Example, Task
from .results_file import ResultsFileError, prepare_results_file, summarize_records

log = logging.getLogger(__name__)

RESULTS_FILE = "results.jsonl"
SUMMARY_FILE = "summary.json"
REPORTED_PHASES = ("thought", "value", "answer")  # always in a record (zeros when a phase made no call)

# The keys solve_example writes itself; task.score's keys sit beside them.
RECORD_FIELDS = frozenset({"id", "input", "prediction", "judge_score", "judge_reply", "answer_completion",
                           "best_state", "best_value", "expanded", "steps", "stats", "wall_s"})

__all__ = ["RESULTS_FILE", "SUMMARY_FILE", "ResultsFileError", "run_search", "solve_dataset", "solve_example"]


def run_search(caller: LLMCaller, task: Task, example: Example, settings: RunSettings,
               algorithm: str) -> SearchResult:
    if algorithm == "bfs":
        return bfs(caller, task, example, settings.search)
    if algorithm == "dfs":
        return dfs(caller, task, example, settings.search, max_expansions=settings.max_expansions)
    raise ValueError(f"unknown search algorithm {algorithm!r}; expected bfs or dfs")


def solve_example(caller: LLMCaller, task: Task, example: Example, settings: RunSettings,
                  algorithm: str) -> dict[str, Any]:
    """One results.jsonl record: the search, its score, the optional judge and the engine counters."""
    start = time.perf_counter()
    caller.reseed(example.id)
    caller.take_stats()  # drop anything a previous, interrupted problem left behind
    result = run_search(caller, task, example, settings, algorithm)
    record: dict[str, Any] = {"id": example.id, "input": example.data, "prediction": result.prediction}
    for key, value in task.score(example, result.prediction).items():
        # a task's own fields ("answer", "gold", ...) stay top-level unless they clash with ours
        record[f"score_{key}" if key in RECORD_FIELDS else key] = value
    judge_prompt = getattr(task, "judge_prompt", None)
    if judge_prompt is not None:
        verdict = caller.complete([judge_prompt(example, result.prediction)], phase="judge")[0]
        record["judge_score"] = float(task.parse_value(verdict))
        record["judge_reply"] = verdict
    stats = caller.take_stats()
    phase_stats = {phase: stats.pop(phase, GenerationStats()).to_dict() for phase in REPORTED_PHASES}
    phase_stats.update({phase: s.to_dict() for phase, s in stats.items()})  # "judge"
    record.update({
        "answer_completion": result.answer,
        "best_state": state_to_json(result.state),
        "best_value": result.value,
        "expanded": result.expanded,
        "steps": result.steps,
        "stats": phase_stats,
        "wall_s": time.perf_counter() - start,
    })
    return record


def _progress_postfix(records: Sequence[dict[str, Any]]) -> dict[str, str]:
    summary = summarize_records(records)
    postfix = {}
    for key in ("accuracy", "mean_score", "mean_judge_score"):
        if key in summary:
            postfix[key.removeprefix("mean_")] = f"{summary[key]:.3f}"
    postfix["tok/s"] = f"{summary['tokens_per_s']:.1f}"
    return postfix


def solve_dataset(engine: GenerationEngine, task: Task, examples: Sequence[Example], *, settings: RunSettings,
                  output_dir: str | Path, resume: bool = False, algorithm: str | None = None) -> dict[str, Any]:
    """Search every example, appending to output_dir/results.jsonl; write and return the summary.

    algorithm: "bfs" or "dfs"; None uses `settings.algorithm`. Raises ResultsFileError when
    results.jsonl already holds results and `resume` is False.
    """
    algorithm = algorithm or settings.algorithm
    if algorithm not in ("bfs", "dfs"):
        raise ValueError(f"unknown search algorithm {algorithm!r}; expected bfs or dfs")
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / RESULTS_FILE
    done = prepare_results_file(results_path, resume)  # id -> record already written
    requested_ids = [ex.id for ex in examples]
    todo = [ex for ex in examples if ex.id not in done]
    if done:
        log.info("resuming %s: %d of %d problems already done", results_path, len(examples) - len(todo), len(examples))
    caller = LLMCaller(engine, settings.decoding())
    records = [done[i] for i in dict.fromkeys(requested_ids) if i in done]

    bar = tqdm(total=len(examples), initial=len(examples) - len(todo), desc=task.name, unit="problem",
               file=sys.stderr, dynamic_ncols=True)
    try:
        with results_path.open("a", encoding="utf-8") as fh:
            for example in todo:
                if example.id in done:  # the same id twice in the input: solve it once
                    log.warning("example id %s appears more than once; solving it once", example.id)
                    bar.update(1)
                    continue
                record = solve_example(caller, task, example, settings, algorithm)
                fh.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
                done[example.id] = record
                records.append(record)
                bar.update(1)
                bar.set_postfix(_progress_postfix(records))
                log.info("%s %s: prediction %r, %.1fs", task.name, example.id, record["prediction"], record["wall_s"])
    except KeyboardInterrupt:
        log.warning("interrupted: %d of %d problems are in %s; run again with --resume to finish",
                    len(records), len(examples), results_path)
        raise
    finally:
        bar.close()

    summary = summarize_records(records)
    summary.update({"task": task.name, "algorithm": algorithm, "mode": settings.mode,
                    "k_config": list(settings.k_config), "settings": settings.to_dict(),
                    "results": str(results_path)})
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2, default=str) + "\n", encoding="utf-8")
    log.info("%s: %d problems, summary in %s", task.name, summary["n"], out / SUMMARY_FILE)
    return summary
