"""ToT-DFS: depth-first search with value pruning and backtracking (the ToT paper's Algorithm 2).

Expanding a state costs one thought call (n samples of its prompt) and one value call; its
children are visited best first, those valued below `value_threshold` are pruned, and when no
child leads anywhere the search backtracks to the parent's next child. It stops at the first final
state, or after `max_expansions` expansions and then answers from the best state seen.
"""
from __future__ import annotations

import logging

from .expansion import (SearchResult, evaluate_states, generate_thoughts, rank_by_value, state_to_json,
                        task_is_final, write_answer)
from .llm import LLMCaller
from .protocol import Example, SearchConfig, State, Task

log = logging.getLogger(__name__)

DEFAULT_MAX_EXPANSIONS = 100  # ToT's crossword DFS stops after 100 steps


class DepthFirstSearch:
    def __init__(self, caller: LLMCaller, task: Task, example: Example, config: SearchConfig,
                 max_expansions: int):
        self.caller, self.task, self.example, self.config = caller, task, example, config
        self.max_expansions = max_expansions
        self.steps: list[dict] = []
        self.values: dict[State, float] = {}
        self.expanded = 0

    def visit(self, state: State) -> State | None:
        """The first final state found below `state`, or None (pruned, exhausted or out of budget)."""
        if task_is_final(self.task, self.example, state):
            return state
        if state.depth >= self.config.depth or self.expanded >= self.max_expansions:
            return None
        thoughts, children = generate_thoughts(self.caller, self.task, self.example, [state], self.config.n_generate)
        self.expanded += 1
        values = evaluate_states(self.caller, self.task, self.example, children)
        for child, value in zip(children, values):
            self.values.setdefault(child, value)  # keep the first value: later copies are duplicates
        kept = [i for i in rank_by_value(values) if values[i] >= self.config.value_threshold]
        self.steps.append({
            "step": len(self.steps),
            "depth": state.depth,
            "frontier": [state_to_json(state)],
            "thoughts": thoughts,
            "parents": [0] * len(children),
            "new_states": [state_to_json(c) for c in children],
            "values": values,
            "kept": kept,  # children visited, best first; the rest are pruned
        })
        for i in kept:
            found = self.visit(children[i])
            if found is not None:
                return found
            if self.expanded >= self.max_expansions:
                return None
        log.debug("backtracking from depth %d after %d expansions", state.depth, self.expanded)
        return None

    def best_seen(self) -> State:
        """The fallback when no final state was reached: highest value, then deepest."""
        if not self.values:
            return State()
        return max(self.values, key=lambda s: (self.values[s], s.depth))


def dfs(caller: LLMCaller, task: Task, example: Example, config: SearchConfig,
        max_expansions: int = DEFAULT_MAX_EXPANSIONS) -> SearchResult:
    if max_expansions < 1:
        raise ValueError(f"max_expansions must be at least 1, got {max_expansions}")
    search = DepthFirstSearch(caller, task, example, config, max_expansions)
    found = search.visit(State())
    if found is None:
        log.info("DFS on %s found no final state in %d expansions; answering from the best state seen",
                 example.id, search.expanded)
        found = search.best_seen()
    answer, prediction = write_answer(caller, task, example, found)
    return SearchResult(prediction=prediction, state=found, answer=answer, value=search.values.get(found),
                        steps=search.steps, expanded=search.expanded)
