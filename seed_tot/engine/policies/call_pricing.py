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
            drafts anyway, the gap doubling after each (up to MAX_PROBE_GAP), as a row's probes do;
  ledger    (CallLedger, `choose`) what finished calls of a kind cost per new token, those that ran the
            draft model apart from those that did not: the saving per token actually measured.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..params import SamplingParams

MAX_PROBE_GAP = 64
PREFILL_PRICING = ("priced", "free")



def call_kind(params: SamplingParams) -> tuple:
    """Calls whose rows stop by the same rules: a ToT search's thought calls, its value calls."""
    return params.max_new_tokens, params.stop


class Backoff:
    """Probes that back off: every gap-th counted event is one, the gap doubling after each (up to
    MAX_PROBE_GAP); `reset` brings it back to its start, when the price itself takes what was probed."""

    __slots__ = ("start", "count", "gap")

    def __init__(self, start: int):
        self.start, self.count, self.gap = start, 0, start

    def reset(self) -> None:
        self.count, self.gap = 0, self.start

    def tick(self) -> bool:
        self.count += 1
        if self.count < self.gap:
            return False
        self.count, self.gap = 0, min(MAX_PROBE_GAP, 2 * self.gap)
        return True


class CallPricing:
    """One policy's call-level state: the output lengths of finished calls and the declined calls' probes."""

    def __init__(self, probe_every: int, decay: float):
        self.decay = decay
        self.probes = Backoff(probe_every)  # declined calls that could pay, since the last that drafted
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
              saving_per_token: Callable[[float, int], float],
              measured: float | None = None) -> tuple[str, float, float]:
        """(verdict, seconds saved, new tokens) of a call of `rows` rows, `load` of them per forward (None:
        all), whose prefill costs `cost`: saving_per_token(alpha, rows per forward) is what a token
        costs less drafted at acceptance alpha than in plain steps (auto.decode_saving); `measured`,
        where given, is the saving per token finished calls of its kind showed (CallLedger.saving), which
        prices the call in its place (a perfect draft's, which decides probes, is still priced)."""
        tokens, shared = rows * self.expected_new_tokens(params, pooled), min(load or rows, rows)
        saving = tokens * (saving_per_token(alpha, shared) if measured is None else measured)
        return self.verdict(saving, tokens * saving_per_token(1.0, shared), cost, pooled), saving, tokens

    def verdict(self, saving: float, perfect_saving: float, cost: float, pooled: bool) -> str:
        """"draft" where the priced saving repays the prefill's `cost`, "probe" for a declined call drafted
        as a probe (only where a perfect draft's saving would repay it, and only for a row that may read
        other calls), else "decline"."""
        if saving > cost:
            self.probes.reset()
            return "draft"
        if pooled and perfect_saving > cost and self.probes.tick():
            return "probe"
        return "decline"


@dataclass(frozen=True)
class CallCost:
    """What one finished call cost to decode: whether it ran the draft model, its rows' new tokens, and
    their seconds after the prefill (each row's share of the target forwards it was verified in and
    of the draft forwards it fed: Sequence.stats)."""

    drafted: bool
    new_tokens: int
    decode_s: float

    @classmethod
    def of(cls, seqs, drafted: bool) -> "CallCost":
        seconds = sum(s.stats.target_busy_s - s.stats.target_prefill_s + s.stats.draft_busy_s for s in seqs)
        return cls(drafted, sum(len(s.generated) for s in seqs), seconds)


class CallLedger:
    """Per kind of call, the decayed new tokens and decode seconds of the finished calls that ran the
    draft model and of those that ran without it (`choose`: the suffix source alone).

    Why measured: a round's price credits the model with every token it drafts right beside the
    suffix chain on offer, but where the search's text repeats itself the suffix source drafts the same
    stretch a round or two later, so on a pair whose model is dear per token the rounds it takes look
    paid for while the call as a whole is not faster (docs/benchmarks.md, "Calls priced by what they
    cost"). Calls of one kind (a search's thought calls, its value calls) are alike enough that the
    difference of the two groups' seconds per token is what running the model saves per token, the
    draft's prefill apart. Neither group learns without calls of its own: a kind whose calls all run the
    model lends one to the suffix source alone now and then (`text_probe`, the gap doubling as the
    model's probes do), and declined calls probe the model (CallPricing.verdict).

    Wall-clock seconds: only calls whose drafts cannot change their tokens (greedy rows) may be priced
    from it, so that no sample depends on how fast the machine was (choose.py)."""

    def __init__(self, probe_every: int, decay: float):
        self.probe_every, self.decay = probe_every, decay
        self.spent: dict[tuple, list[float]] = {}  # (call_kind, drafted) -> [new tokens, decode seconds, calls]
        self.drafting: dict[tuple, Backoff] = {}  # call_kind -> calls the price sent to the model since a text call

    def call_finished(self, params: SamplingParams, cost: CallCost) -> None:
        if cost.new_tokens < 1 or cost.decode_s <= 0:
            return
        spent = self.spent.setdefault((call_kind(params), cost.drafted), [0.0, 0.0, 0])
        spent[0] = self.decay * spent[0] + cost.new_tokens
        spent[1] = self.decay * spent[1] + cost.decode_s
        spent[2] += 1

    def saving(self, params: SamplingParams) -> float | None:
        """Seconds per new token this kind's calls without the model took beyond those with it (negative:
        the model's calls were the slower); None until both have finished calls."""
        kind = call_kind(params)
        model, text = self.spent.get((kind, True)), self.spent.get((kind, False))
        if not model or not text:
            return None
        return text[1] / text[0] - model[1] / model[0]

    def text_probe(self, params: SamplingParams, drafts: bool) -> bool:
        """Whether a call the price sends to the model (`drafts`) runs without it instead: every gap-th
        such call of its kind since one ran without it, the gap doubling after each probe; a call
        the price declines restarts the count."""
        probes = self.drafting.setdefault(call_kind(params), Backoff(self.probe_every))
        if not drafts:
            probes.reset()
            return False
        return probes.tick()
