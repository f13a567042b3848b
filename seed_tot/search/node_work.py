"""The engine's work per tree node, recorded while one problem is searched.

The search algorithms log the tree (thoughts, values, kept states) but see only texts: what the
engine spent on each thought and each evaluation lives in the per-sequence counters of its
`generate` results. `CallLog` wraps a caller's engine for one problem and keeps every sequence's
rendered prompt, text and counters; `annotate_steps` then finds, for each candidate of each step,
the sequence that wrote its thought and the one that rated it, by re-rendering the task's own
prompts. Matching on prompts rather than on call order keeps it right when a task settles a state
without the model (`prior_value`), when duplicates are not asked, and when one phase's prompts
were split into several calls by their stop strings or token budgets.

A record's "node_work" holds one dict per step (absent in older results, and the page says so);
the steps themselves stay as the search wrote them, so greedy runs of two modes still compare equal:
- "value_replies": the evaluator's raw reply per candidate (None: valued without the model);
- "thought_work" / "value_work": per candidate, the counters of its sequence (None: no call);
- "call_work": {"thought": ..., "value": ...}: the calls of that step summed, wall time per call.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from seed_tot.engine.params import GenerationStats
from seed_tot.search.protocol import Example, State, Task
from seed_tot.search.cot import chain_prompt

log = logging.getLogger(__name__)

# The counters a node shows; the rest (busy seconds per model, cache copies) stay in the run totals.
WORK_FIELDS = ("new_tokens", "accepted", "draft_depth", "verifications", "target_forwards", "draft_forwards",
               "wall_s")


def work_of(stats: GenerationStats) -> dict[str, float]:
    return {name: round(float(getattr(stats, name)), 6) for name in WORK_FIELDS}


@dataclass
class _Sequence:
    prompt: str
    text: str
    work: dict[str, float]
    call: int  # index into CallLog.calls
    used: bool = False


class CallLog:
    """An engine stand-in that forwards every call and keeps what each sequence cost."""

    def __init__(self, engine: Any):
        self.engine = engine
        self.sequences: list[_Sequence] = []
        self.calls: list[dict[str, float]] = []  # per generate call: its summed counters, its wall time

    def render_prompt(self, *args: Any, **kwargs: Any) -> str:
        return self.engine.render_prompt(*args, **kwargs)

    def generate(self, prompts: list[str], *args: Any, **kwargs: Any):
        results = self.engine.generate(prompts, *args, **kwargs)
        total = GenerationStats()
        for result in results:
            total.add(result.stats)
        total.wall_s = max((r.stats.wall_s for r in results), default=0.0)  # the call's, as summarize does
        call = len(self.calls)
        self.calls.append(work_of(total))
        for prompt, result in zip(prompts, results):
            self.sequences.append(_Sequence(prompt, result.text or "", work_of(result.stats), call))
        return results

    def __getattr__(self, name: str) -> Any:  # anything else the caller reads (target_name, ...)
        return getattr(self.engine, name)

    def take(self, prompt: str, start: int, text: str | None = None) -> int | None:
        """The index of the first unused sequence at or after `start` with this prompt (and text)."""
        for i in range(start, len(self.sequences)):
            seq = self.sequences[i]
            if not seq.used and seq.prompt == prompt and (text is None or seq.text == text):
                seq.used = True
                return i
        return None


def _render(engine: Any, prompt: Any) -> str:
    return engine.render_prompt(prompt.user, prompt.assistant_prefix)


def _sum_calls(calls: Sequence[dict[str, float]]) -> dict[str, float] | None:
    if not calls:
        return None
    return {name: round(sum(c[name] for c in calls), 6) for name in WORK_FIELDS}


def node_work(calls: CallLog, task: Task, example: Example, steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per step of `steps`: each candidate's raw evaluation and engine counters."""
    work: list[dict[str, Any]] = []
    cursor = 0  # steps ran in order, so a step's sequences come after the previous step's
    for step in steps:
        if "predictions" in step:  # CoT-SC: the chains are answer completions of the question, never valued
            work.append(_chain_work(calls, task, example, step))
            continue
        frontier = step.get("frontier") or []
        thoughts, parents = step.get("thoughts") or [], step.get("parents") or []
        states = step.get("new_states") or []
        thought_work: list[dict | None] = []
        value_work: list[dict | None] = []
        replies: list[str | None] = []
        taken: dict[str, list[int]] = {"thought": [], "value": []}  # sequence indices per phase
        for thought, parent in zip(thoughts, parents):
            index = None
            if thought is not None and 0 <= parent < len(frontier):
                rendered = _render(calls, task.thought_prompt(example, State(tuple(frontier[parent]))))
                index = calls.take(rendered, cursor, thought)
            thought_work.append(None if index is None else calls.sequences[index].work)
            taken["thought"] += [] if index is None else [index]
        asked: set[tuple[str, ...]] = set()
        for i, state in enumerate(states):
            key = tuple(state)
            index = None
            # a repeated state and a carried final state (thought None) were not asked again
            if key not in asked and i < len(thoughts) and thoughts[i] is not None:
                asked.add(key)
                index = calls.take(_render(calls, task.value_prompt(example, State(key))), cursor)
            replies.append(None if index is None else calls.sequences[index].text)
            value_work.append(None if index is None else calls.sequences[index].work)
            taken["value"] += [] if index is None else [index]
        work.append({"value_replies": replies, "thought_work": thought_work, "value_work": value_work})
        call_ids = {phase: sorted({calls.sequences[i].call for i in ids}) for phase, ids in taken.items()}
        work[-1]["call_work"] = {phase: _sum_calls([calls.calls[c] for c in ids]) for phase, ids in call_ids.items()}
        used = taken["thought"] + taken["value"]
        if used:
            cursor = min(used)  # the next step's calls start at or after this step's first one
    unmatched = sum(not seq.used for seq in calls.sequences)
    log.debug("%s: %d engine sequences not tied to a tree node (answer, judge)", example.id, unmatched)
    return work


def _chain_work(calls: CallLog, task: Task, example: Example, step: dict[str, Any]) -> dict[str, Any]:
    """A CoT-SC step's work: each chain's answer sequence as its thought work, in one call."""
    rendered = _render(calls, chain_prompt(task, example))
    found = [calls.take(rendered, 0, chain) for chain in step.get("thoughts") or []]
    chains = [None if i is None else calls.sequences[i].work for i in found]
    call_ids = sorted({calls.sequences[i].call for i in found if i is not None})
    return {"value_replies": [None] * len(chains), "thought_work": chains, "value_work": [None] * len(chains),
            "call_work": {"thought": _sum_calls([calls.calls[c] for c in call_ids]), "value": None}}


def search_with_node_work(caller: Any, task: Task, example: Example,
                          search: Callable[[], Any]) -> tuple[Any, list[dict[str, Any]] | None]:
    """Run `search()` (a SearchResult) with `caller`'s engine wrapped in a CallLog; return it and
    its steps' node work (None if it could not be worked out)."""
    calls = CallLog(caller.engine)
    caller.engine = calls
    try:
        result = search()
    finally:
        caller.engine = calls.engine
    try:
        return result, node_work(calls, task, example, result.steps)
    except Exception:  # noqa: BLE001 -- the per-node view data must never cost a run its record
        log.warning("%s: could not tie engine counters to tree nodes; the record keeps the tree without them",
                    example.id, exc_info=True)
        return result, None
