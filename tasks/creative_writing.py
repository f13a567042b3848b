"""Creative Writing (the ToT paper's task) as a tree-of-thoughts task.

Input: 4 sentences. Output: a passage of 4 short paragraphs ending in those sentences, in order.
Depth 2: thought 1 is a plan, thought 2 the passage written from it; states are rated for
coherency 1-10 by the model. `score` checks the endings; `judge_prompt` lets the solver rate the
finished passage's coherency with the target model (ToT used GPT-4 for that).
"""
from __future__ import annotations

import logging
import re
from typing import Any

from seed_tot.prompts import task_prompts
from seed_tot.search.protocol import Example, Prompt, SearchConfig, State
from seed_tot.tasks.loading import DataError, load_records

log = logging.getLogger(__name__)

N_SENTENCES = 4
REQUIRED_PROMPTS = ("task", "plan_prefix", "passage_prefix", "plan_value_user",
                    "passage_value_user", "value_prefix")
PLAN_STOP = ("\nPassage:",)  # the plan call ends where the passage would begin
PASSAGE_STOP = ("\nPlan:",)  # ... and the passage call before the model starts a new plan

# A sentence ends at . ! ? (maybe followed by a closing quote or bracket) before whitespace and
# the capital, digit or opening quote of the next sentence.
_BOUNDARY = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"'”’)]))\s+(?=[\"'“‘(]?[A-Z0-9])")
# A "." after these does not end a sentence ("Mr. Smith").
_ABBREVIATIONS = {"mr.", "mrs.", "ms.", "dr.", "st.", "jr.", "sr.", "prof.", "mt.", "vs.", "e.g.", "i.e."}
# Some inputs hold an unpunctuated fragment ("Instead of a bachelorette party You realize ...");
# a lowercase-to-capital word break is then a sentence break, preferably before one of these
# usual sentence openers rather than before a name ("with Grandpa Joe").
_FRAGMENT_BREAK = re.compile(r"(?<=[a-z])\s+(?=[A-Z])")
_OPENERS = {"a", "an", "the", "he", "she", "it", "i", "you", "we", "they", "there", "this", "that",
            "my", "his", "her", "our", "their", "just", "if", "when", "as", "in", "on", "after"}
_QUOTES = str.maketrans({"’": "'", "‘": "'", "“": '"', "”": '"'})
_SCORE_RE = re.compile(r"coherency score is\D{0,5}?(\d+(?:\.\d+)?)", re.IGNORECASE)
# "8/10", "8 out of 10": a score on the 1-10 scale whose 10 is not a score itself
_OF_TEN_RE = re.compile(r"(\d+(?:\.\d+)?)\s*(?:/|out\s+of)\s*10\b", re.IGNORECASE)
_LABEL_RE = re.compile(r"^\s*(?:plan|passage)\s*:\s*", re.IGNORECASE)

VALUE_MIN, VALUE_MAX = 1.0, 10.0
# An unreadable coherency judgement earns the lowest score, as ToT's scorer gave it no credit.
DEFAULT_VALUE = VALUE_MIN


def default_config() -> SearchConfig:
    return SearchConfig(depth=2, n_generate=3, breadth=1, temperature=1.0, max_new_tokens=512,
                        value_threshold=5.0,
                        extra={"value_min": VALUE_MIN, "value_max": VALUE_MAX,
                               "plan_max_new_tokens": 256, "passage_max_new_tokens": 512,
                               "value_max_new_tokens": 192})


def split_sentences(text: str, expected: int = N_SENTENCES) -> list[str]:
    """The sentences of one input line (expected: how many there should be, to split an
    unpunctuated fragment)."""
    pieces = [p for p in _BOUNDARY.split(text.strip()) if p]
    merged: list[str] = []
    for piece in pieces:
        if merged and merged[-1].split()[-1].lower() in _ABBREVIATIONS:
            merged[-1] = f"{merged[-1]} {piece}"
        else:
            merged.append(piece)
    if len(merged) < expected:
        merged = _split_fragments(merged, expected - len(merged))
    return merged  # may still not be `expected` sentences: load refuses such a line, naming it


def _split_fragments(sentences: list[str], needed: int) -> list[str]:
    """Split `needed` more times at lowercase-to-capital word breaks, openers first, then earliest."""
    candidates = []  # (rank, sentence index, match)
    for i, sentence in enumerate(sentences):
        for m in _FRAGMENT_BREAK.finditer(sentence):
            next_word = sentence[m.end():].split(maxsplit=1)[0].strip(",;:'\"").lower()
            candidates.append((next_word not in _OPENERS, i, m.start(), m.end()))
    chosen = sorted(candidates)[:needed]
    cuts: dict[int, list[tuple[int, int]]] = {}
    for _, i, start, end in chosen:
        cuts.setdefault(i, []).append((start, end))
    out = []
    for i, sentence in enumerate(sentences):
        pos = 0
        for start, end in sorted(cuts.get(i, [])):
            out.append(sentence[pos:start])
            pos = end
        out.append(sentence[pos:])
    return out


def split_paragraphs(text: str, expected: int = N_SENTENCES) -> list[str]:
    """Paragraphs separated by blank lines; single lines when that gives `expected` and blank
    lines do not (small models often drop the blank line)."""
    text = _LABEL_RE.sub("", text.strip(), count=1)
    blocks = [b.strip() for b in re.split(r"\n\s*\n", text) if b.strip()]
    if len(blocks) != expected:
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        if len(lines) == expected:
            return lines
    return blocks


def _normalize(text: str) -> str:
    # Models retype curly quotes as straight ones; that is not a wrong ending.
    return " ".join(text.translate(_QUOTES).split())


def ends_with(paragraph: str, sentence: str) -> bool:
    """Whether `paragraph` ends with `sentence` (whitespace- and quote-normalized); a sentence
    given without final punctuation also matches with one added."""
    p, s = _normalize(paragraph), _normalize(sentence)
    if not s:
        return False
    if p.endswith(s):
        return True
    return s[-1] not in ".!?\"'" and p.rstrip(".!?").endswith(s)


class CreativeWriting:
    """The `Task` for Creative Writing; `prompts` defaults to seed_tot/prompts/creative_writing.yaml."""

    name = "creative_writing"
    default_data = "none: pass --data PATH, a text file with 4 sentences per line"  # `seed-tot tasks`
    value_range = (VALUE_MIN, VALUE_MAX)  # MCTS maps values to [0, 1] by it

    def __init__(self, config: SearchConfig | None = None, prompts: dict[str, Any] | None = None):
        self.config = config if config is not None else default_config()
        self.prompts = task_prompts("creative_writing", prompts, REQUIRED_PROMPTS)

    def load(self, path: str | None = None, limit: int | None = None, offset: int = 0) -> list[Example]:
        if path is None:
            raise DataError("creative_writing has no Hub dataset: pass --data PATH, a text file "
                            "with 4 sentences per line (the ToT paper's data_100_random_text.txt)")
        records = load_records(path, text_field="sentences", limit=limit, offset=offset, check=_check_record)
        return [Example(id=r["id"], data=r) for r in records]

    def endings(self, example: Example) -> list[str]:
        return split_sentences(example.data["sentences"])

    def _task(self, example: Example) -> str:
        numbered = "\n".join(f"{i}. {s}" for i, s in enumerate(self.endings(example), 1))
        return self.prompts["task"].format(numbered=numbered)

    def _tokens(self, key: str) -> int | None:
        return self.config.extra.get(key)

    def thought_prompt(self, example: Example, state: State) -> Prompt:
        if state.depth == 0:
            return Prompt(user=self._task(example), assistant_prefix=self.prompts["plan_prefix"],
                          stop=PLAN_STOP, max_new_tokens=self._tokens("plan_max_new_tokens"))
        return self._passage_prompt(example, state.thoughts[0])

    def _passage_prompt(self, example: Example, plan: str) -> Prompt:
        # Without a plan (an answer call from the root) the reply starts at the passage itself.
        prefix = self.prompts["passage_prefix"].format(plan=plan) if plan else "Passage:\n"
        return Prompt(user=self._task(example), assistant_prefix=prefix, stop=PASSAGE_STOP,
                      max_new_tokens=self._tokens("passage_max_new_tokens"))

    def extend(self, state: State, thought: str) -> State:
        return State(state.thoughts + (_clean(thought, state.depth),))

    def value_prompt(self, example: Example, state: State) -> Prompt:
        if state.depth >= 2:
            return self.judge_prompt(example, state.thoughts[1])
        plan = state.thoughts[0] if state.thoughts else ""
        numbered = "\n".join(f"{i}. {s}" for i, s in enumerate(self.endings(example), 1))
        user = self.prompts["plan_value_user"].format(numbered=numbered, plan=plan)
        return Prompt(user=user, assistant_prefix=self.prompts["value_prefix"],
                      max_new_tokens=self._tokens("value_max_new_tokens"))

    def judge_prompt(self, example: Example, prediction: str) -> Prompt:
        """The coherency rating of a finished passage (read the reply with `parse_value`)."""
        user = self.prompts["passage_value_user"].format(passage=prediction.strip())
        return Prompt(user=user, assistant_prefix=self.prompts["value_prefix"],
                      max_new_tokens=self._tokens("value_max_new_tokens"))

    def parse_value(self, text: str) -> float:
        """s from the last "coherency score is s"; else the last "s/10" or "s out of 10"; else the
        last number in 1-10; clamped."""
        found = _SCORE_RE.findall(text) or _OF_TEN_RE.findall(text)
        if found:
            return min(max(float(found[-1]), VALUE_MIN), VALUE_MAX)
        in_range = [float(n) for n in re.findall(r"\d+(?:\.\d+)?", text)
                    if VALUE_MIN <= float(n) <= VALUE_MAX]
        if in_range:
            return in_range[-1]
        log.debug("no coherency score in %r; using %s", text[-80:], DEFAULT_VALUE)
        return DEFAULT_VALUE

    def is_final(self, example: Example, state: State) -> bool:
        return state.depth >= self.config.depth

    def answer_prompt(self, example: Example, state: State) -> Prompt:
        """The passage from the state's plan. The solver asks for it even when the state already
        holds its passage; then one token is enough, as `prediction` takes the state's passage."""
        prompt = self._passage_prompt(example, state.thoughts[0] if state.thoughts else "")
        if state.depth >= 2:
            return Prompt(user=prompt.user, assistant_prefix=prompt.assistant_prefix + state.thoughts[1],
                          stop=prompt.stop, max_new_tokens=1)
        return prompt

    def prediction(self, example: Example, state: State, answer: str) -> str:
        if state.depth >= 2:
            return state.thoughts[1]
        return _clean(answer, depth=1)

    def score(self, example: Example, prediction: str) -> dict[str, Any]:
        """score: the fraction of the required endings found at the end of their paragraph;
        ends_match: all of them are (paragraphs past the 4th are not checked)."""
        endings = self.endings(example)
        paragraphs = split_paragraphs(prediction, len(endings))
        hits = sum(ends_with(p, s) for p, s in zip(paragraphs, endings))
        return {"score": hits / len(endings) if endings else 0.0, "ends_match": hits == len(endings)}


def _check_record(record: dict[str, Any]) -> None:
    """Each line must give the 4 endings the prompts ask 4 paragraphs for; with fewer, a passage
    would be scored on those alone."""
    found = len(split_sentences(record["sentences"]))
    if found != N_SENTENCES:
        raise ValueError(f"found {found} sentences, expected {N_SENTENCES} (the endings of the passage's "
                         f"{N_SENTENCES} paragraphs, in order)")


def _clean(thought: str, depth: int) -> str:
    """A thought without a repeated "Plan:"/"Passage:" label or text past its stop string."""
    for stop in PLAN_STOP if depth == 0 else PASSAGE_STOP:
        i = thought.find(stop)
        if i >= 0:
            thought = thought[:i]
    return _LABEL_RE.sub("", thought.strip(), count=1).strip()
