"""Whether a call drafts with the draft model at all, decided before any forward (auto.py, choose.py).

Drafting first costs the draft model's prefill of the call's prompts. What it can save is bounded by
the call's output: rows x expected new tokens per row x what a token costs less when drafted. The
policy prices the saving (its own acceptance estimate and cost model); this keeps what the verdict
needs across calls:

  lengths   per kind of call (budget and stop strings: a ToT search's thought calls, its value calls),
            the new tokens its finished rows wrote, decayed per call: a value call answers in a few
            tokens of its budget, and pricing it at the whole budget overstates what drafting saves;
  probes    a declined call teaches the acceptance estimate nothing, so a low estimate would decline
            every later call. Where a perfect draft could repay the prefill, every gap-th declined call
            drafts anyway, the gap doubling after each (up to MAX_PROBE_GAP), as a row's probes do.
"""
from __future__ import annotations

from typing import Callable

from ..params import SamplingParams

MAX_PROBE_GAP = 64
PREFILL_PRICING = ("priced", "free")



def call_kind(params: SamplingParams) -> tuple:
    """Calls whose rows stop by the same rules: a ToT search's thought calls, its value calls."""
    return params.max_new_tokens, params.stop


class CallPricing:
    """One policy's call-level state: the output lengths of finished calls and the declined calls' probes."""

    def __init__(self, probe_every: int, decay: float):
        self.probe_every, self.decay = probe_every, decay
        self.declined, self.gap = 0, probe_every  # calls declined since the last that drafted; the probe's gap
        self.lengths: dict[tuple, list[float]] = {}  # call_kind -> [new tokens of its finished rows, rows], decayed

    def expected_new_tokens(self, params: SamplingParams, pooled: bool = True) -> float:
        """New tokens per row a call with these params is priced at: what finished calls of its kind
        output, else its budget. A row that must not read other calls (`pooled` False) gets its budget,
        so that whether its call drafts depends on it alone."""
        seen = self.lengths.get(call_kind(params)) if pooled else None
        if not seen or seen[1] <= 0:
            return float(params.max_new_tokens)
        return min(float(params.max_new_tokens), max(1.0, seen[0] / seen[1]))

    def call_finished(self, params: SamplingParams, new_tokens: list[int]) -> None:
        if not new_tokens:
            return
        seen = self.lengths.setdefault(call_kind(params), [0.0, 0.0])
        seen[0] = self.decay * seen[0] + sum(new_tokens)
        seen[1] = self.decay * seen[1] + len(new_tokens)

    def price(self, params: SamplingParams, rows: int, load: int | None, pooled: bool, alpha: float, cost: float,
              saving_per_token: Callable[[float, int], float]) -> tuple[str, float, float]:
        """(verdict, seconds saved, new tokens) of a call of `rows` rows, `load` of them per forward (None:
        all), whose prefill costs `cost`: saving_per_token(alpha, rows per forward) is what a token
        costs less drafted at acceptance alpha than in plain steps (auto.decode_saving)."""
        tokens, shared = rows * self.expected_new_tokens(params, pooled), min(load or rows, rows)
        saving = tokens * saving_per_token(alpha, shared)
        return self.verdict(saving, tokens * saving_per_token(1.0, shared), cost, pooled), saving, tokens

    def verdict(self, saving: float, perfect_saving: float, cost: float, pooled: bool) -> str:
        """"draft" where the priced saving repays the prefill's `cost`, "probe" for a declined call drafted
        as a probe (only where a perfect draft's saving would repay it, and only for a row that may read
        other calls), else "decline"."""
        if saving > cost:
            self.declined, self.gap = 0, self.probe_every
            return "draft"
        could_pay = pooled and perfect_saving > cost
        self.declined += could_pay
        if could_pay and self.declined >= self.gap:
            self.declined, self.gap = 0, min(MAX_PROBE_GAP, 2 * self.gap)
            return "probe"
        return "decline"
