"""The task protocol: what a user implements to run tree-of-thoughts on their own problem.

World model and search are kept apart (after llm-reasoners): a `Task` knows its prompts, how a
thought extends a state, how to read a value and how to score an answer; the search algorithms
(`bfs`, `dfs`) know nothing about any task; every LLM call goes through `Engine.generate`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence, runtime_checkable


@dataclass(frozen=True)
class Example:
    id: str
    data: dict[str, Any]  # the raw record (question, gold answer, ...)


class DuplicateIdError(ValueError):
    """Two examples (or predictions) share one id; results are keyed by id, so one would be lost."""


def check_unique_ids(ids: Sequence[str], where: Sequence[str]) -> None:
    """Raise DuplicateIdError naming both places (`where[i]`, e.g. "file:line") of the first id
    that appears twice."""
    first: dict[str, int] = {}
    for i, example_id in enumerate(ids):
        j = first.setdefault(example_id, i)
        if j != i:
            raise DuplicateIdError(f"{where[j]} and {where[i]}: both have id {example_id!r}; ids must be unique "
                                   f"(rename one, e.g. with a suffix)")


@dataclass(frozen=True)
class State:
    """A node of the thought tree: the thoughts taken so far, root first."""

    thoughts: tuple[str, ...] = ()

    @property
    def depth(self) -> int:
        return len(self.thoughts)


@dataclass(frozen=True)
class Prompt:
    """A user message plus the start of the assistant's reply (the chat template goes between),
    and the stop strings that end this kind of call."""

    user: str
    assistant_prefix: str = ""
    stop: tuple[str, ...] = ()
    max_new_tokens: int | None = None  # None: the search config's default

    def __post_init__(self) -> None:
        # Checked where the task builds it, so a mistake points at the task's own line. One stop
        # string is one stop: read as a sequence, stop="\n\n" stopped at every "\n" and "END" at
        # every "E", "N" and "D".
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif isinstance(self.stop, (list, tuple)):
            object.__setattr__(self, "stop", tuple(self.stop))
        else:
            raise TypeError(f"Prompt stop must be a string or a tuple of strings, got {self.stop!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"Prompt stop strings must be non-empty strings, got {self.stop!r}")
        for name in ("user", "assistant_prefix"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"Prompt {name} must be a string, got {getattr(self, name)!r}")
        budget = self.max_new_tokens
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
            raise ValueError(f"Prompt max_new_tokens must be a positive integer or None (the run's), got {budget!r}")


@dataclass
class SearchConfig:
    """The ToT setup of a task (the SEED paper's Appendix C); YAML in configs/ overrides it."""

    depth: int = 4  # thought steps before the final answer
    n_generate: int = 3  # thoughts sampled per frontier state (same prompt)
    breadth: int = 1  # b: states kept per step
    temperature: float = 1.0
    # sampled calls draw each token at a uniform keyed by its seed and position (engine/keyed_draws.py):
    # the same tokens in every mode and policy, so that modes compare on the same text
    draft_invariant: bool = False
    max_new_tokens: int = 128
    value_threshold: float = 5.0  # DFS prunes states valued below this
    extra: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Task(Protocol):
    name: str
    config: SearchConfig

    def load(self, path: str | None = None, limit: int | None = None, offset: int = 0) -> list[Example]:
        """Examples from a local file (the formats of ../shared/data) or the task's Hub dataset."""

    def thought_prompt(self, example: Example, state: State) -> Prompt:
        """The prompt whose completion is the next thought after `state` (n samples are drawn)."""

    def extend(self, state: State, thought: str) -> State:
        """The state reached by taking `thought` (usually appends the cleaned-up thought)."""

    def value_prompt(self, example: Example, state: State) -> Prompt:
        """The prompt that asks the model to rate `state`."""

    def parse_value(self, text: str) -> float:
        """A number from the evaluator's reply (1-10 score, sure/likely/impossible, good/bad...)."""

    def is_final(self, example: Example, state: State) -> bool:
        """True when the state needs no more thoughts (a solved puzzle, a finished plan)."""

    def answer_prompt(self, example: Example, state: State) -> Prompt:
        """The prompt whose completion is the final answer, from the best state."""

    def prediction(self, example: Example, state: State, answer: str) -> str:
        """The prediction saved for scoring, from the best state and the answer completion."""

    def score(self, example: Example, prediction: str) -> dict[str, Any]:
        """{"correct": bool} (accuracy tasks) or {"score": float, ...}; rescoring uses only this."""
