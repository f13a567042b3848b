"""Typed inputs and outputs of one `Engine.generate` call."""
from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, field

# the decoding settings live in decode_spec.py; these names stay importable from here
from .decode_spec import ALL_BATCH, AUTO_BATCH, DRAFTING_MODES, MODES, DecodeSpec, check_k_config  # noqa: F401


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are chosen and when a sequence stops. `temperature=0` means greedy."""

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off
    stop: tuple[str, ...] = ()
    seed: int = 0
    # the search this call belongs to ("" : none) and the phase of its rows (thought, value, ...): text
    # draft sources read a search's earlier text and keep estimates per phase (engine/suffix_index.py)
    search_key: str = ""
    phase: str = ""
    # sampled rows: draw each token at a uniform keyed by (seed, position) (engine/keyed_draws.py), so
    # the row's tokens for a seed are the same in every mode and policy and beside any other rows
    draft_invariant: bool = False

    def __post_init__(self) -> None:
        # Checked here, by type too: a value the sampler cannot use (top_k=1.5, stop=[1], seed=None)
        # would otherwise fail inside a forward mid-call, and a NaN temperature samples garbage silently.
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            try:
                object.__setattr__(self, "stop", tuple(self.stop))
            except TypeError:
                raise ValueError(f"stop must be a string or a list of strings, got {self.stop!r}") from None
        if not _is_int(self.max_new_tokens) or self.max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")
        if not _is_real(self.temperature) or not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature!r}")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if not _is_real(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be a number in (0, 1], got {self.top_p!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop strings must be non-empty strings, got {list(self.stop)!r}")
        if not _is_int(self.seed):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        for name in ("search_key", "phase"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{name} must be a string, got {getattr(self, name)!r}")
        if not isinstance(self.draft_invariant, bool):
            raise ValueError(f"draft_invariant must be true or false, got {self.draft_invariant!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def deterministic(self) -> bool:
        """Whether the row's tokens depend on nothing but the prompt, the model and the seed (greedy, or
        sampled with draft_invariant): then what a draft policy decides, or what shares a forward,
        cannot change them."""
        return self.greedy or self.draft_invariant


@dataclass
class GenerationStats:
    """Counters of one sequence (or, summed, of one call or one ToT problem).

    Two kinds of counters, kept apart because batching makes them differ:
    - per-sequence work: `verifications` (rounds in which the target checked this sequence's draft,
      or, in ar/parallel, decode steps), drafted / accepted tokens;
    - what the hardware did: `target_forwards` / `draft_forwards` (decode forwards) and
      `target_prefills` / `draft_prefills` (prompt forwards). A forward shared by m rows adds 1/m to
      each row, so the sum over the sequences of a call is exactly the number of forwards the model
      ran, and so is the sum over any set of calls. Busy seconds are shared the same way.
    Acceptance rate is accepted draft tokens over draft *depth* offered per round (a chain: accepted / drafted).
    """

    new_tokens: int = 0
    drafted: int = 0  # draft tree nodes proposed
    draft_depth: int = 0  # sum over rounds of the tree depth (tokens a round could accept)
    accepted: int = 0
    verifications: int = 0
    target_forwards: float = 0.0
    target_prefills: float = 0.0
    target_prefill_tokens: float = 0.0  # prompt tokens the target scored (shared stretches split; stored ones: 0)
    target_query_tokens: int = 0  # entries this sequence put in the target's decode forwards (pending + draft nodes)
    draft_forwards: float = 0.0
    draft_prefills: float = 0.0
    target_busy_s: float = 0.0
    target_prefill_s: float = 0.0  # the part of target_busy_s spent scoring prompts (prefill forwards)
    draft_busy_s: float = 0.0  # decode forwards only: draft prompt scoring is draft_prefill_s
    draft_prefill_s: float = 0.0
    kv_copy_s: float = 0.0  # cache management: moving KV tensors (compacting accepted entries, regrowing storage)
    wall_s: float = 0.0
    events: list[dict] = field(default_factory=list)  # timeline (seed mode), see engine.timeline

    COUNTERS = ("new_tokens", "drafted", "draft_depth", "accepted", "verifications", "target_forwards",
                "target_prefills", "target_prefill_tokens", "target_query_tokens", "draft_forwards", "draft_prefills",
                "target_busy_s", "target_prefill_s", "draft_busy_s", "draft_prefill_s", "kv_copy_s")

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.draft_depth if self.draft_depth else 0.0

    @property
    def tokens_per_target_forward(self) -> float:
        """New tokens per decode forward of the target (prefill forwards excluded)."""
        return self.new_tokens / self.target_forwards if self.target_forwards else 0.0

    @property
    def rows_per_target_forward(self) -> float:
        """Sequences verified per decode forward of the target (1 without batching)."""
        return self.verifications / self.target_forwards if self.target_forwards else 0.0

    @property
    def query_tokens_per_target_forward(self) -> float:
        """Entries a decode forward of the target scored, summed over its rows (padding excluded):
        ar 1, parallel its rows, a speculative round its rows' pending tokens plus draft nodes. On a
        compute-bound device this, not rows, is what a forward's cost grows with (issue 10)."""
        return self.target_query_tokens / self.target_forwards if self.target_forwards else 0.0

    @property
    def cache_share(self) -> float:
        """Cache management as a fraction of the models' busy time."""
        busy = self.target_busy_s + self.draft_busy_s
        return self.kv_copy_s / busy if busy else 0.0

    @property
    def target_busy_fraction(self) -> float:
        return min(1.0, self.target_busy_s / self.wall_s) if self.wall_s else 0.0

    @property
    def prefill_fraction(self) -> float:
        """Of the wall, the target's prompt scoring: the part no draft and no batch of decode rows
        shortens (a compute-bound device scores a prompt token at about a decode token's cost)."""
        return min(1.0, self.target_prefill_s / self.wall_s) if self.wall_s else 0.0

    def add(self, other: "GenerationStats") -> None:
        for name in self.COUNTERS:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def to_dict(self, with_events: bool = False) -> dict:
        d = asdict(self)
        if not with_events:
            d.pop("events")
        d.update(acceptance_rate=self.acceptance_rate, tokens_per_target_forward=self.tokens_per_target_forward,
                 rows_per_target_forward=self.rows_per_target_forward, cache_share=self.cache_share,
                 target_busy_fraction=self.target_busy_fraction, prefill_fraction=self.prefill_fraction)
        return d

    def __repr__(self) -> str:  # compact: the event timeline can hold hundreds of dicts
        return (f"GenerationStats(new_tokens={self.new_tokens}, accepted={self.accepted}/{self.draft_depth}, "
                f"verifications={self.verifications}, target_forwards={self.target_forwards:g}, "
                f"draft_forwards={self.draft_forwards:g}, wall_s={self.wall_s:.3f}, events=<{len(self.events)}>)")


@dataclass
class GenerationResult:
    token_ids: list[int]  # new tokens only (EOS included when hit, like transformers' generate)
    text: str | None
    stats: GenerationStats
    finish_reason: str  # "length" | "eos" | "stop"


def summarize(results: list[GenerationResult]) -> GenerationStats:
    """Sum the per-sequence counters of one call (wall time is the call's)."""
    total = GenerationStats()
    for r in results:
        total.add(r.stats)
    total.wall_s = max((r.stats.wall_s for r in results), default=0.0)
    total.events = next((r.stats.events for r in results if r.stats.events), [])
    return total
