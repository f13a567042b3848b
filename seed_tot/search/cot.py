"""Chain-of-thought and self-consistency: the ToT paper's baselines over the same `Task`.

    CoT:     one chain, the task's answer prompt from the root state, written step by step
    CoT-SC:  k chains of that one prompt in ONE engine call (n samples of one prompt, the case
             SEED's first scenario batches), each parsed by the task's `prediction`; the answer
             is the majority prediction, ties going to the one first seen

The tree record is one step under the question: each chain a node, its value the votes its
prediction got, "kept" the chains that voted for the winner (first first), and the vote itself
("predictions" per chain, "votes" per prediction) for the tree page.
"""
from __future__ import annotations

from collections import Counter

from .expansion import SearchResult, task_prediction
from .llm import LLMCaller
from .protocol import Example, State, Task


def majority(predictions: list[str]) -> tuple[str, Counter[str]]:
    """The most common prediction (ties: the earliest chain's) and every prediction's count."""
    votes = Counter(predictions)  # a Counter keeps first-seen order, and max() returns the first maximum
    return max(votes, key=lambda p: votes[p]), votes


def self_consistency(caller: LLMCaller, task: Task, example: Example, samples: int) -> SearchResult:
    if samples < 1:
        raise ValueError(f"samples must be at least 1, got {samples}")
    root = State()
    chains = caller.complete([task.answer_prompt(example, root)] * samples, phase="answer")
    predictions = [task_prediction(task, example, root, chain) for chain in chains]
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
