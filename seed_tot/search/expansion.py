"""The pieces BFS and DFS share: expand states into thoughts, value states, write the answer.

Each helper makes at most one `LLMCaller.complete` call, so a search step costs exactly one
thought call and one value call -- the two batches the SEED scheduler accelerates.
"""
from __future__ import annotations

import inspect
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


class TaskMethodError(TypeError):
    """A task's method returned what the search cannot use; the message names where it is written.
    The command line prints it as one line (the traceback would end in seed_tot, not the task)."""


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
    wrong = [s for s in new_states if not isinstance(s, State)]
    if wrong:  # a tuple or str would fail later, far from the task, in its own methods
        raise TaskMethodError(f"{_at(task, 'extend')}task {task.name!r}: extend returned {type(wrong[0]).__name__} {wrong[0]!r}, not a State; "
                        f"return State(state.thoughts + (thought,))")
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
        raise TaskMethodError(f"{_at(task, method)}task {task.name!r}: {method} returned {value!r}; "
                              f"a value must be a number") from None
    if math.isnan(number):
        raise ValueError(f"task {task.name!r}: {method} returned NaN, which ranks against no other value; return a "
                         f"number (for what it cannot read, a deliberate one, e.g. the lowest of its scale)")
    return number


def write_answer(caller: LLMCaller, task: Task, example: Example, state: State) -> tuple[str, str]:
    """(answer completion, prediction) from the chosen state."""
    answer = caller.complete([task.answer_prompt(example, state)], phase="answer")[0]
    return answer, task_prediction(task, example, state, answer)


def task_prediction(task: Task, example: Example, state: State, answer: str) -> str:
    """task.prediction's string, or an error naming the task's method."""
    prediction = task.prediction(example, state, answer)
    if not isinstance(prediction, str):  # what results.jsonl saves and `seed-tot score` rescores as text
        raise TaskMethodError(f"{_at(task, 'prediction')}task {task.name!r}: prediction returned {prediction!r}; it must return a string")
    return prediction


def task_score(task: Task, example: Example, prediction: str) -> dict[str, Any]:
    """task.score's dict, or an error naming the task (anything else failed as "has no attribute 'items'")."""
    score = task.score(example, prediction)
    if not isinstance(score, dict):
        raise TaskMethodError(f"{_at(task, 'score')}task {task.name!r}: score returned {score!r}; it must return a dict such as "
                        f"{{\"correct\": bool}} or {{\"score\": float}}")
    return score


def task_is_final(task: Task, example: Example, state: State) -> bool:
    """task.is_final's answer, refused unless a bool: a string "no" would end the search as True."""
    final = task.is_final(example, state)
    if not isinstance(final, bool):
        raise TaskMethodError(f"{_at(task, 'is_final')}task {task.name!r}: is_final returned {final!r}; "
                              f"it must return True or False")
    return final


def rank_by_value(values: Sequence[float]) -> list[int]:
    """Indices from best to worst; `sorted` is stable, so equal values keep their order."""
    return sorted(range(len(values)), key=lambda i: -values[i])


def defined_at(task: Any, method: str) -> str:
    """Where the task's `method` is written, "FILE:LINE" (empty when Python cannot say), for errors."""
    try:
        function = inspect.unwrap(getattr(type(task), method))
        return f"{inspect.getsourcefile(function)}:{inspect.getsourcelines(function)[1]}"
    except (AttributeError, TypeError, OSError):
        return ""


def _at(task: Any, method: str) -> str:
    where = defined_at(task, method)
    return f"{where}: " if where else ""


def check_examples(task: Task, examples: Any, given_by: str | None = None) -> list[Example]:
    """`examples` refused unless a list of Example(id=str, data=dict): a dict or an integer id failed
    later as an AttributeError deep in the search, after the models loaded. given_by: who handed
    them over, as the error's subject (default: the task's `load`, at its file and line)."""
    if given_by is None:
        where = defined_at(task, "load")
        given_by = (f"{where}: " if where else "") + f"task {task.name!r}: load returned"
    expected = "expected a list of Example(id=str, data=dict) from seed_tot.search.protocol"
    if not isinstance(examples, (list, tuple)):
        raise TypeError(f"{given_by} {examples!r}; {expected}")
    for i, ex in enumerate(examples):
        if not isinstance(ex, Example):
            article = "an" if type(ex).__name__[0] in "aeiou" else "a"
            raise TypeError(f"{given_by} {article} {type(ex).__name__} at position {i} ({str(ex)[:80]}); {expected}")
        if not isinstance(ex.id, str):
            raise TypeError(f"{given_by} an Example with id {ex.id!r} ({type(ex.id).__name__}) at position {i}; "
                            f"an id must be a string (results.jsonl keys records by it), e.g. str({ex.id!r})")
        if not isinstance(ex.data, dict):
            raise TypeError(f"{given_by} an Example whose data is {type(ex.data).__name__} at position {i}; "
                            f"{expected}")
    return list(examples)
