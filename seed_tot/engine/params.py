"""Typed inputs and outputs of one `Engine.generate` call."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

MODES = ("ar", "parallel", "sd", "mcsd", "seed")
DRAFTING_MODES = ("sd", "mcsd", "seed")  # the modes that run a draft model


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are chosen and when a sequence stops. `temperature=0` means greedy."""

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off
    stop: tuple[str, ...] = ()
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature!r}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def check_k_config(k_config) -> tuple[int, ...]:
    """A draft-tree shape: k_config[d] children per node at depth d+1, e.g. (2, 2, 1)."""
    try:
        k = tuple(int(c) for c in k_config)
    except (TypeError, ValueError):
        raise ValueError(f"k_config must be a sequence of positive integers, got {k_config!r}") from None
    if not k or any(c <= 0 for c in k):
        raise ValueError(f"k_config must be a non-empty sequence of positive integers, got {k_config!r}")
    return k


@dataclass
class GenerationStats:
    """Counters of one sequence (or, summed, of one call). Acceptance rate is accepted draft tokens
    over draft *depth* offered per round (for a chain: accepted / drafted)."""

    new_tokens: int = 0
    drafted: int = 0  # draft tree nodes proposed
    draft_depth: int = 0  # sum over rounds of the tree depth (tokens a round could accept)
    accepted: int = 0
    target_calls: int = 0
    draft_calls: int = 0
    target_busy_s: float = 0.0
    draft_busy_s: float = 0.0
    wall_s: float = 0.0
    events: list[dict] = field(default_factory=list)  # timeline (seed mode), see engine.timeline

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.draft_depth if self.draft_depth else 0.0

    @property
    def tokens_per_target_call(self) -> float:
        return self.new_tokens / self.target_calls if self.target_calls else 0.0

    @property
    def target_busy_fraction(self) -> float:
        return min(1.0, self.target_busy_s / self.wall_s) if self.wall_s else 0.0

    def add(self, other: "GenerationStats") -> None:
        for name in ("new_tokens", "drafted", "draft_depth", "accepted", "target_calls", "draft_calls",
                     "target_busy_s", "draft_busy_s"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def to_dict(self, with_events: bool = False) -> dict:
        d = asdict(self)
        if not with_events:
            d.pop("events")
        d.update(acceptance_rate=self.acceptance_rate, tokens_per_target_call=self.tokens_per_target_call,
                 target_busy_fraction=self.target_busy_fraction)
        return d


@dataclass
class GenerationResult:
    token_ids: list[int]  # new tokens only (EOS included when hit, like transformers' generate)
    text: str | None
    stats: GenerationStats
    finish_reason: str  # "length" | "eos" | "stop"
