"""ToT-BFS, the SEED paper's Algorithm 1.

    S_0 = {x}
    for t = 1..T:
        S'_t = {[s, z] : s in S_{t-1}, z ~ G(p, s, n)}     # thought generation, one engine call
        V_t  = V(p, S'_t)                                  # state evaluation, one engine call
        S_t  = top-b of S'_t by V_t
    return G(p, argmax_{s in S_T} V_T(s), 1)               # the answer

Two additions that change nothing for a task without them: states the task calls final are not
expanded again (the search stops once every kept state is final, and with b > 1 a final state
stays a candidate with its value), and a task's `prior_value` can value a state without the model.
"""
from __future__ import annotations

import logging

from .expansion import (SearchResult, evaluate_states, generate_thoughts, rank_by_value, state_to_json,
                        task_is_final, write_answer)
from .llm import LLMCaller
from .protocol import Example, SearchConfig, State, Task

log = logging.getLogger(__name__)


def bfs(caller: LLMCaller, task: Task, example: Example, config: SearchConfig) -> SearchResult:
    frontier: list[State] = [State()]
    frontier_values: list[float | None] = [None]
    steps: list[dict] = []
    expanded = 0
    for step in range(config.depth):
        final = [task_is_final(task, example, state) for state in frontier]
        open_idx = [i for i, is_final in enumerate(final) if not is_final]
        if not open_idx:
            break
        thoughts, new_states = generate_thoughts(caller, task, example, [frontier[i] for i in open_idx],
                                                 config.n_generate)
        expanded += len(open_idx)
        values = evaluate_states(caller, task, example, new_states)
        parents = [i for i in open_idx for _ in range(config.n_generate)]

        # final frontier states compete again with their old value, as themselves (thought None)
        carried = [i for i, is_final in enumerate(final) if is_final]
        candidates = new_states + [frontier[i] for i in carried]
        candidate_values = values + [frontier_values[i] or 0.0 for i in carried]
        candidate_thoughts: list[str | None] = list(thoughts) + [None] * len(carried)
        parents += carried

        kept = rank_by_value(candidate_values)[:config.breadth]
        steps.append({
            "step": step,
            "frontier": [state_to_json(s) for s in frontier],
            "thoughts": candidate_thoughts,
            "parents": parents,  # index into "frontier" of each new state
            "new_states": [state_to_json(s) for s in candidates],
            "values": candidate_values,
            "kept": kept,
        })
        log.debug("step %d: %d candidates, kept %s with values %s", step, len(candidates), kept,
                  [candidate_values[i] for i in kept])
        frontier = [candidates[i] for i in kept]
        frontier_values = [candidate_values[i] for i in kept]
        if all(task_is_final(task, example, state) for state in frontier):
            break

    best, best_value = frontier[0], frontier_values[0]  # kept states are sorted best first
    answer, prediction = write_answer(caller, task, example, best)
    return SearchResult(prediction=prediction, state=best, answer=answer, value=best_value, steps=steps,
                        expanded=expanded)
