"""The Ray driver's bookkeeping that needs no cluster (test_ray_solve.py runs it on real actors)."""
from __future__ import annotations

import json
import math
import sys
import types

import pytest
from short_task import ShortTask

from seed_tot.search import distributed, load_settings
from seed_tot.search.distributed import _Job, _overdue, solve_dataset_ray
from seed_tot.search.protocol import Example
from seed_tot.search.solve import ResultsRecorder


def test_a_late_search_restarts_its_actor_and_spares_only_that_actors_other_searches_of_the_same_life():
    """Actor 1 (life 0) runs a search past the limit and a young one; actor 0 runs a young one and a late one
    from before its restart (life 1 now: it is restarting already, so it is not killed again)."""
    job = {name: _Job(Example(id=name, data={})) for name in ("late1", "young1", "young0", "old0")}
    in_flight = {"r-late1": (1, 0, job["late1"]), "r-young1": (1, 0, job["young1"]),
                 "r-young0": (0, 1, job["young0"]), "r-old0": (0, 0, job["old0"]),
                 "r-probe0": (0, 1, None)}  # a restart probe: never late, never spared
    started = {"r-late1": 0.0, "r-young1": 9.0, "r-young0": 9.0, "r-old0": 0.0}
    late, killed, spared = _overdue(in_flight, started, now=11.0, timeout_s=10.0, life={0: 1, 1: 0})
    assert sorted(late) == ["r-late1", "r-old0"]
    assert killed == {1}  # actor 0's late search ran on a life that has ended already
    assert spared == {"r-young1"}  # actor 0's young search runs on, its actor untouched
    assert _overdue(in_flight, started, now=9.5, timeout_s=10.0, life={0: 1, 1: 0}) == ([], set(), set())


class SimulatedRay(types.ModuleType):
    """Just enough of `ray` for the driver loop, on a simulated clock: a search ends `solve_s` after it
    starts, or never for an id in `hang_ids`; a killed actor's calls fail at once."""

    def __init__(self):
        super().__init__("ray")
        self.t, self.kills = 0.0, []

    def monotonic(self) -> float:
        return self.t

    def put(self, value):
        return value

    def wait(self, refs, num_returns=1, timeout=None):
        soonest = min(refs, key=lambda r: r.done_at)
        if soonest.done_at <= self.t + timeout:
            self.t = max(self.t, soonest.done_at)
            return [soonest], [r for r in refs if r is not soonest]
        self.t += timeout
        return [], list(refs)

    def get(self, ref):
        if ref.error is not None:
            raise ref.error
        return ref.value

    def kill(self, actor, no_restart=True):
        self.kills.append((actor.index, self.t))
        for ref in actor.refs:
            if ref.done_at > self.t:
                ref.done_at, ref.error = self.t, ActorDied("killed")


class ActorDied(Exception):
    pass


class Ref:
    def __init__(self, done_at, value=None):
        self.done_at, self.value, self.error = done_at, value, None


class SimulatedActor:
    def __init__(self, ray: SimulatedRay, index: int, hang_ids: set[str], solve_s: float = 0.5, start_s: float = 2.0):
        self.ray, self.index, self.hang_ids, self.solve_s = ray, index, hang_ids, solve_s
        self.up_at, self.refs = ray.t + start_s, []  # a new actor loads its engine first
        self.solve = types.SimpleNamespace(remote=self._solve)
        self.ready = types.SimpleNamespace(options=lambda **_: types.SimpleNamespace(remote=self._ready))
        # the draft policy the actor's engine runs, for run.json (None: the simulated engine drafts nothing)
        self.policy_name = types.SimpleNamespace(remote=lambda settings: Ref(max(self.ray.t, self.up_at)))

    def _ready(self):
        return self._call(Ref(max(self.ray.t, self.up_at)))

    def _solve(self, task, settings, algorithm, example):
        begin = max(self.ray.t, self.up_at)
        done = math.inf if example.id in self.hang_ids else begin + self.solve_s
        record = {"id": example.id, "input": example.data, "prediction": "", "correct": False, "stats": {},
                  "wall_s": 0.0, "actor": id(self)}
        return self._call(Ref(done, record))

    def _call(self, ref: Ref) -> Ref:
        self.refs.append(ref)
        return ref


class SimulatedPool:
    def __init__(self, ray: SimulatedRay, workers: int, concurrency: int, hang_ids: set[str]):
        self.ray, self.hang_ids, self.concurrency = ray, hang_ids, concurrency
        self.actors = [SimulatedActor(ray, i, hang_ids, start_s=0.0) for i in range(workers)]
        self.retired, self.alive, self.max_restarts = set(), True, 3
        self.model_names = {"target": "t", "draft": "d"}

    def replace(self, worker: int) -> None:
        self.ray.kill(self.actors[worker], no_restart=True)
        self.actors[worker] = SimulatedActor(self.ray, worker, self.hang_ids)

    def shutdown(self) -> None:
        self.alive = False


@pytest.fixture
def simulated_ray(monkeypatch):
    ray = SimulatedRay()
    exceptions = types.ModuleType("ray.exceptions")
    exceptions.RayActorError = ActorDied
    for name in ("OutOfMemoryError", "RayTaskError", "WorkerCrashedError"):
        setattr(exceptions, name, type(name, (Exception,), {}))
    ray.exceptions = exceptions
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.setitem(sys.modules, "ray.exceptions", exceptions)
    monkeypatch.setattr(distributed, "time", types.SimpleNamespace(monotonic=ray.monotonic))
    return ray


@pytest.mark.parametrize("workers, concurrency", [(2, 1), (1, 2)])
def test_a_hung_search_is_stopped_at_its_limit_while_other_searches_keep_finishing(simulated_ray, tmp_path,
                                                                                   workers, concurrency):
    """The limit was checked only when a one-second wait came back empty: with results arriving every
    half second (another actor, or the hung search's own actor's other slot) the hung search ran until
    the queue drained."""
    task = ShortTask()
    examples = [Example(id="hang", data={"question": "q", "answer": "1"})] + [
        Example(id=f"e{i}", data={"question": f"q{i}", "answer": "1"}) for i in range(40)]
    pool = SimulatedPool(simulated_ray, workers, concurrency, {"hang"})
    settings = load_settings(None, base=task.config)
    with pytest.MonkeyPatch.context() as patch:  # the simulated records carry no search to summarise
        patch.setattr(ResultsRecorder, "write_summary", lambda self, *a, **k: {})
        solve_dataset_ray(pool, task, examples, settings=settings, output_dir=tmp_path, search_timeout_s=5.0)
    assert simulated_ray.kills and simulated_ray.kills[0][1] <= 5.0 + 1.0  # found within one wake-up
    records = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in records) == sorted(ex.id for ex in examples)  # each once
    hung = next(r for r in records if r["id"] == "hang")
    assert hung["error"] == "worker 0: timed out after 5 s" and hung["attempts"] == 1
    assert not any("error" in r for r in records if r["id"] != "hang")  # the spared sibling lost nothing
