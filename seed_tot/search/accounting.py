"""What a problem cost, so that algorithms compare at equal tokens.

Every record carries "cost": the new tokens generated, the prompt tokens the target scored
(prefill; stretches a cache already held cost nothing), the engine calls made and the wall time of
the problem; summary.json carries their means. `wilson` gives accuracy's
95% interval for `seed-tot compare`.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

COST_FIELDS = ("new_tokens", "prompt_tokens", "engine_calls", "wall_s")


def problem_cost(phase_stats: Mapping[str, Mapping[str, Any]], engine_calls: int, wall_s: float) -> dict[str, Any]:
    """A record's "cost", from its per-phase counters (GenerationStats.to_dict per phase)."""
    return {
        "new_tokens": int(sum(s.get("new_tokens", 0) for s in phase_stats.values())),
        "prompt_tokens": round(float(sum(s.get("target_prefill_tokens", 0.0) for s in phase_stats.values())), 3),
        "engine_calls": int(engine_calls),
        "wall_s": wall_s,
    }


def summarize_costs(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Mean new tokens, prompt tokens and engine calls per problem over the records that carry a
    cost (older records do not). The mean wall time is summary.json's mean_wall_s already."""
    costs = [r["cost"] for r in records if isinstance(r.get("cost"), Mapping)]
    if not costs:
        return {}
    return {f"mean_{name}": sum(float(c.get(name, 0.0)) for c in costs) / len(costs)
            for name in COST_FIELDS if name != "wall_s"}


def problems_per_hour(mean_wall_s: float | None, sittings: Sequence[Mapping[str, Any]] = ()) -> float | None:
    """Problems solved over the solving wall time of the run's sittings (summary.json; a concurrent
    sitting solves several problems in one stretch of time); a run summarised before sittings
    were recorded: 3600 / the mean wall time per problem, one problem at a time."""
    solved = sum(int(s.get("solved", 0)) for s in sittings)
    wall = sum(float(s.get("wall_s", 0.0)) for s in sittings)
    if solved and wall > 0:
        return 3600.0 * solved / wall
    return 3600.0 / mean_wall_s if mean_wall_s else None


def wilson(successes: float, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The Wilson score interval of a proportion (95% by default); (0, 1) with no trials.
    Unlike the normal approximation it stays inside [0, 1] at 0/n and n/n, common on 15 problems."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)
