"""Run a search over a dataset: one JSON line per problem as it finishes, then a summary.

results.jsonl is flushed and fsynced after every problem, so a killed run loses at most the
problem in flight; `resume=True` picks up after the last complete line, if the records were made
with the same settings (run.json, run_identity.py). The summary covers every requested problem in
results.jsonl, those solved before a resume included.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Sequence

from tqdm import tqdm

from seed_tot.engine.params import GenerationStats

from .accounting import problem_cost
from .algorithms import check_algorithm, run_search
from .config import RunSettings, with_search_config
from .expansion import check_examples, state_to_json, task_score, task_value
from .llm import GenerationEngine, LLMCaller, ProblemProgress
from .node_work import search_with_node_work
from .protocol import Example, Task, check_unique_ids
from .results_file import (ResultsFileError, check_same_problems, json_default, lock_output, prepare_results_file,
                           summarize_records)
from .run_identity import (RUN_FILE, check_resumed_run, recorded_models, recorded_policy, run_identity,
                           write_run_identity)

log = logging.getLogger(__name__)

RESULTS_FILE = "results.jsonl"
SUMMARY_FILE = "summary.json"
REPORTED_PHASES = ("thought", "value", "answer")  # always in a record (zeros when a phase made no call)

# The keys solve_example writes itself; task.score's keys sit beside them.
RECORD_FIELDS = frozenset({"id", "input", "prediction", "judge_score", "judge_reply", "answer_completion",
                           "best_state", "best_value", "expanded", "steps", "node_work", "stats",
                           "max_new_tokens", "wall_s", "cost"})

__all__ = ["RESULTS_FILE", "SUMMARY_FILE", "ResultsFileError", "ResultsRecorder", "resolve_algorithm", "run_search",
           "solve_dataset", "solve_example"]


def solve_example(caller: LLMCaller, task: Task, example: Example, settings: RunSettings,
                  algorithm: str) -> dict[str, Any]:
    """One results.jsonl record: the search, its score, the optional judge and the engine counters."""
    start = time.perf_counter()
    task = with_search_config(task, settings.search)  # the run's settings, not the task's defaults
    caller.reseed(example.id)
    caller.take_stats()  # drop anything a previous, interrupted problem left behind
    caller.take_budgets()
    # engine counters per tree node, for `seed-tot view`
    result, node_work = search_with_node_work(caller, task, example,
                                              lambda: run_search(caller, task, example, settings, algorithm))
    record: dict[str, Any] = {"id": example.id, "input": example.data, "prediction": result.prediction}
    for key, value in task_score(task, example, result.prediction).items():
        # a task's own fields ("answer", "gold", ...) stay top-level unless they clash with ours
        record[f"score_{key}" if key in RECORD_FIELDS else key] = value
    judge_prompt = getattr(task, "judge_prompt", None)
    if judge_prompt is not None:
        verdict = caller.complete([judge_prompt(example, result.prediction)], phase="judge")[0]
        record["judge_score"] = task_value(task, "parse_value", task.parse_value(verdict))
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
        "node_work": node_work,
        "stats": phase_stats,
        "max_new_tokens": caller.take_budgets(),  # per phase: the largest budget a call was given
        "wall_s": time.perf_counter() - start,
    })
    record["cost"] = problem_cost(phase_stats, caller.engine_calls, record["wall_s"])
    return record


def _progress_postfix(records: Sequence[dict[str, Any]]) -> dict[str, str]:
    summary = summarize_records(records)
    postfix = {}
    for key in ("accuracy", "mean_score", "mean_judge_score"):
        if key in summary:
            postfix[key.removeprefix("mean_")] = f"{summary[key]:.3f}"
    postfix["tok/s"] = f"{summary['tokens_per_s']:.1f}"
    return postfix


def resolve_algorithm(settings: RunSettings, algorithm: str | None) -> str:
    """`algorithm` if given, else the settings' one; either must be one of algorithms.ALGORITHMS."""
    return check_algorithm(algorithm or settings.algorithm)


class ResultsRecorder:
    """The one writer of OUTPUT/results.jsonl and summary.json, for the single-process loop here
    and for the Ray driver (search/distributed.py), so both write the same files the same way.

    On construction it reopens results.jsonl (`resume`) and works out `todo`: the requested
    examples not yet in the file, each once (two different examples with one id are an error).
    Use it as a context manager around the solving; `add` appends one record, flushed and
    fsynced, so a killed run loses at most what is in flight.
    """

    def __init__(self, task: Task, examples: Sequence[Example], *, settings: RunSettings, algorithm: str,
                 output_dir: str | Path, resume: bool, models: dict[str, str] | None = None,
                 data: dict[str, Any] | None = None, policy: str | None = None,
                 endpoint: dict[str, Any] | None = None):
        self.task, self.settings, self.algorithm, self.models = task, settings, algorithm, models or {}
        self.policy = policy  # the draft policy that runs, by its real name (None: the mode drafts nothing)
        self.data = data  # where the examples came from (data_source.py), None when the caller does not know
        self.endpoint = endpoint  # the server that ran the calls (solve --api-base), for run.json and the summary
        self.out = Path(output_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.results_path = self.out / RESULTS_FILE
        self._lock = lock_output(self.out)  # before reading results.jsonl: a second run fails here
        try:
            self._prepare(examples, resume)
        except BaseException:
            self.release()
            raise
        self._fh = None
        self._bar = None
        self._done_postfix: dict[str, str] = {}
        self._records_before = len(self.done)  # a resumed run's: their sittings are in its summary
        self.concurrency = 1  # problems in flight at once (the caller sets it), for the sitting's record
        self._started: float | None = None
        self._solve_wall_s: float | None = None  # from entering to leaving: this sitting's solving time

    def _prepare(self, examples: Sequence[Example], resume: bool) -> None:
        task, settings, algorithm, models = self.task, self.settings, self.algorithm, self.models
        # records made with other settings or data must not be appended to and summarised as these
        # (run_identity.py); checked before results.jsonl is touched, so a refused resume changes nothing
        identity = run_identity(task.name, settings.to_dict(), algorithm, models, self.data, self.endpoint)
        if self.policy:  # for the page of an interrupted run; not compared: a policy changes speed, not records
            identity["policy"] = self.policy
        unrecorded_data = False
        if resume and self.results_path.is_file() and self.results_path.stat().st_size > 0:
            unrecorded_data = check_resumed_run(self.out, identity)
        self.done = prepare_results_file(self.results_path, resume)  # id -> record already written
        # Two different problems with one id would share one results line: refuse rather than
        # skip one. The very same problem listed twice is solved once.
        first: dict[tuple[str, str], int] = {}
        for i, ex in enumerate(examples):
            first.setdefault((ex.id, json.dumps(ex.data, sort_keys=True, default=json_default)), i)
        positions = sorted(first.values())
        distinct = [examples[i] for i in positions]
        check_unique_ids([ex.id for ex in distinct], [f"example {i}" for i in positions])
        check_same_problems(self.results_path, self.done, distinct)
        self.requested_ids = [ex.id for ex in distinct]
        if unrecorded_data and self.done and not any(i in self.done for i in self.requested_ids):
            raise ResultsFileError(f"{self.out / RUN_FILE} does not record the data its records were made from, and "
                                   f"none of them is among the {len(distinct)} problems requested now: resume with "
                                   f"the data they were made from, or pass another --output")
        if not self.done or unrecorded_data or not (self.out / RUN_FILE).is_file():
            write_run_identity(self.out, identity)
        pending = {ex.id: ex for ex in distinct if ex.id not in self.done}
        self.todo = [pending[i] for i in self.requested_ids if i in pending]
        if self.done:
            log.info("resuming %s: %d of %d problems already done", self.results_path,
                     len(self.requested_ids) - len(self.todo), len(self.requested_ids))

    def release(self) -> None:
        """Let another run use the output folder (`__exit__` does; idempotent)."""
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def __enter__(self) -> "ResultsRecorder":
        total = len(self.requested_ids)
        self._bar = tqdm(total=total, initial=total - len(self.todo), desc=self.task.name, unit="problem",
                         file=sys.stderr, dynamic_ncols=True)
        self._fh = self.results_path.open("a", encoding="utf-8")
        self._started = time.perf_counter()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._solve_wall_s = time.perf_counter() - self._started
        self._fh.close()
        self._bar.close()
        self.release()
        if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):  # what was kept, in the one line of Ctrl-C
            from seed_tot.interrupt import Interrupted
            raise Interrupted(f"{len(self.records())} of {len(self.requested_ids)} problems are in "
                              f"{self.results_path}; run the same command with --resume to finish") from exc
        return False

    def show_progress(self, progress: ProblemProgress, in_flight: int = 1) -> None:
        """The problem in flight on the bar (LLMCaller's on_progress): a one-problem run would
        otherwise sit at 0% for minutes. Its ToT step of the depth (DFS: expansions of the
        budget), the phase being generated and its tokens/s, beside the finished problems' figures."""
        if self.algorithm == "dfs":
            step = {"expansion": f"{progress.steps}/{self.settings.max_expansions}"}
        elif self.algorithm == "mcts":  # one thought call per iteration that expanded leaves
            step = {"iteration": f"{progress.steps}/{self.settings.iterations}"}
        elif self.algorithm in ("cot", "cot-sc"):
            step = {}
        else:
            step = {"step": f"{progress.steps}/{self.settings.search.depth}"}
        flight = {"in flight": in_flight} if in_flight > 1 else {}
        self._bar.set_postfix({**self._done_postfix, **flight, "problem": progress.key, **step,
                               "phase": progress.phase, "problem tok/s": f"{progress.tokens_per_s:.1f}"})

    def records(self) -> list[dict[str, Any]]:
        """The records of the requested problems written so far, in the requested order."""
        return [self.done[i] for i in self.requested_ids if i in self.done]

    def add(self, record: dict[str, Any]) -> None:
        self._fh.write(json.dumps(record, ensure_ascii=False, default=json_default) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self.done[str(record["id"])] = record
        self._bar.update(1)
        self._done_postfix = _progress_postfix(self.records())
        self._bar.set_postfix(self._done_postfix)
        log.info("%s %s: prediction %r, %.1fs", self.task.name, record["id"], record["prediction"],
                 record.get("wall_s", 0.0))

    def write_summary(self, engine: Any = None) -> dict[str, Any]:
        settings = self.settings
        summary = summarize_records(self.records())
        # the model pair, for the run header of `seed-tot view`: the engine's, else the run's recorded ones
        summary.update({**self.models, **model_names(engine)})
        if self.policy:
            summary["policy"] = self.policy
        threads = engine.threads_report() if hasattr(engine, "threads_report") else None
        if threads is not None:  # a CPU engine's intra-op threads: the choice and how it moved (cpu_threads.py)
            summary["cpu_threads"] = threads
        if self.endpoint:  # solve --api-base: where the calls went, and the server's counters when it shows them
            work = getattr(engine, "server_work", None)
            summary["endpoint"] = {**self.endpoint, "server_work": work() if callable(work) else None}
        summary.update({"task": self.task.name, "algorithm": self.algorithm, "mode": settings.decode.mode,
                        "k_config": list(settings.decode.k_config), "settings": settings.to_dict(),
                        "results": str(self.results_path),
                        # the rest of n came from results.jsonl (--resume): this run's wall time is theirs alone
                        "solved_this_run": len(self.todo), "sittings": self._sittings()})
        failed = sum(1 for r in self.records() if "error" in r)  # problems no Ray worker survived
        if failed:
            summary["failed"] = failed
        (self.out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2, default=str) + "\n", encoding="utf-8")
        log.info("%s: %d problems, summary in %s", self.task.name, summary["n"], self.out / SUMMARY_FILE)
        return summary

    def _sittings(self) -> list[dict[str, Any]]:
        """Every sitting's problems solved, solving wall time and concurrency, the earlier ones from
        the summary this one replaces: problems per hour of a concurrent or resumed run is their
        problems over their wall time (`seed-tot compare`), where 3600 / a problem's mean wall
        time counts each concurrent problem as if it had the machine alone."""
        earlier = []
        try:
            if not self._records_before:
                raise FileNotFoundError  # a fresh run: no summary left in the folder speaks for it
            previous = json.loads((self.out / SUMMARY_FILE).read_text(encoding="utf-8"))
            earlier = [s for s in previous.get("sittings", []) if isinstance(s, dict)] if isinstance(previous, dict) else []
        except (OSError, json.JSONDecodeError):
            pass  # a first sitting, or a summary a kill cut: the rate starts from this sitting
        if self._solve_wall_s is None or not self.todo:
            return earlier  # nothing solved here (a finished run summarised again)
        return earlier + [{"solved": len(self.todo), "wall_s": round(self._solve_wall_s, 3),
                           "concurrency": self.concurrency}]


def summarize_finished_run(task: Task, examples: Sequence[Example], settings: RunSettings,
                           output_dir: str | Path, data: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """A resumed run with every requested problem already in results.jsonl: its summary, rewritten
    from the records with the models run.json names, so no engine is loaded for nothing to do;
    None when problems remain."""
    recorder = ResultsRecorder(task, examples, settings=settings, algorithm=resolve_algorithm(settings, None),
                               output_dir=output_dir, resume=True, models=recorded_models(output_dir), data=data,
                               policy=recorded_policy(output_dir))
    try:
        return None if recorder.todo else recorder.write_summary()
    finally:
        recorder.release()


def model_names(engine: Any) -> dict[str, str]:
    """role -> the engine's model name, for the roles it names (a wrapped or fake engine may not)."""
    names = {role: getattr(engine, f"{role}_name", None) for role in ("target", "draft")}
    return {role: name for role, name in names.items() if isinstance(name, str)}


def policy_that_runs(engine: Any, settings: RunSettings) -> str | None:
    """The draft policy a drafting mode runs on `engine`, "default" resolved (Engine.policy_name);
    None for ar and parallel, or an engine that cannot say (an HTTP endpoint, a test's fake)."""
    from seed_tot.engine.params import DRAFTING_MODES

    decode = settings.decode
    name_of = getattr(engine, "policy_name", None)
    if decode.mode not in DRAFTING_MODES or not callable(name_of):
        return None
    name = name_of(decode.draft_policy, decode.mode, tuple(decode.k_config))
    return name if isinstance(name, str) else None


def solve_dataset(engine: GenerationEngine, task: Task, examples: Sequence[Example], *, settings: RunSettings,
                  output_dir: str | Path, resume: bool = False, algorithm: str | None = None,
                  concurrency: int = 1, data: dict[str, Any] | None = None) -> dict[str, Any]:
    """Search every example, appending to output_dir/results.jsonl; write and return the summary.

    algorithm: "bfs" or "dfs"; None uses `settings.algorithm`. concurrency: problems searched at
    once on the one engine (each on its own thread with its own LLMCaller; in seed mode their
    sequences share the engine's batched draft and target forwards). Records are written as
    problems finish, so their order may differ from the data's; each problem keeps the seed of its
    id, and a kill loses at most the `concurrency` problems in flight. data: where `examples` came
    from (search/data_source.py), recorded in run.json; a resume from another source is refused.
    Raises ResultsFileError when results.jsonl already holds results and `resume` is False.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be a positive number of problems, got {concurrency}")
    examples = check_examples(task, examples, given_by="solve_dataset was given")
    algorithm = resolve_algorithm(settings, algorithm)
    with ResultsRecorder(task, examples, settings=settings, algorithm=algorithm, output_dir=output_dir,
                         resume=resume, models=model_names(engine), data=data,
                         policy=policy_that_runs(engine, settings),
                         endpoint=getattr(engine, "endpoint_identity", None)) as recorder:
        recorder.concurrency = concurrency
        if concurrency == 1:
            caller = LLMCaller(engine, settings.decoding(), on_progress=recorder.show_progress)
            for example in recorder.todo:
                recorder.add(solve_example(caller, task, example, settings, algorithm))
        else:
            _solve_concurrently(engine, task, recorder, settings, algorithm, concurrency)
    return recorder.write_summary(engine)


def _solve_concurrently(engine: GenerationEngine, task: Task, recorder: ResultsRecorder, settings: RunSettings,
                        algorithm: str, concurrency: int) -> None:
    """Up to `concurrency` searches at once, each with its own caller; the main thread alone writes."""
    stop = threading.Event()
    in_flight: dict[str, ProblemProgress] = {}
    lock = threading.Lock()

    def show(progress: ProblemProgress) -> None:
        if stop.is_set():  # Ctrl-C: end this search at its next engine call
            raise SolveCancelled(progress.key)
        with lock:
            in_flight[progress.key] = progress
            recorder.show_progress(progress, in_flight=len(in_flight))

    def run(example: Example) -> dict[str, Any]:
        caller = LLMCaller(engine, settings.decoding(), on_progress=show)
        try:
            return solve_example(caller, task, example, settings, algorithm)
        finally:
            with lock:
                in_flight.pop(example.id, None)

    pool = ThreadPoolExecutor(concurrency, thread_name_prefix="solve")
    try:
        futures = [pool.submit(run, example) for example in recorder.todo]
        for future in as_completed(futures):
            recorder.add(future.result())
    except BaseException:
        stop.set()  # in-flight searches stop at their next engine call; queued ones never start
        pool.shutdown(wait=False, cancel_futures=True)  # results.jsonl is closed now, valid line by line
        raise
    pool.shutdown(wait=True)


class SolveCancelled(Exception):
    """A concurrent search stopped because the run was interrupted."""


def describe_summary(summary: dict[str, Any], output_dir: str | Path, wall_s: float | None = None) -> str:
    """The end of a run for a person: task, problems, result, speed, and where the files are
    (summary.json holds every number)."""
    from seed_tot.engine.params import DRAFTING_MODES

    n = summary.get("n", 0)
    result = []
    if "accuracy" in summary:
        result.append(f"accuracy {summary['accuracy']:.3f} ({round(summary['accuracy'] * n)}/{n})")
    if "mean_score" in summary:
        result.append(f"mean score {summary['mean_score']:.3f}")
    if "mean_judge_score" in summary:
        result.append(f"mean judge score {summary['mean_judge_score']:.2f}")
    if summary.get("failed"):
        result.append(f"{summary['failed']} failed")
    head = f"{summary.get('task', 'run')}: {n} problem{'s' * (n != 1)}" + "".join(f", {r}" for r in result)
    speed = (f"{summary.get('mean_wall_s', 0.0):.1f} s per problem, {summary.get('tokens_per_s', 0.0):.1f} "
             f"tokens/s, mode {summary.get('mode', '?')}")
    if summary.get("mode") in DRAFTING_MODES:
        speed += f", acceptance {summary.get('acceptance_rate', 0.0):.3f}"
    engine = {k: (summary.get("settings") or {}).get(k, v) for k, v in (("attention", "gather"), ("compile", "auto"))}
    if engine != {"attention": "gather", "compile": "auto"}:  # the engine path, said where not the default
        speed += f", attention {engine['attention']}, compile {engine['compile']}"
    now = summary.get("solved_this_run", n)
    if now < n:  # a resumed run: its wall time covers its own problems, the figures all n records
        wall = "" if wall_s is None else f"wall {wall_s:.1f} s for {now} problem{'s' * (now != 1)}, "
        this_run = "nothing left to solve" if now == 0 else f"{wall}{n - now} solved before it"
        every = f"all {n} problems" if n != 1 else "the 1 problem"
        speed = f"this run: {this_run}; {every}: {speed}"
    elif wall_s is not None:
        speed = f"wall {wall_s:.1f} s, {speed}"
    out = Path(output_dir)
    files = [f"results {out / RESULTS_FILE}", f"summary {out / SUMMARY_FILE}"]
    if (out / "tree.html").is_file():
        files.append(f"tree {out / 'tree.html'}")
    return "\n".join([head, speed, ", ".join(files)])
