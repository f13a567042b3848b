"""`LLMCaller`: the one door from the search algorithms to `Engine.generate`.

It holds the decoding settings of a run, renders each `Prompt` with the engine's chat template,
and keeps engine counters per *phase* ("thought", "value", "answer", "judge") so a run can report
speculative-decoding acceptance separately for thought generation and state evaluation, the two
workloads the SEED paper distinguishes (same prompt n times vs. many different prompts).
"""
from __future__ import annotations

import logging
import time
import uuid
import warnings
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

from seed_tot.engine import summarize
from seed_tot.engine.decode_spec import DecodeSpec
from seed_tot.engine.params import GenerationResult, GenerationStats, SamplingParams

from .protocol import Prompt

log = logging.getLogger(__name__)

PHASES = ("thought", "value", "answer", "judge")

# The engine seeds sequence i of a call with `seed + i`; spacing the calls' base seeds this far
# apart keeps every sequence of a problem on its own random stream.
SEED_STRIDE = 100_003


class GenerationEngine(Protocol):
    """The two engine methods the search uses (the real `Engine` and the test fakes have them)."""

    def render_prompt(self, user: str, assistant_prefix: str = "") -> str: ...

    def generate(self, prompts: list[str], params: SamplingParams, *, spec: DecodeSpec) -> list[GenerationResult]: ...


@dataclass(frozen=True, init=False)
class DecodingSettings:
    """How every engine call of a run decodes: the run's DecodeSpec, passed to every call as is,
    and the sampling settings that the caller turns into each call's SamplingParams."""

    spec: DecodeSpec
    temperature: float
    # The most new tokens any one call may generate: a Prompt's own max_new_tokens (a task's
    # per-kind budget, e.g. a short value call) is capped by it, and None means exactly this.
    max_new_tokens: int
    seed: int
    draft_invariant: bool  # SamplingParams.draft_invariant of every call

    def __init__(self, spec: DecodeSpec | None = None, temperature: float = 1.0, max_new_tokens: int = 128,
                 seed: int = 0, draft_invariant: bool = False, **decode: Any):
        if decode:  # the fields DecodingSettings had before the DecodeSpec held them
            warnings.warn(f"DecodingSettings({', '.join(f'{k}=' for k in decode)}...) is deprecated: pass "
                          f"spec=DecodeSpec(...)", DeprecationWarning, stacklevel=2)
            spec = (spec or DecodeSpec()).replace(**decode)
        for name, value in (("spec", spec or DecodeSpec()), ("temperature", temperature),
                            ("max_new_tokens", max_new_tokens), ("seed", seed), ("draft_invariant", draft_invariant)):
            object.__setattr__(self, name, value)


def add_stats(total: GenerationStats, call: GenerationStats) -> None:
    """`GenerationStats.add` leaves wall time alone (it is per call); a phase total sums it."""
    total.add(call)
    total.wall_s += call.wall_s


@dataclass
class ProblemProgress:
    """Where the search of one problem stands, for a progress display while it runs."""

    key: str = ""
    steps: int = 0  # thought calls so far: one per BFS level, one per DFS expansion
    phase: str = ""  # the phase of the call in flight, or of the last one
    new_tokens: int = 0
    start: float = field(default_factory=time.perf_counter)

    @property
    def tokens_per_s(self) -> float:
        elapsed = time.perf_counter() - self.start
        return self.new_tokens / elapsed if elapsed > 0 else 0.0


class LLMCaller:
    def __init__(self, engine: GenerationEngine, settings: DecodingSettings,
                 on_progress: Callable[[ProblemProgress], None] | None = None):
        self.engine = engine
        self.settings = settings
        self.stats: dict[str, GenerationStats] = {}
        self.budgets: dict[str, int] = {}  # phase -> the largest max_new_tokens a call was given
        self.progress = ProblemProgress()
        self.on_progress = on_progress  # called before and after every engine call
        self._base_seed = settings.seed
        self._calls = 0
        self.search_key = ""  # one search's calls share it (reseed): text drafts read their own search's text

    def reseed(self, key: str) -> None:
        """Restart the seed sequence for one problem. Keyed on the problem id (not on how many
        problems ran before) so a resumed run samples exactly what an uninterrupted one would."""
        self._base_seed = self.settings.seed + zlib.crc32(key.encode("utf-8")) % 1_000_000_007
        self._calls = 0
        self.progress = ProblemProgress(key)
        # unique per search, not per problem: a rerun of a problem on the same engine reads none of the last run's text
        self.search_key = f"{key}#{uuid.uuid4().hex[:12]}"

    @property
    def engine_calls(self) -> int:
        """Engine `generate` calls since the last reseed (one problem's)."""
        return self._calls

    def take_stats(self) -> dict[str, GenerationStats]:
        """The counters gathered since the last take, per phase; starts a fresh count."""
        stats, self.stats = self.stats, {}
        return stats

    def take_budgets(self) -> dict[str, int]:
        """The largest max_new_tokens applied per phase since the last take (what a run reports)."""
        budgets, self.budgets = self.budgets, {}
        return budgets

    def budget(self, prompt: Prompt) -> int:
        """The prompt's own budget, never above the run's max_new_tokens (which caps every call)."""
        cap = self.settings.max_new_tokens
        return cap if prompt.max_new_tokens is None else min(prompt.max_new_tokens, cap)

    def complete(self, prompts: Sequence[Prompt], phase: str) -> list[str]:
        """The completion text of every prompt, in order.

        Prompts sharing (stop, max_new_tokens) go to the engine in one `generate` call, so a
        search step's thoughts (or values) are one batch the SEED scheduler can overlap.
        """
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}; expected one of {', '.join(PHASES)}")
        if not prompts:
            return []
        wrong = [p for p in prompts if not isinstance(p, Prompt)]
        if wrong:  # else an AttributeError on its missing max_new_tokens
            raise TypeError(f"the task's {phase}_prompt returned {type(wrong[0]).__name__} {wrong[0]!r}, not a Prompt; "
                            f"return Prompt(user=..., stop=(...), ...) from seed_tot.search.protocol")
        groups: dict[tuple[tuple[str, ...], int], list[int]] = {}
        for i, prompt in enumerate(prompts):
            max_tokens = self.budget(prompt)
            self.budgets[phase] = max(max_tokens, self.budgets.get(phase, 0))
            groups.setdefault((tuple(prompt.stop), max_tokens), []).append(i)
        texts: list[str] = [""] * len(prompts)
        for (stop, max_tokens), indices in groups.items():
            rendered = [self.engine.render_prompt(prompts[i].user, prompts[i].assistant_prefix) for i in indices]
            for i, text in zip(indices, self._generate(rendered, stop, max_tokens, phase)):
                texts[i] = text
        return texts

    def _generate(self, rendered: list[str], stop: tuple[str, ...], max_tokens: int, phase: str) -> list[str]:
        s = self.settings
        params = SamplingParams(max_new_tokens=max_tokens, temperature=s.temperature, stop=stop,
                                seed=self._base_seed + self._calls * SEED_STRIDE,
                                search_key=self.search_key, phase=phase,  # text drafts' scopes (suffix_index.py)
                                draft_invariant=s.draft_invariant)
        self._calls += 1
        self.progress.phase = phase
        self.progress.steps += phase == "thought"
        self._report()
        results = self.engine.generate(rendered, params, spec=s.spec)
        if len(results) != len(rendered):
            raise RuntimeError(f"engine returned {len(results)} results for {len(rendered)} prompts")
        call = summarize(results)  # wall time counted once per call, not once per sequence
        add_stats(self.stats.setdefault(phase, GenerationStats()), call)
        self.progress.new_tokens += call.new_tokens
        self._report()
        log.info("%s call: %d prompts, %d new tokens, acceptance %.2f", phase, len(rendered),
                  call.new_tokens, call.acceptance_rate)
        return [r.text or "" for r in results]

    def _report(self) -> None:
        if self.on_progress is not None:
            self.on_progress(self.progress)
