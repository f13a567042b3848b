"""The pieces BFS and DFS share: expand states into thoughts, value states, write the answer.

Each helper makes at most one `LLMCaller.complete` call, so a search step costs exactly one
thought call and one value call -- the two batches the SEED scheduler accelerates.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from .llm import LLMCaller
from .protocol import Example, State, Task

log = logging.getLogger(__name__)

# Official ToT gives a state that repeats an earlier candidate of the same step value 0, so the
# copy is neither paid for nor kept twice; a value under every scale we use (0.001 is "impossible").
DUPLICATE_VALUE = 0.0


@dataclass
class SearchResult:
    prediction: str
    state: State  # the state the answer was written from
    answer: str  # the raw answer completion
    value: float | None  # that state's value (None: the root, never valued)
    steps: list[dict[str, Any]] = field(default_factory=list)  # the per-step tree log (JSON-ready)
    expanded: int = 0  # states whose thoughts were generated

    def to_dict(self) -> dict[str, Any]:
        return {"prediction": self.prediction, "state": state_to_json(self.state), "answer": self.answer,
                "value": self.value, "expanded": self.expanded, "steps": self.steps}


def state_to_json(state: State) -> list[str]:
    return list(state.thoughts)


def generate_thoughts(caller: LLMCaller, task: Task, example: Example, frontier: Sequence[State],
                      n_generate: int) -> tuple[list[str], list[State]]:
    """n thoughts per frontier state in one engine call: each state's prompt repeated n times
    (the "same prompt, many samples" case), parent-major order."""
    prompts = [task.thought_prompt(example, state) for state in frontier for _ in range(n_generate)]
    thoughts = caller.complete(prompts, phase="thought")
    parents = [state for state in frontier for _ in range(n_generate)]
    new_states = [task.extend(parent, thought) for parent, thought in zip(parents, thoughts)]
    return thoughts, new_states


def evaluate_states(caller: LLMCaller, task: Task, example: Example, states: Sequence[State]) -> list[float]:
    """A value per state, all LLM-valued ones in one engine call (different prompts).

    A task's optional `prior_value(example, state)` settles a state without the model when it
    returns a number (an illegal move, a solved puzzle); repeated states get DUPLICATE_VALUE.
    """
    prior_value = getattr(task, "prior_value", None)
    values: list[float | None] = [None] * len(states)
    to_ask: list[int] = []
    seen: set[State] = set()
    for i, state in enumerate(states):
        if state in seen:
            values[i] = DUPLICATE_VALUE
            continue
        seen.add(state)
        prior = prior_value(example, state) if prior_value is not None else None
        if prior is not None:
            values[i] = task_value(task, "prior_value", prior)
        else:
            to_ask.append(i)
    replies = caller.complete([task.value_prompt(example, states[i]) for i in to_ask], phase="value")
    for i, reply in zip(to_ask, replies):
        values[i] = task_value(task, "parse_value", task.parse_value(reply))
    return [v if v is not None else DUPLICATE_VALUE for v in values]


def task_value(task: Task, method: str, value: Any) -> float:
    """A value a task's `method` returned, as a float, or an error naming the task and method. NaN
    is refused: every comparison with it is false, so ranking and pruning would keep states at
    random, and results.jsonl would hold a NaN that strict JSON readers reject."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"task {task.name!r}: {method} returned {value!r}; a value must be a number") from None
    if math.isnan(number):
        raise ValueError(f"task {task.name!r}: {method} returned NaN, which ranks against no other value; return a "
                         f"number (for what it cannot read, a deliberate one, e.g. the lowest of its scale)")
    return number


def write_answer(caller: LLMCaller, task: Task, example: Example, state: State) -> tuple[str, str]:
    """(answer completion, prediction) from the chosen state."""
    answer = caller.complete([task.answer_prompt(example, state)], phase="answer")[0]
    return answer, task.prediction(example, state, answer)


def rank_by_value(values: Sequence[float]) -> list[int]:
    """Indices from best to worst; `sorted` is stable, so equal values keep their order."""
    return sorted(range(len(values)), key=lambda i: -values[i])
