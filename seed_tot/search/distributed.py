"""Solve a dataset on a Ray cluster: N actors, one Engine each, fed problems from a work queue.

The driver never loads a model. It hands a problem to each idle slot of an actor (a work queue,
so one slow problem holds up one slot, not a shard); an actor has `concurrency` slots, searches
running at once on its one engine, whose sequences share batched forwards as `solve --concurrency`
does in one process, and it alone writes results.jsonl and
summary.json, through the same `ResultsRecorder` as the single-process run; an actor runs the
same `solve_example` as that run, whose seeds come from the problem id, so records do not depend
on which actor solved a problem or in what order.

Faults: an actor process that dies (killed, out of memory, crashed) is restarted by Ray
(`max_restarts`); each problem it had in flight goes back to the front of the queue, preferably to
another actor, and after `max_attempts` deaths it is written as a failed record with the error
(which `--resume` solves again: results_file.prepare_results_file).
An exception raised by the search itself is a bug or bad input, not a fault: it stops the run, as
it does in a single process. Ctrl-C kills the actors; every line already written stays valid.

Ray is an optional dependency (`pip install seed-tot[ray]`); nothing here imports it at module load.
"""
from __future__ import annotations

import logging
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Sequence

from seed_tot.engine.models import DEFAULT_DRAFT_LAYERS

from .config import RunSettings
from .expansion import check_examples
from .llm import GenerationEngine, LLMCaller
from .protocol import Example, Task
from .solve import ResultsRecorder, model_names, policy_that_runs, resolve_algorithm, solve_example

log = logging.getLogger(__name__)

RAY_MISSING = "Ray is not installed; --ray needs it: pip install 'seed-tot[ray]'"
DEFAULT_MAX_ATTEMPTS = 3  # a problem whose actor died this often is recorded as failed
DEFAULT_MAX_RESTARTS = 3  # Ray restarts a dead actor this often before it leaves the pool

__all__ = ["EngineSpec", "EnginePool", "RayRunError", "RayUnavailableError", "WorkersLostError", "connect_ray",
           "import_ray", "solve_dataset_ray", "solve_on_ray"]


class RayRunError(RuntimeError):
    """A Ray run cannot go on; the message is one line for the command line."""


class RayUnavailableError(RayRunError):
    """--ray without Ray installed."""


class WorkersLostError(RayRunError):
    """Every actor of the pool died more often than Ray may restart it."""


def import_ray():
    try:
        import ray
    except ImportError as err:
        raise RayUnavailableError(RAY_MISSING) from err
    return ray


@dataclass(frozen=True)
class EngineSpec:
    """How an actor builds its Engine; pickled to the actors, so it holds names, not models.

    target/draft: Hub id, local directory or .gguf path, as for `Engine.from_pretrained`.
    factory: instead of those, a picklable zero-argument callable returning an engine (tests
    build tiny models this way; a user can wrap an engine of their own).
    """

    target: str | None = None
    draft: str | None = None
    draft_layers: int = DEFAULT_DRAFT_LAYERS
    device: str = "auto"
    dtype: str | None = None
    load_draft: bool = True
    cpu_linear: str | None = None  # None: $SEED_TOT_CPU_LINEAR of the actor, else onednn
    attention: str = "gather"  # how batched forwards read the KV pool (engine/engine_settings.py)
    compile: bool | None = None  # fixed-shape forwards compiled: None on CUDA only
    factory: Callable[[], GenerationEngine] | None = None

    def build(self) -> GenerationEngine:
        if self.factory is not None:
            return self.factory()
        from seed_tot.engine import Engine
        return Engine.from_pretrained(target=self.target, draft=self.draft, device=self.device, dtype=self.dtype,
                                      draft_layers=self.draft_layers, load_draft=self.load_draft,
                                      cpu_linear=self.cpu_linear, attention=self.attention, compile=self.compile)


class EngineWorker:
    """The body of one Ray actor: one engine, one problem per call; a threaded actor
    (`max_concurrency`) runs several calls at once, each with its own LLMCaller."""

    def __init__(self, spec: EngineSpec):
        self.engine: GenerationEngine | None = None
        self.load_error: str | None = None
        try:
            self.engine = spec.build()
        except (ValueError, OSError) as err:
            # a bad model path is the user's input: report it as one line, do not crash-loop the actor
            self.load_error = f"{type(err).__name__}: {err}"

    def ready(self) -> str | None:
        """None once the engine is loaded, else why it could not be."""
        return self.load_error

    def model_names(self) -> SimpleNamespace:
        """The engine's model pair by name, for the run's summary (every actor loads the same spec)."""
        return SimpleNamespace(target_name=getattr(self.engine, "target_name", None),
                               draft_name=getattr(self.engine, "draft_name", None))

    def policy_name(self, settings: RunSettings) -> str | None:
        """The draft policy this engine runs for `settings` (run.json and summary.json name it)."""
        return policy_that_runs(self.engine, settings)

    def solve(self, task: Task, settings: RunSettings, algorithm: str, example: Example) -> dict[str, Any]:
        caller = LLMCaller(self.engine, settings.decoding())
        return solve_example(caller, task, example, settings, algorithm)


def _shutting_down(err) -> bool:
    """Whether a search failed because its actor's process was exiting (a sibling search on the same
    actor died and took the process down): Python's thread pools then refuse new work with
    "cannot schedule new futures after shutdown". That is a lost process, not the search's error."""
    seen, exc = set(), getattr(err, "cause", None)
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, RuntimeError) and "after shutdown" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def connect_ray(address: str) -> None:
    """Join or start a Ray cluster. "auto": the cluster in RAY_ADDRESS or the last one started on
    this machine, else a new local one; "local": always a new local one; anything else: the address
    of a running cluster (host:port, or ray://host:port for Ray Client). No-op when already connected."""
    ray = import_ray()
    if ray.is_initialized():
        return
    target = {"auto": None, "local": "local"}.get(address, address)
    # the dashboard is a web server per cluster: not worth its CPU for a batch job
    ray.init(address=target, include_dashboard=False, logging_level=logging.WARNING)
    log.info("Ray cluster resources: %s", ray.cluster_resources())


class EnginePool:
    """`workers` Ray actors, each holding one engine built from `spec` and running up to
    `concurrency` searches at once on it; a context manager that kills the actors on exit. Needs a
    connected Ray (`connect_ray`)."""

    def __init__(self, spec: EngineSpec, workers: int, *, gpus_per_worker: float = 0.0, cpus_per_worker: float = 1.0,
                 max_restarts: int = DEFAULT_MAX_RESTARTS, concurrency: int = 1, notice_s: float = 60.0):
        if workers < 1:
            raise ValueError(f"--workers must be at least 1, got {workers}")
        if concurrency < 1:
            raise ValueError(f"--concurrency must be at least 1, got {concurrency}")
        self.concurrency = concurrency
        ray = import_ray()
        if not ray.is_initialized():
            raise RayRunError("Ray is not connected: call connect_ray first")
        self.max_restarts = max_restarts
        self.retired: set[int] = set()  # actors Ray gave up restarting
        # max_concurrency > 1 makes a threaded actor: its calls share the engine, whose scheduler
        # batches their sequences (Engine.generate is thread-safe for that reason)
        self._actor = ray.remote(num_cpus=cpus_per_worker, num_gpus=gpus_per_worker, max_restarts=max_restarts,
                                 max_task_retries=0,  # the driver retries, on another actor
                                 max_concurrency=concurrency)(EngineWorker)
        self.spec = spec
        self.actors = [self._actor.remote(spec) for _ in range(workers)]
        self.alive = True
        from ray.exceptions import RayActorError
        try:
            errors = [e for e in _wait_until_ready(ray, [a.ready.remote() for a in self.actors], notice_s)
                      if e is not None]
        except RayActorError as err:
            self.shutdown()
            raise RayRunError(f"a Ray worker could not start: {_first_line(err)}") from err
        if errors:
            self.shutdown()
            raise ValueError(f"a Ray worker could not load its engine: {errors[0]}")
        self.model_names = ray.get(self.actors[0].model_names.remote())
        log.info("%d Ray workers ready (%s CPU, %s GPU, %d searches at once each)", workers, cpus_per_worker,
                 gpus_per_worker, concurrency)

    def replace(self, worker: int) -> None:
        """A new actor in `worker`'s place, the old one killed for good (a running actor call cannot be
        cancelled). A new actor rather than a Ray restart, so that stopping late searches does not use up
        the restarts kept for crashes."""
        ray = import_ray()
        ray.kill(self.actors[worker], no_restart=True)
        self.actors[worker] = self._actor.remote(self.spec)

    def shutdown(self) -> None:
        if not self.alive:
            return
        ray = import_ray()
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.alive = False

    def __enter__(self) -> "EnginePool":
        return self

    def __exit__(self, *exc) -> bool:
        self.shutdown()
        return False


def _wait_until_ready(ray, refs: list, notice_s: float) -> list:
    """The actors' `ready` answers. An actor waits unplaced while other jobs hold what it asked for,
    and loading its models may take minutes (a download), so the wait has no limit; but every
    `notice_s` it says how many are up and what the cluster has free, so a run that cannot start is
    not a silent hang (Ctrl-C stops it)."""
    start, pending = time.monotonic(), list(refs)
    while pending:
        _, pending = ray.wait(pending, num_returns=len(pending), timeout=notice_s)
        if pending:
            free = {k: v for k, v in ray.available_resources().items() if k in ("CPU", "GPU", "memory")}
            log.warning("waiting for Ray workers: %d of %d ready after %.0f s; the cluster has %s free (a worker "
                        "waits while other jobs hold what it asked for, and while it loads its models)",
                        len(refs) - len(pending), len(refs), time.monotonic() - start, free or "nothing")
    return ray.get(refs)


@dataclass
class _Job:
    example: Example
    attempts: int = 0
    died_on: set[int] = field(default_factory=set)  # actors this problem was in flight on when they died
    errors: list[str] = field(default_factory=list)


def _failed_record(task: Task, job: _Job) -> dict[str, Any]:
    """What results.jsonl keeps for a problem no actor survived: scored as an empty prediction,
    so accuracy counts it as wrong, with the error of each attempt."""
    record: dict[str, Any] = {"id": job.example.id, "input": job.example.data, "prediction": ""}
    for key, value in task.score(job.example, "").items():
        record.setdefault(key, value)
    record.update({"error": " | ".join(job.errors), "attempts": job.attempts, "stats": {}, "wall_s": 0.0})
    return record


def _next_job(queue: deque[_Job], worker: int) -> _Job:
    """The first queued job that did not already die on this worker; else the first one."""
    for i, job in enumerate(queue):
        if worker not in job.died_on:
            del queue[i]
            return job
    return queue.popleft()


_WAKE_S = 1.0  # how often the driver leaves ray.wait to look for a Ctrl-C


def _notice_ctrl_c() -> tuple[threading.Event, Callable[[], None]]:
    """A SIGINT handler that also records the Ctrl-C, and a function that puts the old one back.

    The driver spends its time inside ray.wait, where Ray's core worker runs Python's signal check
    itself; a KeyboardInterrupt lost there would let the run go on to the end (tested by simulating
    that loss; whether Ray does lose one was not established). The recorded Event lets the loop raise
    it on its next wake-up. Off the main thread (where Python
    delivers no signal) the Event never fires and the handler stays as it is."""
    seen = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        return seen, lambda: None
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.SIG_IGN:  # the caller ignores Ctrl-C: so does the run
        return seen, lambda: None

    def on_sigint(signum, frame):
        seen.set()
        if callable(previous):  # the default handler raises KeyboardInterrupt
            previous(signum, frame)
        else:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    return seen, lambda: signal.signal(signal.SIGINT, previous)


def solve_dataset_ray(pool: EnginePool, task: Task, examples: Sequence[Example], *, settings: RunSettings,
                      output_dir: str | Path, resume: bool = False, algorithm: str | None = None,
                      max_attempts: int = DEFAULT_MAX_ATTEMPTS, search_timeout_s: float | None = None,
                      data: dict[str, Any] | None = None) -> dict[str, Any]:
    """`solve_dataset` on the pool's actors: the same results.jsonl and summary.json.

    A search still running after `search_timeout_s` is recorded as failed (a resume tries it again) and
    its actor replaced by a new one, since a running actor call cannot be cancelled; the actor's other
    searches go back to the queue without losing an attempt.

    Raises WorkersLostError when every actor is gone with problems left (those already written
    stay; --resume continues), and the search's own exception when one raises.
    """
    ray = import_ray()
    from ray.exceptions import OutOfMemoryError, RayActorError, RayTaskError, WorkerCrashedError
    lost = (RayActorError, OutOfMemoryError, WorkerCrashedError)  # the process died, not the search

    if not pool.alive:
        raise RayRunError("this pool's actors were stopped (Ctrl-C or shutdown); start a new EnginePool")
    examples = check_examples(task, examples, given_by="solve_dataset_ray was given")
    algorithm = resolve_algorithm(settings, algorithm)
    task_ref = ray.put(task)  # shipped once, not once per problem
    # the actors' model names, as a single-process run records its engine's: a resume with other models is
    # refused whichever way it crosses, and run.json names what made the records (and the policy that runs)
    first = next((i for i in range(len(pool.actors)) if i not in pool.retired), 0)
    with ResultsRecorder(task, examples, settings=settings, algorithm=algorithm, output_dir=output_dir,
                         resume=resume, models=model_names(pool.model_names), data=data,
                         policy=ray.get(pool.actors[first].policy_name.remote(settings))) as recorder:
        queue = deque(_Job(ex) for ex in recorder.todo)
        live = [i for i in range(len(pool.actors)) if i not in pool.retired]
        idle = [w for _ in range(pool.concurrency) for w in live]
        recorder.concurrency = len(idle)  # searches in flight across the actors  # one entry per free search slot, spread out
        # A death fails every call in flight on that actor; `life` counts its restarts, so only the
        # first of those failures waits for the restart, and the slots come back once, after it.
        life = dict.fromkeys(range(len(pool.actors)), 0)
        in_flight: dict[Any, tuple[int, int, _Job | None]] = {}  # a None job: waiting for a restarted actor
        started: dict[Any, float] = {}  # when each search was sent
        spared: set = set()  # searches failing because the driver killed their actor: not their fault

        def restart(worker: int) -> None:
            """After the first failure of an actor's death, or its replacement: its slots leave until the
            actor (restarted by Ray, or new) answers. Calls made meanwhile would fail too; this one is
            retried by Ray through a restart, and fails once Ray gives up."""
            nonlocal idle
            life[worker] += 1
            idle = [w for w in idle if w != worker]
            probe = pool.actors[worker].ready.options(max_task_retries=-1).remote()
            in_flight[probe] = worker, life[worker], None

        def stop_overdue(finished: list) -> None:
            running = {r: v for r, v in in_flight.items() if r not in finished}
            late, killed, newly_spared = _overdue(running, started, time.monotonic(), search_timeout_s, life)
            for ref in late:
                worker, _, job = in_flight.pop(ref)
                started.pop(ref)
                job.attempts += 1
                job.errors.append(f"worker {worker}: timed out after {search_timeout_s:g} s")
                log.error("problem %s: its search ran past --search-timeout %g s on Ray worker %d; recorded as failed",
                          job.example.id, search_timeout_s, worker)
                recorder.add(_failed_record(task, job))
            spared.update(newly_spared)
            for worker in killed:
                pool.replace(worker)
                restart(worker)

        ctrl_c, restore_handler = _notice_ctrl_c()
        try:
            while queue or in_flight:
                while idle and queue:
                    worker = idle.pop(0)
                    job = _next_job(queue, worker)
                    ref = pool.actors[worker].solve.remote(task_ref, settings, algorithm, job.example)
                    in_flight[ref], started[ref] = (worker, life[worker], job), time.monotonic()
                if not in_flight:
                    break  # problems left, no actor left
                ready: list = []
                while not ready:  # wake every second: a Ctrl-C that Ray's wait swallowed is acted on here
                    ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=_WAKE_S)
                    if ctrl_c.is_set():
                        raise KeyboardInterrupt
                    if search_timeout_s is not None:  # on every pass: with results arriving each second,
                        stop_overdue(ready)  # a check only on empty waits would let a hung search run on
                        if not in_flight:
                            break
                if not ready:
                    continue
                (ref,) = ready
                worker, born, job = in_flight.pop(ref)
                started.pop(ref, None)
                try:
                    result = ray.get(ref)
                except RayTaskError as err:
                    if not _shutting_down(err):
                        # the search raised: the original exception (its one-line message), as in one process
                        raise (err.cause if isinstance(err.cause, Exception) else err) from err
                    lost_err = err  # a sibling search of a dying actor: its executor shut down under it
                except lost as err:
                    lost_err = err
                else:
                    lost_err = None
                if lost_err is not None:
                    err = lost_err
                    if job is None:  # Ray gave up restarting it
                        log.warning("Ray worker %d is gone for good (%s)", worker, _first_line(err))
                        pool.retired.add(worker)
                        continue
                    if ref in spared:
                        spared.discard(ref)
                        queue.appendleft(job)
                    else:
                        _lost_attempt(task, job, worker, err, queue, recorder, max_attempts)
                    if born == life[worker]:  # the first failure of this death
                        restart(worker)
                    continue
                if job is not None:
                    recorder.add(result)
                    if born == life[worker]:
                        idle.append(worker)
                elif result is not None:  # restarted, but its engine no longer loads
                    log.warning("Ray worker %d restarted without an engine (%s); it leaves the pool", worker, result)
                    pool.retired.add(worker)
                else:  # restarted and ready: all its slots are free
                    idle.extend([worker] * pool.concurrency)
        except KeyboardInterrupt:
            pool.shutdown()  # stop the searches in flight; what is written is complete
            raise
        finally:
            restore_handler()
        if queue:
            raise WorkersLostError(f"all {len(pool.actors)} Ray workers are gone (each died more than "
                                   f"{pool.max_restarts} times); {len(queue)} problems are not solved (last error: "
                                   f"{queue[0].errors[-1] if queue[0].errors else 'none'}); "
                                   f"fix the cause and run again with --resume")
    return recorder.write_summary(pool.model_names)


def _overdue(in_flight: dict, started: dict, now: float, timeout_s: float,
             life: dict[int, int]) -> tuple[list, set[int], set]:
    """(searches past `timeout_s`, actors to replace for them, searches to spare). An actor's running call
    cannot be cancelled, so ending a late search replaces its actor, unless it died and is restarting
    already (its life moved on); the other searches in flight on a replaced actor end through no fault
    of their own, so they are spared: sent again without losing an attempt."""
    late = [r for r, (_, _, job) in in_flight.items() if job is not None and now - started[r] > timeout_s]
    killed = {worker for worker, born, _ in map(in_flight.get, late) if born == life[worker]}
    spared = {r for r, (worker, born, job) in in_flight.items()
              if job is not None and r not in late and worker in killed and born == life[worker]}
    return late, killed, spared


def _lost_attempt(task: Task, job: _Job, worker: int, err: Exception, queue: deque[_Job],
                  recorder: ResultsRecorder, max_attempts: int) -> None:
    job.attempts += 1
    job.died_on.add(worker)
    job.errors.append(f"worker {worker}: {type(err).__name__}: {_first_line(err)}")
    if job.attempts >= max_attempts:
        log.error("problem %s: its Ray worker died %d times; recorded as failed", job.example.id, job.attempts)
        recorder.add(_failed_record(task, job))
    else:
        log.warning("problem %s: Ray worker %d died (%s); retrying it", job.example.id, worker, type(err).__name__)
        queue.appendleft(job)


def _first_line(err: Exception) -> str:
    lines = str(err).strip().splitlines()
    return lines[0] if lines else ""


def solve_on_ray(address: str, spec: EngineSpec, task: Task, examples: Sequence[Example], *, settings: RunSettings,
                 output_dir: str | Path, resume: bool = False, workers: int | None = None,
                 gpus_per_worker: float | None = None, cpus_per_worker: float = 1.0,
                 concurrency: int = 1, search_timeout_s: float | None = None,
                 data: dict[str, Any] | None = None) -> dict[str, Any]:
    """The `seed-tot solve --ray` path: connect, start the pool, solve, stop the actors.

    workers None: as many as the cluster fits. gpus_per_worker None: 1 when the cluster has GPUs.
    concurrency: searches at once per actor (`solve --concurrency` on each actor's engine).
    """
    examples = check_examples(task, examples, given_by="solve_on_ray was given")  # before any actor starts
    ray = import_ray()
    connect_ray(address)
    resources = ray.cluster_resources()
    gpus = resources.get("GPU", 0.0)
    if gpus_per_worker is None:
        gpus_per_worker = 1.0 if gpus else 0.0
    if workers is None:
        if gpus_per_worker:
            workers = max(1, int(gpus // gpus_per_worker))
        else:
            workers = max(1, int(resources.get("CPU", 1.0) // max(cpus_per_worker, 1e-9)))
        log.info("--workers not given: %d, as many as the cluster fits", workers)
    if gpus_per_worker * workers > gpus or cpus_per_worker * workers > resources.get("CPU", 0.0):
        # Ray would wait forever for the actors that do not fit
        raise RayRunError(f"{workers} workers with {cpus_per_worker} CPU and {gpus_per_worker} GPU each do not fit "
                          f"the cluster ({resources.get('CPU', 0.0):g} CPU, {gpus:g} GPU)")
    with EnginePool(spec, workers, gpus_per_worker=gpus_per_worker, cpus_per_worker=cpus_per_worker,
                    concurrency=concurrency) as pool:
        return solve_dataset_ray(pool, task, examples, settings=settings, output_dir=output_dir, resume=resume,
                                 search_timeout_s=search_timeout_s, data=data)
