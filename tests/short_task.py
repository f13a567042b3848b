"""A real ToT task with prompts of a few characters, shared by the tests that solve whole datasets
on tiny models (Ray, concurrency)."""
from __future__ import annotations

import json
from pathlib import Path

from seed_tot.search.protocol import Example, Prompt, SearchConfig, State


class ShortTask:
    """A real ToT task with prompts of a few characters, so tiny models answer in milliseconds
    (the built-in tasks' few-shot prompts take a tiny model seconds per call on a busy CPU):
    thoughts are free text, a state's value is the count of vowels in the model's rating reply."""

    name = "short"

    def __init__(self):
        self.config = SearchConfig(depth=2, n_generate=2, breadth=1, max_new_tokens=6)

    def load(self, path: str | None = None, limit: int | None = None, offset: int = 0) -> list[Example]:
        rows = [json.loads(line) for line in Path(path).read_text().splitlines()]
        rows = rows[offset:None if limit is None else offset + limit]
        return [Example(id=str(offset + i), data=row) for i, row in enumerate(rows)]

    def thought_prompt(self, example: Example, state: State) -> Prompt:
        return Prompt(user=f"{example.data['question']}:{'/'.join(state.thoughts)}")

    def extend(self, state: State, thought: str) -> State:
        return State(state.thoughts + (thought,))

    def value_prompt(self, example: Example, state: State) -> Prompt:
        return Prompt(user=f"rate {example.data['question']}:{'/'.join(state.thoughts)}", max_new_tokens=3)

    def parse_value(self, text: str) -> float:
        return float(sum(c in "aeiou" for c in text))

    def is_final(self, example: Example, state: State) -> bool:
        return False

    def answer_prompt(self, example: Example, state: State) -> Prompt:
        return Prompt(user=f"answer {example.data['question']}:{'/'.join(state.thoughts)}", max_new_tokens=4)

    def prediction(self, example: Example, state: State, answer: str) -> str:
        return answer.strip()

    def score(self, example: Example, prediction: str) -> dict:
        return {"correct": prediction == example.data["answer"]}
