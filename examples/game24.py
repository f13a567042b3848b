"""Game of 24 (the ToT paper's first task) as a custom seed-tot task; docs/custom_task.md walks
through it.

Puzzle: four numbers, e.g. "4 4 6 8"; reach 24 with + - * /, using each number exactly once.
  state   = the arithmetic steps so far; the numbers still left are in the last step's "(left: ...)"
  thought = one step, "a op b = c (left: ...)", combining two of the numbers left into one
  value   = the model's sure / likely / impossible that the numbers left can still reach 24,
            read as 20 / 1 / 0.001 (ToT's weights); `prior_value` settles illegal steps and the
            last number without the model
  answer  = one expression from the steps, e.g. "(6 - 4) * (4 + 8)"; `score` checks it exactly.

Run it:  python examples/game24.py   (the built-in puzzles on the default small model)
    or:  seed-tot solve examples/game24.py:Game24 --config examples/game24.yaml --output runs/game24
"""
from __future__ import annotations

import ast
import operator
import re
from collections import Counter
from fractions import Fraction
from typing import Any

from seed_tot.search.protocol import Example, Prompt, SearchConfig, State

# Three puzzles so the example runs without data (from the 4nums.com set that ToT uses); the
# prompts' worked examples use other numbers, so no puzzle's answer is in its own prompt.
PUZZLES = ("4 4 6 8", "1 1 4 6", "2 9 10 12")

THOUGHT_PROMPT = """Use numbers and basic arithmetic operations (+ - * /) to obtain 24. In each step, \
combine two of the remaining numbers into one. Write exactly one next step, in the form \
"a op b = c (left: ...)", listing every number that remains after it.

Input: 2 8 8 14
Next step: 14 - 8 = 6 (left: 2 6 8)

Input: 4 6 12
Next step: 12 / 4 = 3 (left: 3 6)

Input: {numbers}
Next step:"""

VALUE_PROMPT = """Evaluate if the given numbers can reach 24 with + - * /, using each number once. \
Reason briefly, then end with one word: sure, likely or impossible.

Numbers: 10 14
10 + 14 = 24. sure

Numbers: 11 12
11 + 12 = 23, 12 - 11 = 1, 11 * 12 = 132, 11 / 12 < 1. impossible

Numbers: 4 4 10
(10 - 4) * 4 = 24. sure

Numbers: 5 7 8
5 + 7 + 8 = 20, (8 - 5) * 7 = 21. Not 24 yet, but the numbers are in a reasonable range. likely

Numbers: 1 3 3
1 * 3 * 3 = 9, (1 + 3) * 3 = 12. All too small. impossible

Numbers: {numbers}
"""

ANSWER_PROMPT = """Use numbers and basic arithmetic operations (+ - * /) to obtain 24. Combine the \
steps into one expression that uses each input number exactly once.

Input: 4 9 10 13
Steps:
13 - 9 = 4 (left: 4 4 10)
10 - 4 = 6 (left: 4 6)
4 * 6 = 24 (left: 24)
Answer: (10 - 4) * (13 - 9) = 24

Input: {numbers}
Steps:
{steps}
"""

# ToT's value weights: one "sure" outweighs many "likely"s; "impossible" is nearly zero.
VALUES = {"sure": 20.0, "likely": 1.0, "impossible": 0.001}
ILLEGAL = 0.0  # a step that is not arithmetic on the numbers left: below even "impossible"

_STEP = re.compile(r"(-?[\d./]+)\s*([-+*/×x])\s*(-?[\d./]+)\s*=\s*(-?[\d./]+)\s*\(left:\s*([^)]*)\)")
_VERDICT = re.compile(r"\b(sure|likely|impossible)\b", re.IGNORECASE)
_ARITHMETIC = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def as_number(text: str) -> Fraction | None:
    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError):
        return None


def apply_step(numbers: list[Fraction], step: str) -> list[Fraction] | None:
    """The numbers left after `step`, or None when the step is not legal arithmetic on `numbers`
    (wrong operands, wrong result, or a "left" list that does not match)."""
    match = _STEP.search(step)
    if match is None:
        return None
    a, op, b, c = as_number(match[1]), match[2], as_number(match[3]), as_number(match[4])
    left = [as_number(t) for t in match[5].split()]
    if None in (a, b, c) or None in left:
        return None
    op = {"×": "*", "x": "*"}.get(op, op)
    if (op == "/" and b == 0) or c != _ARITHMETIC[op](a, b):
        return None
    remaining = Counter(numbers)
    remaining.subtract([a, b])
    if any(count < 0 for count in remaining.values()):
        return None  # used a number that was not there
    expected = Counter(remaining.elements()) + Counter([c])
    return left if Counter(left) == expected else None


def evaluate(expression: str) -> tuple[Fraction, list[Fraction]]:
    """Value and operands of an arithmetic expression; ValueError for anything but numbers,
    + - * / and parentheses (so no eval() of model output)."""
    operands: list[Fraction] = []

    def walk(node: ast.AST) -> Fraction:
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Div) and right == 0:
                raise ValueError("division by zero")
            return _OPS[type(node.op)](left, right)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            operands.append(Fraction(node.value))
            return Fraction(node.value)
        raise ValueError(f"not allowed in an answer: {ast.dump(node)[:40]}")

    try:
        tree = ast.parse(expression.replace("×", "*"), mode="eval")
    except SyntaxError as err:
        raise ValueError(f"not an expression: {expression!r}") from err
    return walk(tree.body), operands


class Game24:
    name = "game24"
    value_range = (ILLEGAL, VALUES["sure"])  # optional: MCTS maps values to [0, 1] by it

    def __init__(self, config: SearchConfig | None = None):
        # 3 steps take 4 numbers to 1; ToT samples several steps per state and keeps the best few
        # (2 here, a small default; game24.yaml keeps 5 as ToT did).
        # max_new_tokens caps every call; extra gives each kind of call its own smaller budget.
        self.config = config or SearchConfig(depth=3, n_generate=3, breadth=2, temperature=0.7,
                                             max_new_tokens=96, value_threshold=1.0,
                                             extra={"thought_max_new_tokens": 32, "value_max_new_tokens": 96,
                                                    "answer_max_new_tokens": 48})

    def load(self, path: str | None = None, limit: int | None = None, offset: int = 0) -> list[Example]:
        """The built-in puzzles, or a text file with one puzzle ("4 4 6 8") per line."""
        if path is None:
            records = [{"id": str(i), "puzzle": p} for i, p in enumerate(PUZZLES)]
            records = records[offset:None if limit is None else offset + limit]
        else:
            from seed_tot.tasks.loading import load_records
            records = load_records(path, text_field="puzzle", limit=limit, offset=offset)
        return [Example(id=r["id"], data=r) for r in records]

    # --- the state ---------------------------------------------------------------------------
    @staticmethod
    def start(example: Example) -> list[Fraction]:
        return [Fraction(t) for t in example.data["puzzle"].split()]

    def numbers_left(self, example: Example, state: State) -> list[Fraction] | None:
        """None when some step of the state is illegal."""
        numbers: list[Fraction] | None = self.start(example)
        for step in state.thoughts:
            numbers = apply_step(numbers, step)
            if numbers is None:
                return None
        return numbers

    @staticmethod
    def show(numbers: list[Fraction]) -> str:
        return " ".join(str(n) for n in numbers)

    # --- the protocol ------------------------------------------------------------------------
    def thought_prompt(self, example: Example, state: State) -> Prompt:
        numbers = self.numbers_left(example, state) or self.start(example)
        return Prompt(user=THOUGHT_PROMPT.format(numbers=self.show(numbers)), stop=("\n",),
                      max_new_tokens=self.config.extra.get("thought_max_new_tokens"))

    def extend(self, state: State, thought: str) -> State:
        """Keep the step itself: the first line shaped like one, else the first line."""
        lines = [line.strip() for line in thought.strip().splitlines() if line.strip()]
        step = next((line for line in lines if _STEP.search(line)), lines[0] if lines else "")
        return State(state.thoughts + (step,))

    def prior_value(self, example: Example, state: State) -> float | None:
        """Illegal steps and the last number need no model: only open positions are asked."""
        numbers = self.numbers_left(example, state)
        if numbers is None:
            return ILLEGAL
        if len(numbers) == 1:
            return VALUES["sure"] if numbers[0] == 24 else VALUES["impossible"]
        return None

    def value_prompt(self, example: Example, state: State) -> Prompt:
        numbers = self.numbers_left(example, state) or []
        return Prompt(user=VALUE_PROMPT.format(numbers=self.show(numbers)),
                      max_new_tokens=self.config.extra.get("value_max_new_tokens"))

    def parse_value(self, text: str) -> float:
        """The last verdict word (after the reasoning); none at all counts as impossible."""
        verdicts = _VERDICT.findall(text)
        return VALUES[verdicts[-1].lower()] if verdicts else VALUES["impossible"]

    def is_final(self, example: Example, state: State) -> bool:
        return state.depth >= len(self.start(example)) - 1

    def answer_prompt(self, example: Example, state: State) -> Prompt:
        user = ANSWER_PROMPT.format(numbers=example.data["puzzle"], steps="\n".join(state.thoughts))
        return Prompt(user=user, assistant_prefix="Answer:", stop=("\n",),
                      max_new_tokens=self.config.extra.get("answer_max_new_tokens"))

    def prediction(self, example: Example, state: State, answer: str) -> str:
        """The expression: the answer's first line without "Answer:" and without "= 24"."""
        line = answer.strip().splitlines()[0] if answer.strip() else ""
        return line.removeprefix("Answer:").split("=")[0].strip()

    def score(self, example: Example, prediction: str) -> dict[str, Any]:
        try:
            value, operands = evaluate(prediction)
        except ValueError as err:
            return {"correct": False, "reason": str(err)}
        if sorted(operands) != sorted(self.start(example)):
            return {"correct": False, "reason": "must use each of the four numbers exactly once"}
        if value != 24:
            return {"correct": False, "reason": f"evaluates to {value}, not 24"}
        return {"correct": True, "reason": ""}


if __name__ == "__main__":
    import logging

    from seed_tot.engine import Engine
    from seed_tot.search import load_settings, solve_dataset

    logging.basicConfig(level=logging.INFO)
    task = Game24()
    settings = load_settings(None, base=task.config)
    summary = solve_dataset(Engine.from_pretrained(), task, task.load(), settings=settings,
                            output_dir="runs/game24", resume=True)
    logging.getLogger("game24").info("accuracy %.2f over %d puzzles", summary["accuracy"], summary["n"])
