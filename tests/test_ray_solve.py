"""`solve --ray`: real Ray actors on a local cluster (2 CPUs) started once for this module.

The actors hold tiny random models built in code and saved as model directories (conftest's
`tiny_model_dirs`); the single-process reference loads the same directories. Faults are real:
an actor's engine ends its own process (os._exit) on a prompt holding a word named by a file in
a faults directory, so the driver sees a dead actor exactly as after an OOM kill.
"""
from __future__ import annotations

import _thread
import functools
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from seed_tot.cli import main
from seed_tot.search import apply_overrides, load_settings, solve_dataset
from seed_tot.search.distributed import EnginePool, EngineSpec, RayRunError, solve_dataset_ray, solve_on_ray
from seed_tot.search.protocol import Example, Prompt, State
from short_task import ShortTask

TESTS = Path(__file__).resolve().parent
PROBLEMS = [("apples", "7"), ("pens", "12"), ("pages", "84"), ("marbles", "3"), ("cookies", "24")]
WORDS = tuple(word for word, _ in PROBLEMS)  # one per problem, in all its prompts; faults name them
# Keys whose values are clock readings (seconds end in "_s"), ratios of them, or output paths:
# they legitimately differ between two runs of the same problems.
CLOCK_RATIOS = ("busy_fraction", "prefill_fraction", "cache_share")


class BrokenTask(ShortTask):
    """ShortTask whose rating prompt for the cookies problem raises, as a buggy task would."""

    def value_prompt(self, example: Example, state: State) -> Prompt:
        if "cookies" in example.data["question"]:
            raise ValueError("cannot rate cookies")
        return super().value_prompt(example, state)


class FaultyEngine:
    """A real engine that ends its own process on a prompt holding a word named by a file in
    `faults`: `once-WORD` (the first process to delete the file dies) or `always-WORD`; `stall-WORD`
    makes such a call take 30 s longer instead."""

    def __init__(self, engine, faults: str):
        self.engine, self.faults = engine, Path(faults)

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def generate(self, prompts, *args, **kwargs):
        for path in self.faults.iterdir():
            kind, _, word = path.name.partition("-")
            if not any(word in p for p in prompts):
                continue
            if kind == "stall":  # a long problem
                time.sleep(30)
                continue
            if kind == "once":
                try:
                    path.unlink()  # atomic: only one actor claims a once-fault
                except FileNotFoundError:
                    continue
            os._exit(1)
        return self.engine.generate(prompts, *args, **kwargs)


def faulty_engine(target: str, draft: str, faults: str) -> FaultyEngine:
    from seed_tot.engine import Engine
    return FaultyEngine(Engine.from_pretrained(target=target, draft=draft, device="cpu"), faults)


class PoolKeeper:
    """One pool of 2 actors at a time for the module (the cluster has 2 CPUs, so a test that needs
    other actors releases this pool first), running `concurrency` searches each; started again after
    a test stops it (Ctrl-C test) or asks for the other concurrency. Starting actors (each imports
    torch and loads both models) is most of this module's time, so the tests that share a concurrency
    come one after another and share its pool, dead actors restarted by Ray as in a real run."""

    def __init__(self, spec: EngineSpec, faults: Path):
        self.spec, self.faults, self.pool = spec, faults, None

    def get(self, concurrency: int = 1) -> EnginePool:
        if self.pool is None or not self.pool.alive or self.pool.concurrency != concurrency:
            self.release()
            self.pool = EnginePool(self.spec, 2, cpus_per_worker=1, concurrency=concurrency)
        return self.pool

    def release(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'seed-tot[ray]'")
    # actors unpickle FaultyEngine by reference, so they must import this module
    # and Ray's default worker niceness (15) starves them on a CPU shared with other test runs
    env = {"PYTHONPATH": os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p),
           "RAY_worker_niceness": "0"}
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        # log_to_driver=False: Ray's log monitor copies worker output (model-loading progress bars)
        # to whatever sys.stdout is when it gets round to it, which may be a later CLI test's capture
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level=logging.WARNING,
                 log_to_driver=False)
    except (ConnectionError, RuntimeError, OSError) as err:
        pytest.skip(f"Ray cannot start a local cluster on this machine: {err}")
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key)
            else:
                os.environ[key] = value
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def keeper(ray_cluster, tiny_model_dirs, tmp_path_factory):
    faults = tmp_path_factory.mktemp("faults")
    keeper = PoolKeeper(EngineSpec(factory=functools.partial(faulty_engine, *tiny_model_dirs, str(faults))), faults)
    yield keeper
    keeper.release()


@pytest.fixture(scope="module")
def problems(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "five.jsonl"
    path.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in PROBLEMS))
    task = ShortTask()
    return task, task.load(str(path)), str(path)


def settings_for(task, temperature: float):
    # the policy named: the actors run in other processes, where conftest's fixed chains do not reach,
    # and seed's CPU default (choose) decides from timing whether to draft, which changes sampled records
    return apply_overrides(load_settings(None, base=task.config), temperature=temperature, mode="seed",
                           draft_policy="fixed")


@pytest.fixture(scope="module")
def reference_engine(tiny_model_dirs):
    from seed_tot.engine import Engine
    target, draft = tiny_model_dirs
    return Engine.from_pretrained(target=target, draft=draft, device="cpu")


@pytest.fixture(scope="module")
def reference(reference_engine, problems, tmp_path_factory):
    """Single-process records and summary by temperature, each computed once."""
    task, examples, _ = problems
    runs = {}

    def run(temperature: float):
        if temperature not in runs:
            out = tmp_path_factory.mktemp(f"reference-{temperature}")
            summary = solve_dataset(reference_engine, task, examples, settings=settings_for(task, temperature),
                                    output_dir=out)
            runs[temperature] = (read_records(out), summary)
        return runs[temperature]
    return run


def read_records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def untimed(value):
    """A record or summary without its clocks (which legitimately differ between runs) and without
    its forward counts: seed batches whatever rows are ready (the default batch sizes), so how many
    forwards a search took depends on the searches it shared an engine with; tokens do not. Nor the
    CPU thread choice of a single-process run's engine, which follows the machine's load as clocks do,
    nor a sitting's concurrency (the workers that ran at once, not what they wrote)."""
    if isinstance(value, dict):
        return {k: untimed(v) for k, v in value.items()
                if not (k.endswith(("_s", "_forwards", "_forward")) or k.endswith(CLOCK_RATIOS)
                        or k in ("results", "cpu_threads", "concurrency"))}
    if isinstance(value, list):
        return [untimed(v) for v in value]
    return value


def by_id(records: list[dict]) -> dict[str, dict]:
    return {r["id"]: untimed(r) for r in records}


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_records_and_summary_equal_a_single_process_run(keeper, problems, reference, tmp_path, temperature):
    task, examples, _ = problems
    ref_records, ref_summary = reference(temperature)
    summary = solve_dataset_ray(keeper.get(), task, examples, settings=settings_for(task, temperature),
                                output_dir=tmp_path)
    records = read_records(tmp_path)
    assert by_id(records) == by_id(ref_records)
    assert untimed(summary) == untimed(ref_summary)
    assert untimed(json.loads((tmp_path / "summary.json").read_text())) == untimed(ref_summary)


def test_each_id_is_written_exactly_once(keeper, problems, tmp_path):
    task, examples, _ = problems
    doubled = examples + examples[:2]  # an input naming ids twice
    solve_dataset_ray(keeper.get(), task, doubled, settings=settings_for(task, 0.0), output_dir=tmp_path)
    ids = [r["id"] for r in read_records(tmp_path)]
    assert sorted(ids) == sorted(ex.id for ex in examples)


def test_resume_crosses_between_single_process_and_ray_both_ways(keeper, problems, reference, reference_engine,
                                                                 tmp_path):
    task, examples, _ = problems
    settings = settings_for(task, 1.0)
    ref_records, _ = reference(1.0)
    # single-process cut short after 2 problems, finished on Ray
    solve_dataset(reference_engine, task, examples[:2], settings=settings, output_dir=tmp_path / "a")
    solve_dataset_ray(keeper.get(), task, examples, settings=settings, output_dir=tmp_path / "a", resume=True)
    # Ray cut short after 2 problems and killed mid-write, finished in a single process
    solve_dataset_ray(keeper.get(), task, examples[:2], settings=settings, output_dir=tmp_path / "b")
    with (tmp_path / "b" / "results.jsonl").open("a") as fh:
        fh.write('{"id": "2", "input": {"quest')
    solve_dataset(reference_engine, task, examples, settings=settings, output_dir=tmp_path / "b", resume=True)
    for out in ("a", "b"):
        records = read_records(tmp_path / out)
        assert len(records) == len(examples)
        assert by_id(records) == by_id(ref_records)



class RenamedEngine:
    """An engine that names another target: what a run with another --target records."""

    def __init__(self, engine):
        self.engine, self.target_name = engine, "other-target"

    def __getattr__(self, name):
        return getattr(self.engine, name)


def test_a_resume_with_other_models_is_refused_both_ways_between_ray_and_single_process(
        keeper, problems, reference_engine, tmp_path):
    """The Ray driver recorded no model names, so records of one --target were resumed with another, either way."""
    task, examples, _ = problems
    settings = settings_for(task, 0.0)
    solve_dataset_ray(keeper.get(), task, examples[:1], settings=settings, output_dir=tmp_path / "ray")
    assert json.loads((tmp_path / "ray" / "run.json").read_text())["models"]["target"] == reference_engine.target_name
    with pytest.raises(ValueError, match="models.target"):
        solve_dataset(RenamedEngine(reference_engine), task, examples, settings=settings, output_dir=tmp_path / "ray",
                      resume=True)
    solve_dataset(RenamedEngine(reference_engine), task, examples[:1], settings=settings, output_dir=tmp_path / "one")
    with pytest.raises(ValueError, match="models.target"):
        solve_dataset_ray(keeper.get(), task, examples, settings=settings, output_dir=tmp_path / "one", resume=True)


def test_a_killed_actor_has_its_problem_retried_elsewhere(keeper, problems, reference, tmp_path, caplog):
    task, examples, _ = problems
    pool = keeper.get()
    fault = keeper.faults / "once-marbles"
    fault.touch()
    with caplog.at_level(logging.WARNING, logger="seed_tot.search.distributed"):
        solve_dataset_ray(pool, task, examples, settings=settings_for(task, 0.0), output_dir=tmp_path)
    assert not fault.exists()  # an actor really died on it
    assert any("retrying" in r.getMessage() for r in caplog.records)
    records = read_records(tmp_path)
    assert [r["id"] for r in records].count("3") == 1 and len(records) == len(examples)
    assert by_id(records) == by_id(reference(0.0)[0])


def solve_with_fault(pool, fault: Path, problems, out: Path, **options) -> tuple[dict, dict[str, dict]]:
    """A greedy Ray run with `fault` in place: its summary and records by id (every problem written once)."""
    task, examples, _ = problems
    fault.touch()
    try:
        summary = solve_dataset_ray(pool, task, examples, settings=settings_for(task, 0.0), output_dir=out, **options)
    finally:
        fault.unlink()
    records = {r["id"]: r for r in read_records(out)}
    assert sorted(records) == sorted(ex.id for ex in examples)
    return summary, records


def test_a_problem_that_kills_every_attempt_is_recorded_failed(keeper, problems, reference, tmp_path):
    task, examples, _ = problems
    pool = keeper.get()
    summary, records = solve_with_fault(pool, keeper.faults / "always-pens", problems, tmp_path, max_attempts=2)
    failed = records.pop("1")
    assert failed["attempts"] == 2 and "worker 0" in failed["error"] and "worker 1" in failed["error"]
    assert failed["correct"] is False and failed["prediction"] == ""
    reference_records = by_id(reference(0.0)[0])
    assert {i: untimed(r) for i, r in records.items()} == {i: reference_records[i] for i in records}
    assert summary["n"] == len(examples) and summary["failed"] == 1
    # what killed it is gone: a resume solves the failed problem again, in place of its failed record
    summary = solve_dataset_ray(pool, task, examples, settings=settings_for(task, 0.0), output_dir=tmp_path,
                                resume=True)
    again = read_records(tmp_path)
    assert sorted(r["id"] for r in again) == sorted(ex.id for ex in examples)
    assert by_id(again) == reference_records and "failed" not in summary


def test_an_error_in_the_search_stops_the_run_as_in_one_process(keeper, problems, tmp_path):
    _, examples, _ = problems
    task = BrokenTask()
    with pytest.raises(ValueError, match="cannot rate cookies"):
        solve_dataset_ray(keeper.get(), task, examples, settings=settings_for(task, 0.0), output_dir=tmp_path)
    assert all("cookies" not in r["input"]["question"] for r in read_records(tmp_path))  # every line complete


@pytest.mark.parametrize("ray_swallows_it", [False, True])
def test_ctrl_c_stops_the_actors_and_leaves_results_valid(keeper, problems, reference, reference_engine,
                                                          tmp_path, monkeypatch, ray_swallows_it):
    """ray_swallows_it: ray.wait loses the KeyboardInterrupt raised inside it (as Ray's core worker
    sometimes does): the driver still stops, from the Ctrl-C its handler recorded."""
    import ray
    task, examples, _ = problems
    pool = keeper.get()
    if ray_swallows_it:
        real_wait = ray.wait

        def swallowing_wait(refs, **kwargs):
            try:
                return real_wait(refs, **kwargs)
            except KeyboardInterrupt:
                return [], list(refs)  # as if it had timed out

        monkeypatch.setattr(ray, "wait", swallowing_wait)
    results = tmp_path / "results.jsonl"

    def interrupt_after_first_record():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (results.exists() and results.read_text().count("\n") >= 1):
            time.sleep(0.05)
        _thread.interrupt_main()  # what Ctrl-C does to the driver

    stalls = [keeper.faults / f"stall-{word}" for word in WORDS[2:]]  # so the run cannot end first
    for stall in stalls:
        stall.touch()
    # a terminal's Ctrl-C handling, whatever earlier tests in this process left installed (printed: shown on failure)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    print(f"SIGINT handler before this test: {previous!r}")
    threading.Thread(target=interrupt_after_first_record, daemon=True).start()
    try:
        with pytest.raises(KeyboardInterrupt):
            solve_dataset_ray(pool, task, examples, settings=settings_for(task, 0.0), output_dir=tmp_path)
    finally:
        signal.signal(signal.SIGINT, previous)
        for stall in stalls:
            stall.unlink()
    assert not pool.alive
    deadline = time.monotonic() + 30
    with pytest.raises(ray.exceptions.RayActorError):
        while time.monotonic() < deadline:  # ray.kill is asynchronous: a call sent right after it may still run
            ray.get(pool.actors[0].ready.remote(), timeout=30)
            time.sleep(0.1)
    written = read_records(tmp_path)  # every line parses
    assert 1 <= len(written) < len(examples) and len({r["id"] for r in written}) == len(written)
    solve_dataset(reference_engine, task, examples, settings=settings_for(task, 0.0), output_dir=tmp_path, resume=True)
    assert by_id(read_records(tmp_path)) == by_id(reference(0.0)[0])


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_actors_running_two_searches_each_write_single_process_records(keeper, problems, reference, tmp_path,
                                                                      temperature):
    task, examples, _ = problems
    summary = solve_dataset_ray(keeper.get(concurrency=2), task, examples, settings=settings_for(task, temperature),
                                output_dir=tmp_path)
    ref_records, ref_summary = reference(temperature)
    records = read_records(tmp_path)
    assert sorted(r["id"] for r in records) == sorted(ex.id for ex in examples)
    assert by_id(records) == by_id(ref_records)
    assert untimed(summary) == untimed(ref_summary)


def test_an_actor_dying_with_two_searches_in_flight_has_both_retried(keeper, problems, reference, tmp_path, caplog):
    task, examples, _ = problems
    pool = keeper.get(concurrency=2)
    fault = keeper.faults / "once-marbles"
    fault.touch()
    # slots are handed out worker 0, 1, 0, 1: worker 1 holds "pens" and "marbles" when marbles kills it
    with caplog.at_level(logging.WARNING, logger="seed_tot.search.distributed"):
        solve_dataset_ray(pool, task, examples, settings=settings_for(task, 0.0), output_dir=tmp_path)
    assert not fault.exists()
    retried = {r.getMessage().split(":")[0] for r in caplog.records if "retrying" in r.getMessage()}
    assert "problem 3" in retried
    records = read_records(tmp_path)
    assert sorted(r["id"] for r in records) == sorted(ex.id for ex in examples)  # each once, none lost
    assert by_id(records) == by_id(reference(0.0)[0])


def test_a_search_past_its_timeout_is_recorded_failed_and_its_actors_other_search_loses_no_attempt(
        keeper, problems, reference, tmp_path):
    """A hung search held its actor, and the run, for good. An actor call cannot be cancelled, so the
    actor is replaced; the search beside it on that actor is sent again, not charged an attempt."""
    task, examples, _ = problems
    pool = keeper.get(concurrency=2)
    # marbles stalls 30 s, against a 10 s limit
    summary, records = solve_with_fault(pool, keeper.faults / "stall-marbles", problems, tmp_path, search_timeout_s=10)
    failed = records.pop("3")
    assert failed["error"].endswith("timed out after 10 s") and failed["attempts"] == 1 and failed["correct"] is False
    reference_records = by_id(reference(0.0)[0])
    assert {i: untimed(r) for i, r in records.items()} == {i: reference_records[i] for i in records}
    assert summary["failed"] == 1
    solve_dataset_ray(pool, task, examples, settings=settings_for(task, 0.0), output_dir=tmp_path, resume=True)
    assert by_id(read_records(tmp_path)) == reference_records  # the new actor solves it on a resume


def test_cli_solve_on_ray_loads_models_from_their_directories(keeper, problems, reference, tiny_model_dirs,
                                                             tmp_path, monkeypatch):
    _, examples, data = problems
    target, draft = tiny_model_dirs
    monkeypatch.setattr("seed_tot.tasks.get_task", lambda name: ShortTask())
    keeper.release()  # the cluster's 2 CPUs go to the command's own 2 actors
    result = CliRunner().invoke(main, ["solve", "short", "--data", data, "--target", target, "--draft", draft,
                                       "--temperature", "1", "--device", "cpu", "--output", str(tmp_path),
                                       "--draft-policy", "fixed", "--ray", "--workers", "2", "--concurrency", "2",
                                       "--json"],
                                 catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["n"] == len(examples)
    assert by_id(read_records(tmp_path)) == by_id(reference(1.0)[0])  # same settings as the sampled reference


def test_more_workers_than_the_cluster_fits_is_refused_not_left_waiting(ray_cluster, problems, tmp_path):
    task, examples, _ = problems
    with pytest.raises(RayRunError, match="3 workers with 1.0 CPU .* do not fit the cluster \\(2 CPU"):
        solve_on_ray("auto", EngineSpec(), task, examples, settings=settings_for(task, 0.0), output_dir=tmp_path,
                     workers=3)


def test_workers_the_cluster_cannot_place_yet_are_waited_for_with_a_notice_not_in_silence(keeper, ray_cluster,
                                                                                           caplog):
    keeper.release()
    ray = ray_cluster

    @ray.remote(num_cpus=2)
    class Blocker:  # another job holding every CPU of the cluster
        def ping(self):
            return 1

    blocker = Blocker.remote()
    ray.get(blocker.ping.remote())
    threading.Timer(3.0, ray.kill, [blocker]).start()  # the other job ends a few seconds later
    with caplog.at_level(logging.WARNING, logger="seed_tot.search.distributed"):
        pool = EnginePool(keeper.spec, 1, cpus_per_worker=1, notice_s=0.5)
    pool.shutdown()
    notices = [r.getMessage() for r in caplog.records if "waiting for Ray workers" in r.getMessage()]
    assert notices and "0 of 1 ready" in notices[0] and "free" in notices[0]


def test_missing_ray_is_one_clear_line(monkeypatch, problems, tmp_path):
    monkeypatch.setattr("seed_tot.tasks.get_task", lambda name: ShortTask())
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    result = CliRunner().invoke(main, ["solve", "short", "--data", problems[2], "--output", str(tmp_path), "--ray"])
    assert result.exit_code != 0
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines == ["Error: Ray is not installed; --ray needs it: pip install 'seed-tot[ray]'"]


@pytest.mark.parametrize("option", [("--workers", "2"), ("--search-timeout", "60")], ids=lambda o: o[0])
def test_a_ray_option_without_ray_is_a_usage_error(tmp_path, option):
    result = CliRunner().invoke(main, ["solve", "gsm8k", "--output", str(tmp_path), *option])
    assert result.exit_code == 2 and option[0] in result.output and "--ray" in result.output


def test_a_sibling_search_failing_because_its_actor_is_exiting_counts_as_a_lost_process_not_a_search_error():
    from types import SimpleNamespace

    from seed_tot.search.distributed import _shutting_down

    try:
        try:
            raise RuntimeError("cannot schedule new futures after shutdown")
        except RuntimeError as inner:
            raise ValueError("search failed") from inner
    except ValueError as wrapped:
        assert _shutting_down(SimpleNamespace(cause=wrapped))
    assert not _shutting_down(SimpleNamespace(cause=ValueError("bad input on line 3")))
    assert not _shutting_down(SimpleNamespace(cause=None))


@pytest.mark.parametrize("algorithm", ["cot-sc", "mcts"])
def test_the_baselines_and_mcts_on_ray_write_single_process_records(keeper, problems, reference_engine, tmp_path,
                                                                     algorithm):
    """Sampled, so each search's draws must come from its problem's seed wherever it runs."""
    task, examples, _ = problems
    settings = apply_overrides(settings_for(task, 1.0), algorithm=algorithm, samples=3, iterations=3,
                               parallel_leaves=2)
    solve_dataset(reference_engine, task, examples, settings=settings, output_dir=tmp_path / "one")
    solve_dataset_ray(keeper.get(), task, examples, settings=settings, output_dir=tmp_path / "ray")
    assert by_id(read_records(tmp_path / "ray")) == by_id(read_records(tmp_path / "one"))
