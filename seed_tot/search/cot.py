"""Chain-of-thought and self-consistency: the ToT paper's baselines over the same `Task`.

    CoT:     one chain written step by step: the task's `cot_prompt(example)` where it has one
             (GSM8K's asks for every step and the answer in one reply), else its answer prompt
             from the root state (Blocksworld's writes the whole plan)
    CoT-SC:  k chains of that one prompt in ONE engine call (n samples of one prompt, the case
             SEED's first scenario batches), each parsed by the task's `prediction`; the answer
             is the majority prediction, ties going to the one first seen

The tree record is one step under the question: each chain a node, its value the votes its
prediction got, "kept" the chains that voted for the winner (first first), and the vote itself
("predictions" per chain, "votes" per prediction) for the tree page.
"""
from __future__ import annotations

from collections import Counter

from .expansion import SearchResult, TaskMethodError, task_prediction
from .llm import LLMCaller
from .protocol import Example, Prompt, State, Task


def majority(predictions: list[str]) -> tuple[str, Counter[str]]:
    """The most common prediction (ties: the earliest chain's) and every prediction's count."""
    votes = Counter(predictions)  # a Counter keeps first-seen order, and max() returns the first maximum
    return max(votes, key=lambda p: votes[p]), votes


def chain_prompt(task: Task, example: Example) -> Prompt:
    """The task's optional `cot_prompt(example)`, else its answer prompt from the empty state."""
    cot_prompt = getattr(task, "cot_prompt", None)
    return cot_prompt(example) if callable(cot_prompt) else task.answer_prompt(example, State())


def chain_prediction(task: Task, example: Example, chain: str) -> str:
    """The task's optional `cot_prediction(example, chain)` (the pair of `cot_prompt`), else its
    prediction from the empty state."""
    cot_prediction = getattr(task, "cot_prediction", None)
    if callable(cot_prediction) and callable(getattr(task, "cot_prompt", None)):
        prediction = cot_prediction(example, chain)
        if not isinstance(prediction, str):
            raise TaskMethodError(f"task {task.name!r}: cot_prediction returned {prediction!r}; it must return a string")
        return prediction
    return task_prediction(task, example, State(), chain)


def self_consistency(caller: LLMCaller, task: Task, example: Example, samples: int) -> SearchResult:
    if samples < 1:
        raise ValueError(f"samples must be at least 1, got {samples}")
    root = State()
    chains = caller.complete([chain_prompt(task, example)] * samples, phase="answer")
    predictions = [chain_prediction(task, example, chain) for chain in chains]
    winner, votes = majority(predictions)
    chosen = predictions.index(winner)
    step = {
        "step": 0,
        "frontier": [[]],
        "thoughts": list(chains),
        "parents": [0] * samples,
        "new_states": [[chain] for chain in chains],
        "values": [float(votes[p]) for p in predictions],
        "kept": [i for i, p in enumerate(predictions) if p == winner],
        "predictions": predictions,
        "votes": dict(votes),
    }
    return SearchResult(prediction=winner, state=root, answer=chains[chosen], value=float(votes[winner]),
                        steps=[step], expanded=0)


def cot(caller: LLMCaller, task: Task, example: Example) -> SearchResult:
    return self_consistency(caller, task, example, samples=1)
