"""The search algorithms a run can name, and the run settings each one reads.

One place maps `--algorithm` to its module (bfs.py, dfs.py, cot.py, mcts.py), so that solve.py,
the Ray workers and the run identity (a resume compares only the options the algorithm reads)
agree on what an algorithm is.
"""
from __future__ import annotations

from typing import Any

from .bfs import bfs
from .cot import cot, self_consistency
from .dfs import dfs
from .expansion import SearchResult
from .llm import LLMCaller
from .mcts import MCTSConfig, mcts
from .protocol import Example, Task

ALGORITHMS = ("bfs", "dfs", "cot", "cot-sc", "mcts")

# the RunSettings fields an algorithm reads besides the task's SearchConfig; the other
# algorithms' options do not change its records
OPTIONS: dict[str, tuple[str, ...]] = {
    "dfs": ("max_expansions",),
    "cot-sc": ("samples",),
    "mcts": ("iterations", "exploration", "parallel_leaves", "mcts_answer"),
}
ALL_OPTIONS = tuple(name for names in OPTIONS.values() for name in names)


def unread_options(algorithm: str) -> tuple[str, ...]:
    """The algorithm options `algorithm` never reads."""
    return tuple(name for name in ALL_OPTIONS if name not in OPTIONS.get(algorithm, ()))


def check_algorithm(algorithm: Any) -> str:
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown search algorithm {algorithm!r}; expected one of {', '.join(ALGORITHMS)}")
    return algorithm


def run_search(caller: LLMCaller, task: Task, example: Example, settings: Any,
               algorithm: str) -> SearchResult:
    """`settings`: the run's RunSettings (config.py imports this module, so it is not named here)."""
    check_algorithm(algorithm)
    if algorithm == "bfs":
        return bfs(caller, task, example, settings.search)
    if algorithm == "dfs":
        return dfs(caller, task, example, settings.search, max_expansions=settings.max_expansions)
    if algorithm == "cot":
        return cot(caller, task, example)
    if algorithm == "cot-sc":
        return self_consistency(caller, task, example, settings.samples)
    return mcts(caller, task, example, settings.search,
                MCTSConfig(iterations=settings.iterations, exploration=settings.exploration,
                           parallel_leaves=settings.parallel_leaves, answer=settings.mcts_answer))
