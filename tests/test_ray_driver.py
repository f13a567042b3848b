"""The Ray driver's bookkeeping that needs no cluster (test_ray_solve.py runs it on real actors)."""
from __future__ import annotations

from seed_tot.search.distributed import _Job, _overdue
from seed_tot.search.protocol import Example


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
