"""GSM8K grade-school math as a tree-of-thoughts task (the SEED paper's Appendix C setup).

A thought is one "Sub-question k: ... / Sub-answer k: ..." step. With the default depth 4 the tree
has 4 levels of thoughts: levels 1-3 are free sub-question steps and level 4 (the last) is the
fixed sub-question "What is the answer to the original question?", whose sub-answer ends in
"The answer is N". A branch that states its answer early is final before the last level.
States are rated 1-10 by the model; the final answer is read from the prediction's text.
"""
from __future__ import annotations

import logging
import math
import re
from typing import Any

from seed_tot.prompts import task_prompts
from seed_tot.search.protocol import Example, Prompt, SearchConfig, State
from seed_tot.tasks.loading import load_records, type_name

log = logging.getLogger(__name__)

HUB = ("openai/gsm8k", "main", "test")
REQUIRED_PROMPTS = ("instruction", "examples", "thought_user", "answer_user", "step_header",
                    "final_question", "final_header", "value_user", "value_prefix", "no_steps",
                    "cot_user", "cot_prefix")

# Stop before the model starts the next step (one call = one thought) or a new problem.
STOP = ("\nSub-question", "\nQuestion:")
# A chain of thought writes every step in one call: it stops only at a new problem.
COT_STOP = ("\nQuestion:",)
# New tokens per call: one step (a thought, or the answering step) and a whole chain of thought
# (every step of the demonstrations' length and the answering one). The run's max_new_tokens
# caps both, so it is the chain's.
STEP_MAX_NEW_TOKENS = 128
COT_MAX_NEW_TOKENS = 384

# A number as written in a solution: optional sign and "$", thousands commas, decimals, or a
# decimal with no integer part (".5", "$.50": read as 5 and 50 before). A comma belongs to the number
# only between groups of three digits ("1,234,567"): "5, 6" yields "5", and "1,5" yields 1 then 5
# (it read as 15).
_DIGITS = r"(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)"
_NUMBER = r"-?\$?(?:" + _DIGITS + r"(?:\.\d+)?|\.\d+)"
_GOLD_RE = re.compile(r"####\s*(" + _NUMBER + ")")
# "The answer is 2 * 4 = 8": the number after a computation's "=" is the answer, not its first operand;
# "The answer is 3/4": a fraction with no "=" after it is its value, not its numerator
_ANSWER_RE = re.compile(r"the answer is\s*:?\s*[*_]*\s*(" + _NUMBER + r")(?:(?:\s*[-+*/x×÷]\s*" + _NUMBER
                        + r")+\s*=\s*(" + _NUMBER + r")|\s*/\s*(" + _DIGITS + r"(?:\.\d+)?))?", re.IGNORECASE)
_NUMBER_RE = re.compile(_NUMBER)
_VALUE_RE = re.compile(r"-?\d+(?:\.\d+)?")

VALUE_MIN, VALUE_MAX = 1.0, 10.0
# An unreadable rating is neutral: it neither wins the beam nor falls below the default DFS
# threshold (5.0), so a formatting slip of the evaluator does not decide the search alone.
DEFAULT_VALUE = 5.0


def default_config() -> SearchConfig:
    return SearchConfig(depth=4, n_generate=3, breadth=1, temperature=1.0, max_new_tokens=COT_MAX_NEW_TOKENS,
                        value_threshold=5.0,
                        extra={"value_min": VALUE_MIN, "value_max": VALUE_MAX,
                               "value_max_new_tokens": 8, "step_max_new_tokens": STEP_MAX_NEW_TOKENS})


def normalize_number(text: str) -> str:
    """"$1,234.00" -> "1234", "0.50" -> "0.5", "7." -> "7"; a non-number comes back stripped."""
    cleaned = text.strip().replace(",", "").replace("$", "").replace(" ", "").rstrip(".")
    try:
        value = float(cleaned)
    except ValueError:
        return cleaned
    if math.isfinite(value) and value.is_integer():
        return str(int(value))
    return str(value)


def extract_answer(text: str) -> str | None:
    """The answer in `text`: the last "#### N", else the last "The answer is N", else the last
    number; normalized with `normalize_number`. None when the text holds no number."""
    for pattern in (_GOLD_RE, _ANSWER_RE, _NUMBER_RE):
        matches = pattern.findall(text)
        if matches:
            last = matches[-1]
            if isinstance(last, tuple):  # _ANSWER_RE: (said, result of its computation, a fraction's denominator)
                said, result, denominator = last
                if not result and denominator and float(normalize_number(denominator)):
                    return normalize_number(str(float(normalize_number(said)) / float(normalize_number(denominator))))
                last = result or said
            return normalize_number(last)
    return None


def solution_steps(answer: str) -> list[str]:
    """The reasoning lines of a GSM8K gold solution: its non-empty lines without the "#### N" one."""
    return [ln.strip() for ln in answer.splitlines() if ln.strip() and "####" not in ln]


def answers_match(a: str | None, b: str | None) -> bool:
    """Equal as numbers ("1,234" == "1234.0" == "$1234"), else equal as normalized strings."""
    if a is None or b is None:
        return False
    na, nb = normalize_number(a), normalize_number(b)
    try:
        return math.isclose(float(na), float(nb), rel_tol=1e-9, abs_tol=1e-9)
    except ValueError:
        return na == nb


def parse_rating(text: str, low: float = VALUE_MIN, high: float = VALUE_MAX,
                 default: float = DEFAULT_VALUE) -> float:
    """The first number in [low, high] in `text`; else the first number clamped; else `default`."""
    numbers = [float(n) for n in _VALUE_RE.findall(text)]
    for n in numbers:
        if low <= n <= high:
            return n
    if numbers:
        return min(max(numbers[0], low), high)
    log.debug("no rating in evaluator reply %r; using %s", text[:80], default)
    return default


class GSM8K:
    """The `Task` for GSM8K; `prompts` defaults to seed_tot/prompts/gsm8k.yaml."""

    name = "gsm8k"
    default_data = f"the Hub dataset {HUB[0]} ({HUB[1]}, {HUB[2]} split)"  # what load(None) reads (`seed-tot tasks`)
    value_range = (VALUE_MIN, VALUE_MAX)  # MCTS maps values to [0, 1] by it

    def __init__(self, config: SearchConfig | None = None, prompts: dict[str, Any] | None = None):
        self.config = config if config is not None else default_config()
        self.prompts = task_prompts("gsm8k", prompts, REQUIRED_PROMPTS)

    # --- data -------------------------------------------------------------------------------
    def default_data_source(self) -> dict[str, Any]:
        """What `load(None)` reads, as run.json records it."""
        return {"hub": HUB[0], "config": HUB[1], "split": HUB[2]}

    def load(self, path: str | None = None, limit: int | None = None, offset: int = 0) -> list[Example]:
        records = load_records(path, hub=HUB, required=("question", "answer"), limit=limit, offset=offset,
                               check=check_record)
        return [Example(id=r["id"], data=r) for r in records]

    # --- prompts ----------------------------------------------------------------------------
    def _last_level(self, state: State) -> bool:
        """Whether the next thought is the last level's: the fixed answering sub-question."""
        return state.depth + 1 >= self.config.depth

    def _user(self, key: str, example: Example) -> str:
        p = self.prompts
        return p[key].format(instruction=p["instruction"], examples=p["examples"],
                             question=example.data["question"].strip())

    def _final_header(self, k: int) -> str:
        return self.prompts["final_header"].format(k=k, final_question=self.prompts["final_question"])

    @staticmethod
    def _continue(state: State, header: str) -> str:
        return "\n".join(state.thoughts + (header,))

    def thought_prompt(self, example: Example, state: State) -> Prompt:
        if self._last_level(state):
            return self.answer_prompt(example, state)
        header = self.prompts["step_header"].format(k=state.depth + 1)
        return Prompt(user=self._user("thought_user", example),
                      assistant_prefix=self._continue(state, header), stop=STOP,
                      max_new_tokens=self._step_budget())

    def _step_budget(self) -> int:
        return self.config.extra.get("step_max_new_tokens", STEP_MAX_NEW_TOKENS)

    def extend(self, state: State, thought: str) -> State:
        """Append the step with its header, so each state reads as a self-contained solution."""
        k = state.depth + 1
        text = _cut_at_stop(thought).strip()
        if not text.lower().startswith("sub-question"):
            header = (self._final_header(k) if self._last_level(state)
                      else self.prompts["step_header"].format(k=k))
            text = f"{header} {text}"
        return State(state.thoughts + (text,))

    def value_prompt(self, example: Example, state: State) -> Prompt:
        steps = "\n".join(state.thoughts) or self.prompts["no_steps"]
        user = self.prompts["value_user"].format(question=example.data["question"].strip(), steps=steps)
        return Prompt(user=user, assistant_prefix=self.prompts["value_prefix"],
                      max_new_tokens=self.config.extra.get("value_max_new_tokens", 8))

    def parse_value(self, text: str) -> float:
        return parse_rating(text)

    def is_final(self, example: Example, state: State) -> bool:
        return state.depth >= self.config.depth or _answered(state)

    def answer_prompt(self, example: Example, state: State) -> Prompt:
        """The answering step after `state`. The solver asks for it even when the state already
        states its answer; then one token is enough, as `prediction` ignores it."""
        return Prompt(user=self._user("answer_user", example),
                      assistant_prefix=self._continue(state, self._final_header(state.depth + 1)),
                      stop=STOP, max_new_tokens=1 if _answered(state) else self._step_budget())

    def cot_prompt(self, example: Example) -> Prompt:
        """The whole solution in one call (`--algorithm cot`, `cot-sc`): the steps the tree would
        take one call each, then the answering step, as the demonstrations write them."""
        return Prompt(user=self._user("cot_user", example), assistant_prefix=self.prompts["cot_prefix"],
                      stop=COT_STOP, max_new_tokens=self.config.extra.get("cot_max_new_tokens", COT_MAX_NEW_TOKENS))

    def cot_prediction(self, example: Example, chain: str) -> str:
        """The chain as a solution (its last "The answer is N" is the one `extract_answer` reads)."""
        i = chain.find(COT_STOP[0])
        return f"{self.prompts['cot_prefix']} {(chain if i < 0 else chain[:i]).strip()}"

    # --- scoring ----------------------------------------------------------------------------
    def prediction(self, example: Example, state: State, answer: str) -> str:
        """The whole solution: the state's steps, then the answer step unless the state already
        states its answer (the last "The answer is N" is the one `extract_answer` reads)."""
        parts = list(state.thoughts)
        answer = _cut_at_stop(answer).strip()
        if answer and not _answered(state):
            parts.append(f"{self._final_header(state.depth + 1)} {answer}")
        return "\n".join(parts)

    def score(self, example: Example, prediction: str) -> dict[str, Any]:
        gold = extract_answer(str(example.data["answer"]))
        answer = extract_answer(prediction)
        return {"correct": answers_match(answer, gold), "answer": answer, "gold": gold}


def check_record(record: dict[str, Any]) -> None:
    """What the prompts and the scorer read: a question as text, and a gold answer (a GSM8K
    solution ending in "#### N", or the number itself) that holds a number: without one, every
    prediction would be scored wrong."""
    question, answer = record["question"], record["answer"]
    if not isinstance(question, str):
        raise ValueError(f"question must be text, got {type_name(question)}")
    if not question.strip():
        raise ValueError("question is empty")
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
        raise ValueError(f"answer must be text or a number, got {type_name(answer)}")
    if extract_answer(str(answer)) is None:
        raise ValueError(f"answer holds no number ({str(answer)[:60]!r}); expected a solution ending in "
                         f"'#### N', or the number N")


def _answered(state: State) -> bool:
    """Whether the state's last step already says "The answer is N"."""
    return bool(state.thoughts) and _ANSWER_RE.search(state.thoughts[-1]) is not None


def _cut_at_stop(text: str) -> str:
    """The text before the first stop string (engines may return the stop string itself)."""
    for stop in STOP:
        i = text.find(stop)
        if i >= 0:
            text = text[:i]
    return text
