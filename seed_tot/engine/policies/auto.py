"""`auto`: the cost-aware policy -- each round, the draft length that maximizes tokens per second.

Costs come from a short calibration on the running hardware, cached per machine (engine/cost_model.py:
`load_costs`, `Costs`). The acceptance estimate is a running, decayed per-token acceptance rate
of each sequence, starting from the policy's estimate over every sequence so far (the option
`prior` before any). For a chain of K drafted tokens with per-token acceptance alpha:
    tokens(K) = (1 - alpha^(K+1)) / (1 - alpha)        time(K) = K * t_draft + t_target(K + 1)
and K = 0 (a plain target step, no draft forward at all) competes with the rest, so a draft that
hardly ever agrees costs nothing but the occasional probe: when K = 0 wins, a one-token probe is
drafted after `probe_every` plain rounds, and the gap doubles after each failed probe (up to 64),
so a draft that is almost never accepted runs at about ar's speed while one that starts to agree
is picked up again.

Load-aware (batched SEED; option load=greedy|all|off, base.load_option): rows drafted in one batched round share
its draft steps and its verification forward, so the length that pays for a row alone is not the
one that pays in a crowd. Before each batched round `plan_batch` picks every row's length for the
most expected tokens per second of the whole round (`plan_lengths`, `batch_time`):
    tokens = sum_i tokens(K_i)        time = sum_s t_draft(rows drafting >= s tokens) + t_target(sum_i (K_i + 1))
On a CPU, where a forward's cost grows with its tokens past a few, 16 rows plan K = 0 (plain target
steps: what `parallel` pays) while one row keeps its chain; on a GPU, flat to many tokens, every
row keeps its chain. Costs are keyed by query tokens (rows x entries), calibrated up to 64 target
and 32 draft tokens, and a 128-token draft prefill (fewer on a model with a shorter learned position table: `calibration_plan`).
A row whose own best length is 0 keeps the probing above. By default only
greedy rows plan together: a sampled row's length then depends on its own history alone, so its
sample for a seed is the one it gets alone.

The draft's prefill is priced too (option prefill=priced, the default; prefill=free skips this):
before a call drafts at all, it weighs what scoring its prompts through the draft costs (the tokens
`shared_prefill.tokens_to_score` counts, at the calibrated draft cost per token) against the most
drafting can save over the call's expected output, rows x new tokens per row x what a token costs
less at this load (`decode_saving`, at the running acceptance estimate of every sequence so far).
New tokens per row: max_new_tokens until a call of the same kind (budget and stop strings) has
finished, then what such calls output, decayed (a ToT value call answers in a few tokens of its
budget; pricing it at the whole budget overstates what drafting saves). A call whose
prompts are long beside its budget (a ToT value prompt rates a state in a few tokens) then runs
plain target steps: no draft cache, no draft forward, what `parallel` runs. A declined call teaches
the estimate nothing, so where a better draft could repay the prefill, a declined call drafts now
and then as a probe (after `probe_every` declines, the gap doubling up to 64 as a row's probes do).

With a SpecDec++ head (option head=DIR, `--head`), the running estimate still decides whether to
draft at all, but how far is decided token by token from the head's P̂ (specdec.py's round): with
n tokens drafted, the first n-1 judged (survivals S_j, last P̂ = a, S = S_{n-1}),
    E(n) = 1 + sum_j S_j + S * a        E(n+1) = E(n) + S * a^2
and drafting goes on while E(n+1) / time(n+1) > E(n) / time(n): a cost-aware stopping rule in
place of SpecDec++'s fixed threshold h.
"""
from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

# the cost model lived here before engine/cost_model.py; these names stay importable from auto
from ..cost_model import (CALIBRATION_TOKENS, DRAFT_CALIBRATION_TOKENS, Costs, cache_key, cache_path,  # noqa: F401
                          calibrate, calibration_plan, derive_opt_tree_options, load_costs)
from ..draft_tree import DraftTree
from ..params import SamplingParams
from .base import (DraftPolicy, DraftRound, HiddenCapture, TreeBuilder, choice_option, flag_option, load_option, option,
                   planned_together, reads_others)
from .call_pricing import MAX_PROBE_GAP, PREFILL_PRICING, CallPricing
from .fixed import FixedRound
from .head import accept_probability

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)



def expected_tokens(alpha: float, k: int) -> float:
    return float(k + 1) if alpha >= 1.0 else (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def best_length(alpha: float, costs: Costs, max_len: int) -> int:
    """The chain length (0 = no draft) with the most expected tokens per second."""
    rates = [expected_tokens(alpha, k) / (k * costs.draft_step_s + costs.target(k + 1)) for k in range(max_len + 1)]
    return max(range(max_len + 1), key=lambda k: (rates[k], -k))


def batch_time(lengths: list[int], pending: list[int], costs: Costs, other_tokens: int = 0) -> float:
    """Seconds of one batched round: draft step s feeds every row drafting >= s tokens (step 1 also
    its pending tokens; a row drafting 0 skips the draft), then one target forward verifies every
    row's draft + 1 and `other_tokens` more from rows planned elsewhere."""
    steps = max(lengths, default=0)
    draft = costs.draft(sum(p for k, p in zip(lengths, pending) if k >= 1))
    draft += sum(costs.draft(sum(k >= s for k in lengths)) for s in range(2, steps + 1))
    return draft + costs.target(sum(lengths) + len(lengths) + other_tokens)


def plan_lengths(alphas: list[float], pending: list[int], costs: Costs, max_len: int, other_tokens: int = 0) -> list[int]:
    """Chain lengths for rows drafted and verified together: the most expected tokens per second of
    the whole round, not of each row alone. A batched forward's cost grows with its tokens, so the
    more rows share it, the less a speculative token is worth (at a compute-bound load: nothing),
    while a row alone keeps its long chain. The search: the best common length, then one pass
    setting each row (surest first) to its best length given the others', repeated while it changes."""
    def rate(lengths: list[int]) -> float:
        tokens = sum(expected_tokens(a, k) for a, k in zip(alphas, lengths)) + other_tokens
        return tokens / batch_time(lengths, pending, costs, other_tokens)

    n = len(alphas)
    plan = max(([d] * n for d in range(max_len + 1)), key=lambda ls: (rate(ls), -ls[0]))
    for _ in range(3):  # passes until nothing changes (rarely more than two)
        before = list(plan)
        for i in sorted(range(n), key=lambda i: -alphas[i]):
            plan[i] = max(range(max_len + 1), key=lambda k: (rate(plan[:i] + [k] + plan[i + 1:]), -k))
        if plan == before:
            break
    return plan


def decode_saving(alpha: float, costs: Costs, max_len: int, rows: int) -> float:
    """Seconds per generated token that drafting saves at a load of `rows` rows planned together
    (`plan_lengths`, each row at acceptance alpha) against plain target steps of those rows; 0 when
    no plan beats them."""
    plain = costs.target(rows) / rows
    lengths = plan_lengths([alpha] * rows, [1] * rows, costs, max_len)
    drafted = batch_time(lengths, [1] * rows, costs) / sum(expected_tokens(alpha, k) for k in lengths)
    return max(0.0, plain - drafted)


@dataclass
class _SeqState:
    hits: float  # decayed accepted draft tokens
    trials: float  # decayed draft tokens the target judged (accepted + the first rejected)
    plain_rounds: int = 0
    probe_gap: int = 0


class AutoPolicy(DraftPolicy):
    name = "auto"
    drafts_trees = False  # a chain of the chosen length, or SpecDec++'s chain with a head

    def __init__(self, costs: Costs, max_len: int = 8, prior: float = 0.5, prior_weight: float = 2.0,
                 decay: float = 0.9, probe_every: int = 8, head=None, eos_ids=frozenset(),
                 capture: HiddenCapture | None = None, load: str = "greedy", prefill: str = "priced"):
        if not 0 <= prior <= 1 or max_len < 1 or probe_every < 1 or not 0 < decay <= 1:
            raise ValueError("auto needs 0 <= prior <= 1, max_len >= 1, probe_every >= 1 and 0 < decay <= 1")
        if head is not None and capture is None:
            raise ValueError("auto with a head needs a HiddenCapture of the draft model")
        self.costs, self.max_len, self.prior, self.prior_weight = costs, max_len, prior, prior_weight
        self.decay, self.probe_every = decay, probe_every
        self.head, self.eos_ids, self.capture = head, frozenset(eos_ids), capture
        self._state: dict[int, _SeqState] = {}
        self.load = load_option(self.name, load)
        self._planned: dict[int, int] = {}  # id(seq) -> the length its batch's plan gave it
        self.prices_prefill = choice_option(self.name, "prefill", prefill, PREFILL_PRICING) == "priced"
        self.calls = CallPricing(probe_every, decay)  # output lengths per kind of call, declined calls' probes
        self._hits = self._trials = 0.0  # every sequence's judged drafts, decayed: a new call's estimate

    @classmethod
    def parse_options(cls, max_len=8, prior=0.5, probe_every=8, recalibrate="false", head=None,
                      load="greedy", prefill="priced") -> dict:
        choice_option(cls.name, "prefill", prefill, PREFILL_PRICING)
        return {"max_len": option(cls.name, "max_len", max_len, int, 1),
                "prior": option(cls.name, "prior", prior, float, 0, high=1),
                "probe_every": option(cls.name, "probe_every", probe_every, int, 1),
                "recalibrate": flag_option(cls.name, "recalibrate", recalibrate),
                "head": None if head is None else str(head), "load": load_option(cls.name, load),
                "prefill": prefill}

    @classmethod
    def from_options(cls, engine, k_config, params, **options) -> "AutoPolicy":
        o = cls.parse_options(**options)
        head_model = capture = None
        if o["head"] is not None:
            from .specdec import load_checked_head
            head_model = load_checked_head(o["head"], engine, params)
            capture = engine.draft_runtime.capture(HiddenCapture)
        return cls(load_costs(engine, recalibrate=o["recalibrate"]), o["max_len"], o["prior"],
                   probe_every=o["probe_every"], head=head_model, eos_ids=engine.eos_ids, capture=capture,
                   load=o["load"], prefill=o["prefill"])

    def predict(self, hidden: torch.Tensor) -> float:
        """P̂ for the token whose entry produced `hidden` (one vector)."""
        return accept_probability(self.head, hidden)

    def enough(self, n: int, rnd) -> bool:
        """Stop after n drafted tokens once one more is not expected to raise tokens per second."""
        # before the head has judged a token, the sequence's running estimate stands in for P̂
        a = rnd.last_p if rnd.last_p is not None else self.alpha(rnd.b.seq)
        e_now = 1.0 + rnd.survival_sum + rnd.survival * a
        e_next = e_now + rnd.survival * a * a
        t_now = n * self.costs.draft_step_s + self.costs.target(n + 1)
        t_next = t_now + self.costs.draft_step_s + self.costs.extra_token(n + 1)
        return e_next / t_next <= e_now / t_now

    def _seq(self, seq) -> _SeqState:
        state = self._state.get(id(seq))
        if state is None:
            state = self._state[id(seq)] = _SeqState(0.0, 0.0, 0, self.probe_every)
            # a row of a call that failed or was cancelled never reaches `observe` done: its state goes
            # with the row (before its id can be another row's)
            try:
                weakref.finalize(seq, _forget, self._state, self._planned, id(seq))
            except TypeError:  # a stand-in that takes no weak reference: `observe` alone drops it
                pass
        return state

    def _pooled(self, params: SamplingParams | None) -> bool:
        """Whether a row with these params may read what other sequences saw: the rows `load` plans
        together. A sampled row under load=greedy reads only its own history and the prior, so its
        sample for a seed never depends on what ran before or beside it."""
        return params is not None and reads_others(params, self.load)

    def alpha(self, seq) -> float:
        """A sequence's acceptance estimate: its own judged drafts, starting from what every sequence
        so far saw (`call_alpha`; a ToT search's later calls start where its earlier ones left), or
        from the prior for a row that must not read them (`_pooled`)."""
        s = self._seq(seq)
        rule = getattr(seq, "rule", None)
        start = self.call_alpha() if self._pooled(getattr(rule, "params", None)) else self.prior
        return (s.hits + start * self.prior_weight) / (s.trials + self.prior_weight)

    def call_alpha(self) -> float:
        """The acceptance a call is priced at before it drafts, and where a new sequence's estimate
        starts: every sequence's judged drafts so far (decayed), else the prior."""
        return (self._hits + self.prior * self.prior_weight) / (self._trials + self.prior_weight)

    def drafts_call(self, prefill_tokens: int, rows: int, params: SamplingParams, load: int | None = None) -> bool:
        """Draft only when the most drafting can save over the call's budget, at `load` rows per
        forward (None: all `rows`), repays the draft's prefill."""
        if not self.prices_prefill or rows < 1:
            return True
        pooled = self._pooled(params)  # a sampled call under load=greedy: priced at the prior and its
        alpha = self.call_alpha() if pooled else self.prior  # budget, never probed
        cost = self.costs.draft(prefill_tokens)
        # a declined call teaches the estimate nothing: where a perfect draft could repay the prefill,
        # one now and then drafts as a probe (call_pricing.py)
        verdict, saving, tokens = self.calls.price(params, rows, load, pooled, alpha, cost, self.saving_per_token)
        if verdict == "probe":
            log.info("auto: a call of %d rows drafts as a probe (acceptance estimate %.2f)", rows, alpha)
        if verdict != "decline":
            return True
        log.info("auto: a call of %d rows decodes without its draft: at most %.3f s saved over %.0f new tokens "
                 "(acceptance %.2f) against %.3f s of draft prefill (%d prompt tokens)", rows, saving,
                 tokens, alpha, cost, prefill_tokens)
        return False

    def saving_per_token(self, alpha: float, rows: int) -> float:
        return decode_saving(alpha, self.costs, self.max_len, rows)

    def expected_new_tokens(self, params: SamplingParams, pooled: bool = True) -> float:
        """New tokens per row a call with these params is priced at (call_pricing.CallPricing)."""
        return self.calls.expected_new_tokens(params, pooled)

    def call_finished(self, params: SamplingParams, new_tokens: list[int], cost=None) -> None:
        self.calls.call_finished(params, new_tokens)

    def plan_batch(self, seqs: list, rows: int) -> None:
        """Plan this policy's rows of one batched draft round of `rows` rows in all. Rows planned
        elsewhere (other calls; here, sampled rows under load=greedy) count at their own best length,
        other calls' at one verified token each. Unplanned rounds (a row drafted alone, `sd`) use
        the row's own best length."""
        together = planned_together(seqs, self.load)
        if rows <= 1 or not together:
            return
        planned = {id(s) for s in together}
        alone = sum(best_length(self.alpha(s), self.costs, self.max_len) + 1 for s in seqs if id(s) not in planned)
        lengths = plan_lengths([self.alpha(s) for s in together], [len(s.pending(s.draft)) for s in together],
                               self.costs, self.max_len, rows - len(seqs) + alone)
        self._planned.update({id(s): k for s, k in zip(together, lengths)})

    def choose(self, seq) -> int:
        s = self._seq(seq)
        planned = self._planned.pop(id(seq), None)
        # the batch's plan where there is one: what shares the forwards decides, both ways (a CPU
        # forward whose cost steps with its query rows can make a draft pay in a crowd and not alone)
        k = best_length(self.alpha(seq), self.costs, self.max_len) if planned is None else planned
        if k > 0:
            return k
        s.plain_rounds += 1
        if s.plain_rounds >= s.probe_gap:  # look again: the draft may have started to agree
            s.plain_rounds = 0
            return 1
        return 0

    def begin(self, seq, params: SamplingParams, vocab_size: int) -> DraftRound:
        k = self.choose(seq)
        if not k:
            return NoDraft(vocab_size)
        builder = TreeBuilder(seq, params, vocab_size)
        if self.head is not None:
            from .specdec import SpecDecRound
            return SpecDecRound(builder, self)
        return FixedRound(builder, (1,) * k)

    def observe(self, seq, tree: DraftTree, acceptance) -> None:
        super().observe(seq, tree, acceptance)
        depth = tree.depth()
        if depth:
            s = self._seq(seq)
            accepted = len(acceptance.path)
            s.hits = self.decay * s.hits + accepted
            s.trials = self.decay * s.trials + accepted + (accepted < depth)
            self._hits = self.decay * self._hits + accepted
            self._trials = self.decay * self._trials + accepted + (accepted < depth)
            if best_length(self.alpha(seq), self.costs, self.max_len) == 0:  # a failed probe: wait longer
                s.probe_gap = min(MAX_PROBE_GAP, 2 * s.probe_gap)
            else:
                s.probe_gap = self.probe_every
        if seq.done:
            self._state.pop(id(seq), None)
            self._planned.pop(id(seq), None)


def _forget(state: dict, planned: dict, key: int) -> None:
    state.pop(key, None)
    planned.pop(key, None)


class NoDraft(DraftRound):
    """A plain target step: no draft forward; the draft cache catches up when drafting resumes."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def first_feed(self):
        return None

    def finish(self):
        return DraftTree.empty(self.vocab_size), {}
