"""`choose`: per row and round, the draft source with the most expected accepted tokens per unit of
step cost: the draft model's chain, the suffix source (suffix.py: the run's own text), both (the
suffix draft grafted beside the model's chain), or none (a plain target step).

Why: a small draft model alone cannot beat batching by much at a ToT step's load (its acceptance is
the pair's), while the search's own text drafts for free wherever it repeats itself (siblings of one
prompt, an evaluator's replies, the question's names and numbers) and not at all elsewhere. Which one
pays changes from row to row and phase to phase, so each is priced every round (choose_pricing.py:
each option's expected accepted tokens, its step cost, and the choice).

The draft model's prefill is priced per call, as `auto` prices it (option prefill=priced, the
default): before a call drafts, what the model's chains could save over the call's expected output
at its phase's model acceptance (call_pricing.py) is weighed against scoring its prompts through the
draft. For rows that may read other rows, the share of their phase's rounds in which the suffix
source offered a chain counts only what the model adds beside that chain, which drafts for free:
where the search's own text already drafts most of what the model would, its prefill buys little.
A call that declines runs the suffix source alone (`declined`): no draft cache, no draft
prefill, no draft forward, the option priced per round as above with the model left out; now and
then a declined call uses the model anyway as a probe, where a perfect draft could repay the prefill.
Where the model's chains hardly add to the suffix source's, the prefill is what they cost most.

For greedy calls the per-round price is then checked against what calls cost (call_pricing.CallLedger):
per kind of call, the seconds per new token of finished calls that ran the model and of calls that
ran the suffix source alone. Once both exist, their difference is the saving per token a call is
priced at, in place of the rounds' estimate: the model's right tokens beside a repeating text are
often ones the suffix source would have drafted a round later, which no round's price can see. A
kind whose calls all run the model lends one now and then to the suffix source alone (the 4th, 12th,
28th ...), so the two keep being compared.

a_m and a_s are running, decayed per-token acceptances of each row, starting from every row's of the
same phase so far (SamplingParams.phase: thought, value, answer); a_s is kept twice, for chains of a
match of two tokens or more and for the suffix source's one-token fallback (FALLBACK), each chain
priced and judged with its own kind's, so the fallback is taken only where its own record pays for
it on this hardware; a source not taken for a while is
probed (as auto probes), the gap doubling after each probe until the price takes the source again.
Costs: engine/cost_model.py.

Exactness: every option's draft is verified as any other (the suffix nodes are picked, one-hot
proposals, tried before the model's draws in their sibling group, verify.py). A sampled row (under
load=greedy, the default) decides from its own history and prices its round as if `sampled_rows`
rows like it shared the forward (a constant, base.SAMPLED_ROWS as in parallelspec.py: priced as one row, a
CPU's nearly flat first tokens make every draft look free), with the calibration's loaded round of
that many rows (cost_model.py: what its drafted tokens add to a forward of long-history rows, which a
one-row forward's tokens under-price on a CPU), so its choices, and thus its sample for a seed,
depend on nothing that runs beside it (base.load_option).

Costs at the run's load (option costs=measured, the default): a row that may read other rows (greedy,
or drafter-invariant sampling) is priced with load_costs.py's fit of the verification forwards the
scheduler reports (rows, query tokens, seconds), not with the calibration's one-row curve, which on a
CPU under-prices what a drafted token adds to a round of long-history rows; costs=calibrated keeps it.

Options: max_len (the model chain's longest; default len(k_config)), graft (allow both at once;
default true: a round may then be a two-branch tree), prior (the estimates' start; default 0.5),
probe_every (default 8), load (greedy|all|off), prefill (priced|free), costs (measured|calibrated),
recalibrate, sampled_rows (default 8), the suffix source's (suffix.py: depth, width, min_prob, factor,
candidates, run_tokens, share, unigram, unigram_rows), and with a ParallelSpec drafter its rounds' cut, passes and lookup
(parallelspec.py; the drafter's defaults when left out). Its cut prices a jointly planned round at
the same measured load.
"""
from __future__ import annotations

import logging
import weakref

from ..cost_model import Costs, load_costs
from ..draft_tree import UNREAD
from ..load_costs import COST_PRICING, LoadCosts
from ..params import SamplingParams
from .auto import MAX_PROBE_GAP, NoDraft, decode_saving
from .base import (SAMPLED_ROWS, DraftPolicy, DraftRound, TreeBuilder, choice_option, flag_option, load_option, option,
                   planned_together, priced_rows, reads_others)
from .call_pricing import PREFILL_PRICING, CallCost, CallLedger, CallPricing
from .choose_pricing import COVERAGE_DECAY, Coverage, Estimate, best_option, option_saving
from .fixed import FixedRound
from .parallelspec import ParallelSpecPolicy
from .suffix import GraftRound, SuffixRound, SuffixSource

SOURCES = ("model", "suffix")
TEXT_PROBE_EVERY = 4  # a kind of call whose calls all run the model lends the 4th, 12th, 28th ... to the suffix source
# the model judged in rounds where a suffix chain was there and its first token was wrong: what the
# model adds beside the suffix source (choose_pricing.expected_accepted)
MISSED = "model|suffix missed"
# the suffix source's chains from a one-token match (its fallback where no scope matches two tokens),
# judged apart: they are right less often than a longer match's, and one estimate for both would
# price the fallback's chains too high and the longer matches' too low
FALLBACK = "suffix|one-token match"

log = logging.getLogger(__name__)


class _Row:
    def __init__(self, probe_every: int):
        self.est = {s: Estimate() for s in (*SOURCES, MISSED, FALLBACK)}
        self.idle = {s: 0 for s in SOURCES}  # rounds since the source was last taken
        self.gap = {s: probe_every for s in SOURCES}
        self.taken: tuple[int, int] = (0, 0)  # this round's (model length, suffix nodes)
        self.suffix_tokens: list[int] = []  # this round's suffix chain (to judge it after verification)
        self.suffix_kind = "suffix"  # the estimate that chain is judged in: "suffix" or FALLBACK
        self.chain_first: int | None = None  # the first token of the suffix chain on offer, taken or not
        self.round = None  # this round's ParallelSpecRound, where the model drafted one


class ChoosePolicy(DraftPolicy):
    name = "choose"

    def __init__(self, costs: Costs, source: SuffixSource | None = None, max_len: int = 3, graft: bool = True,
                 prior: float = 0.5, prior_weight: float = 2.0, decay: float = 0.9, probe_every: int = 8,
                 load: str = "greedy", model=None, prefill: str = "priced", costs_at: str = "measured",
                 sampled_rows: int = SAMPLED_ROWS):
        if max_len < 1 or probe_every < 1 or not 0 <= prior <= 1 or not 0 < decay <= 1 or sampled_rows < 1:
            raise ValueError("choose needs max_len >= 1, probe_every >= 1, 0 <= prior <= 1, 0 < decay <= 1 "
                             "and sampled_rows >= 1")
        # a row planned alone prices its round as if this many rows like it shared the forward (a
        # sampled row: a constant, so its choices depend on nothing beside it; a greedy one: 1)
        self.sampled_rows = sampled_rows
        self.costs, self.source = costs, source or SuffixSource(depth=max_len)
        self.max_len, self.graft, self.prior, self.prior_weight = max_len, graft, prior, prior_weight
        self.decay, self.probe_every = decay, probe_every
        self.load = load_option(self.name, load)
        self.prices_prefill = choice_option(self.name, "prefill", prefill, PREFILL_PRICING) == "priced"
        # rounds of rows that may read other rows are priced at the load measured so far (load_costs.py)
        measured = choice_option(self.name, "costs", costs_at, COST_PRICING) == "measured"
        self.load_costs = LoadCosts(costs) if measured else None
        self.calls = CallPricing(probe_every, decay)  # output lengths per kind of call, declined calls' probes
        self.ledger = CallLedger(TEXT_PROBE_EVERY, decay)  # what finished calls cost per token, model or not
        # a ParallelSpecPolicy: the model's draft is its round (every level in one drafter forward), the
        # suffix chain grafted beside it as its lookup guess is; None: chains of the draft model (FixedRound)
        self.model = model
        if model is not None:
            self.max_len = model.depth
            model.load_costs = self.load_costs  # its cut prices at the load this policy is told of (one fit)
        self.drafts_trees = graft or self.source.width > 1 or (model is not None and model.drafts_trees)
        self._rows: dict[int, _Row] = {}
        self._phases: dict[tuple[str, str], Estimate] = {}  # (phase, source) -> every pooled row's judged drafts
        self._coverage: dict[str, Coverage] = {}  # phase -> its pooled rows' rounds the suffix source offered for
        self._load: dict[int, int] = {}  # id(seq) -> the rows of its batched round (its plan)
        self._plans: dict[int, tuple[int, int, int, list]] = {}  # id(seq) -> its round's joint plan (plan_batch)
        self._suffix_only = SuffixOnly(self)  # what a call that declines the model's prefill runs

    @classmethod
    def parse_options(cls, max_len=None, graft="true", prior=0.5, probe_every=8, load="greedy", prefill="priced",
                      costs="measured", recalibrate="false", depth=None, width=1, min_prob=0.1, factor=1.0,
                      candidates=32, run_tokens=1 << 16, share="greedy", unigram=3, unigram_rows="greedy",
                      sampled_rows=SAMPLED_ROWS, cut=None, passes=None, lookup=None) -> dict:
        """cut, passes and lookup are a ParallelSpec drafter's (parallelspec.py), passed to the rounds it
        drafts; left out, the drafter's own defaults (drafter.json). sampled_rows is both policies'."""
        given = {"cut": cut, "passes": passes, "lookup": lookup}
        given = {key: value for key, value in given.items() if value is not None}
        try:
            ParallelSpecPolicy.parse_options(**given)
        except ValueError as err:
            raise ValueError(f"draft policy {cls.name!r}, its ParallelSpec drafter's rounds: {err}") from None
        return {"model_options": given, "sampled_rows": option(cls.name, "sampled_rows", sampled_rows, int, 1),
                "max_len": None if max_len is None else option(cls.name, "max_len", max_len, int, 1),
                "graft": flag_option(cls.name, "graft", graft), "prior": option(cls.name, "prior", prior, float, 0, high=1),
                "probe_every": option(cls.name, "probe_every", probe_every, int, 1), "load": load_option(cls.name, load),
                "prefill": choice_option(cls.name, "prefill", prefill, PREFILL_PRICING),
                "costs": choice_option(cls.name, "costs", costs, COST_PRICING),
                "recalibrate": flag_option(cls.name, "recalibrate", recalibrate),
                "suffix": SuffixSource.parse(cls.name, depth, width, min_prob, factor, candidates, run_tokens, share,
                                             unigram, unigram_rows)}

    @classmethod
    def may_draft_trees(cls, engine, k_config, options) -> bool:
        if options["graft"] or options["suffix"]["width"] > 1:
            return True
        if not _parallel_drafter(engine):
            return False
        return ParallelSpecPolicy.may_draft_trees(engine, k_config,
                                                  ParallelSpecPolicy.parse_options(**options["model_options"]))

    @classmethod
    def from_options(cls, engine, k_config, params, **options) -> "ChoosePolicy":
        o = cls.parse_options(**options)
        max_len = o["max_len"] or len(k_config)
        suffix = dict(o["suffix"], depth=o["suffix"]["depth"] or 8)
        model = None
        if _parallel_drafter(engine):  # its own defaults (depth, cut, lookup: drafter.json) unless given
            # costs=calibrated: no fit of its own, as this policy gives it its (__init__)
            model = ParallelSpecPolicy.from_options(engine, k_config, params, load=o["load"], costs="calibrated",
                                                    sampled_rows=o["sampled_rows"], **o["model_options"])
        elif o["model_options"]:
            raise ValueError(f"draft policy {cls.name!r}: option {', '.join(o['model_options'])} applies to a "
                             f"ParallelSpec drafter's rounds, and this engine's draft is not one")
        return cls(load_costs(engine, recalibrate=o["recalibrate"]), SuffixSource(**suffix), max_len, o["graft"],
                   o["prior"], probe_every=o["probe_every"], load=o["load"], model=model, prefill=o["prefill"],
                   costs_at=o["costs"], sampled_rows=o["sampled_rows"])

    def _row(self, seq) -> _Row:
        row = self._rows.get(id(seq))
        if row is None:
            row = self._rows[id(seq)] = _Row(self.probe_every)
            try:  # a row of a failed or cancelled call never reaches `done`: its state goes with it
                weakref.finalize(seq, self._forget, id(seq))
            except TypeError:
                pass
        return row

    def _forget(self, key: int) -> None:
        for held in (self._rows, self._load, self._plans):
            held.pop(key, None)

    def _pooled(self, params: SamplingParams) -> bool:
        return reads_others(params, self.load)

    def alpha(self, seq, source: str) -> float:
        """A row's acceptance estimate for a source: its own judged drafts, starting from its phase's
        (a row that may read other rows, `_pooled`) or from the prior. MISSED starts from the row's
        model acceptance: until rounds say otherwise, the model is as right where the suffix chain
        fails as anywhere."""
        params = seq.rule.params
        start = self.prior if source != MISSED else self.alpha(seq, "model")
        if self._pooled(params):
            start = self._phase_alpha(params.phase, source, start)
        return self._row(seq).est[source].value(start, self.prior_weight)

    def drafts_call(self, prefill_tokens: int, rows: int, params: SamplingParams, load: int | None = None) -> bool:
        """Whether a call uses the draft model: what its chains could save over the call's expected
        output, at the phase's model acceptance and `load` rows per forward, repays the draft's prefill.
        For a row that may read other rows, rounds where the suffix source offers a chain (its phase's
        share of them) count only what the model adds beside that chain (`_model_saving`). A declined
        call runs `declined()`: the suffix source alone."""
        if not self.prices_prefill or rows < 1:
            return True
        pooled = self._pooled(params)  # a sampled call under load=greedy: priced at the prior and its budget
        alpha = self._phase_alpha(params.phase, "model", self.prior) if pooled else self.prior
        cost = self.costs.draft(prefill_tokens)
        measured = self.ledger.saving(params) if pooled else None
        verdict, saving, tokens = self.calls.price(
            params, rows, load, pooled, alpha, cost, lambda a, shared: self._model_saving(params, a, shared), measured)
        if verdict == "probe":
            log.info("choose: a call of %d rows uses the draft model as a probe (model acceptance %.2f)", rows, alpha)
        if pooled and self.ledger.text_probe(params, verdict == "draft"):
            log.info("choose: a call of %d rows drafts from the suffix source alone as a probe of what the model "
                     "saves its kind of call", rows)
            return False
        if verdict != "decline":
            return True
        if measured is not None:
            log.info("choose: a call of %d rows drafts from the suffix source alone: its kind's calls with the "
                     "model saved %.4f s per new token over those without, %.3f s over %.0f new tokens against "
                     "%.3f s of draft prefill", rows, measured, saving, tokens, cost)
            return False
        log.info("choose: a call of %d rows drafts from the suffix source alone: the model's chains save at most "
                 "%.3f s over %.0f new tokens (model acceptance %.2f) against %.3f s of draft prefill (%d prompt "
                 "tokens)", rows, saving, tokens, alpha, cost, prefill_tokens)
        return False

    def _model_saving(self, params: SamplingParams, alpha: float, shared: int) -> float:
        """Seconds per new token the draft model's chains save at acceptance alpha, `shared` rows a
        forward: in rounds without a suffix chain what they save over plain steps (auto's pricing,
        decode_saving); in the share of rounds where the phase's suffix source offered one (a row that
        may read other rows: its phase's coverage so far), only what they save beyond that chain alone
        at the acceptance of its kind (a one-token match's chains, FALLBACK, are right less often than
        longer matches') and the model's where that chain is wrong (MISSED), since the suffix chain
        drafts for free."""
        costs = self._costs(params, shared)
        alone = decode_saving(alpha, costs, self.max_len, shared)
        cover = self._coverage.get(params.phase) if self._pooled(params) else None
        if cover is None:
            return alone
        missed, one_pass = self._phase_alpha(params.phase, MISSED, alpha), self.model is not None

        def beside(kind: str, length: int) -> float:
            a_suffix = self._phase_alpha(params.phase, kind, self.prior)
            return (option_saving(alpha, a_suffix, length, costs, self.max_len, shared, self.graft, one_pass, missed)
                    - option_saving(alpha, a_suffix, length, costs, 0, shared, self.graft))
        return cover.priced(alone, beside)

    def _phase_alpha(self, phase: str, source: str, start: float) -> float:
        """A source's pooled acceptance in a phase, from `start` until its rounds say otherwise."""
        pooled = self._phases.get((phase, source))
        return start if pooled is None else pooled.value(start, self.prior_weight)

    def declined(self) -> "SuffixOnly":
        return self._suffix_only

    def call_finished(self, params: SamplingParams, new_tokens: list[int], cost: CallCost | None = None) -> None:
        self.calls.call_finished(params, new_tokens)
        if cost is not None and self._pooled(params):  # wall-clock seconds price only rows they cannot steer
            self.ledger.call_finished(params, cost)

    def plan_batch(self, seqs: list, rows: int, model: bool = True) -> None:
        """The round's load for its jointly planned rows and, for rows of calls that run the model, their
        joint plan. A declined call's rows (SuffixOnly: model False) share the forward as much as any:
        priced as a lone row, every suffix chain would look free. One round may plan both kinds."""
        together = planned_together(seqs, self.load)
        for seq in together:
            self._row(seq)  # its state, and these entries, go with the row (_row's finalizer)
        self._load.update({id(s): rows for s in together})
        if model:
            self._plans.update(self._share_draft_steps(together, rows))
            if self.model is not None:
                self.model.plan_batch(seqs, rows)

    def _share_draft_steps(self, together: list, rows: int) -> dict[int, tuple[int, int, int, list]]:
        """Every jointly planned row's (model length, suffix length, its suffix limit, its suffix chain),
        the model's draft steps priced at the rows that take them. The round's draft forward runs once
        for its drafting rows, so each pays its share: draft(m) / m for m of them, and a lone drafting
        row the whole forward (for a 0.5B draft on a CPU, draft(1) is 4x draft(8) / 8). Every row is
        first priced as if all of them drafted; while fewer take the model than were priced, the takers
        are priced again at their number (a forward for fewer rows costs each more), until that holds.
        Only rows whose drafts cannot change their tokens plan together, so this steers no sample."""
        options = []
        for seq in together:
            limit = seq.rule.params.max_new_tokens - len(seq.generated)
            chain = _chain(self.source.draft(seq, limit))
            options.append((seq, limit, chain, self.alpha(seq, "model"), self.alpha(seq, _kind(chain)),
                            self.alpha(seq, MISSED), self._costs(seq.rule.params, rows), _unseen(seq)))
        plans: dict[int, tuple[int, int, int, list]] = {}
        drafting = len(options)
        while options:
            takers = []
            for entry in options:
                seq, limit, chain, a_model, a_suffix, missed, costs, pending = entry
                k, l = best_option(a_model, a_suffix, len(chain), costs, self.max_len, rows, self.graft,
                                   self.model is not None, drafting, pending, missed)
                plans[id(seq)] = (k, l, limit, chain)
                if k:
                    takers.append(entry)
            if len(takers) >= drafting:
                break
            options, drafting = takers, len(takers)  # strictly fewer: the loop ends
        return plans

    def clear_text(self) -> None:
        self.source.clear()

    def begin(self, seq, params: SamplingParams, vocab_size: int, model: bool = True) -> DraftRound:
        """This round's draft of `seq`; model False (a call that declined the model's prefill): the
        suffix chain or nothing."""
        row = self._row(seq)
        b = TreeBuilder(seq, params, vocab_size)
        rows = self._load.pop(id(seq), priced_rows(params, self.sampled_rows))
        plan = self._plans.pop(id(seq), None)
        planned = plan is not None and model and plan[2] == b.remaining  # the batch's plan (plan_batch)
        chain = plan[3] if planned else _chain(self.source.draft(seq, b.remaining))
        kind = _kind(chain)
        if planned:
            k, l = plan[:2]
        else:
            k, l = best_option(self.alpha(seq, "model"), self.alpha(seq, kind), len(chain),
                               self._costs(params, rows), self.max_len if model else 0, rows, self.graft,
                               model and self.model is not None, pending=_unseen(seq), missed=self.alpha(seq, MISSED))
        if self._pooled(params):  # how often, and how long, each kind of suffix chain is offered (_model_saving)
            self._coverage.setdefault(params.phase, Coverage()).add(kind, len(chain), COVERAGE_DECAY)
        k, l = self._probe(row, k, l, len(chain), model)
        if self.model is not None and k:
            k = self.max_len  # a probe of the model is its whole one-pass round
        row.taken, row.suffix_tokens, row.round = (k, l), [n.token for n in chain[:l]], None
        row.suffix_kind = kind
        row.chain_first = chain[0].token if chain else None
        if k == 0 and l == 0:
            return NoDraft(vocab_size)
        if k == 0:
            return SuffixRound(b, chain[:l])
        if self.model is not None:
            rnd = row.round = self.model.begin(seq, params, vocab_size)
            rnd.suffix_chain = row.suffix_tokens  # grafted beside the drafter's levels (parallelspec.py)
            return rnd
        if l == 0:
            return FixedRound(b, (1,) * k)
        return GraftRound(b, (1,) * k, chain[:l])

    def _costs(self, params: SamplingParams, rows: int):
        """What a round of `rows` rows is priced with: the measured load's costs for a row whose drafts
        cannot change its tokens (timings must not steer a sample), else the calibration's loaded round
        (cost_model.Costs.at_load: what one row's draft adds to a forward of long-history rows)."""
        if self.load_costs is not None and self._pooled(params):
            return self.load_costs.at(rows)
        return self.costs.at_load(rows)

    def observe_forward(self, rows: int, tokens: int, seconds: float) -> None:
        if self.load_costs is not None:
            self.load_costs.observe(rows, tokens, seconds)

    def observe_draft_forward(self, tokens: int, seconds: float) -> None:
        if self.load_costs is not None:
            self.load_costs.observe_draft(tokens, seconds)

    def _probe(self, row: _Row, k: int, l: int, available: int, model: bool = True) -> tuple[int, int]:
        """Take a source not taken for `gap` rounds once, so its estimate can recover (the model only
        where the call runs it). Every probe doubles the gap, right or wrong; only a round the price
        takes the source in brings it back to probe_every. A probe succeeds by making its source pay
        (auto's rule): one that is right 40% of the time at a price that needs 60% would otherwise
        reset its gap at every hit and run a draft forward, its catch-up on every token since the
        last one included, every few rounds of every row."""
        for source, taken in (("model", k), ("suffix", l)):
            if source == "model" and not model:
                continue
            if taken:
                row.idle[source], row.gap[source] = 0, self.probe_every
                continue
            if source == "suffix" and not available:
                row.idle[source] = 0
                continue
            row.idle[source] += 1
            if row.idle[source] >= row.gap[source]:
                row.idle[source], row.gap[source] = 0, min(MAX_PROBE_GAP, 2 * row.gap[source])
                if source == "model" and (l == 0 or self.graft):
                    k = 1
                elif source == "suffix" and (k == 0 or self.graft):
                    l = available
        return k, l

    def observe(self, seq, tree, acceptance) -> None:
        super().observe(seq, tree, acceptance)
        row = self._rows.get(id(seq))
        if row is not None and tree.depth():
            k, l = row.taken
            # each source is judged by how much of its own chain the target's tokens agree with: the
            # walk follows one branch where both start alike, and the other was just as right
            model = tree.tokens[l: l + k] if row.round is None else row.round.model_chain()
            # the model again where the suffix chain on offer (drafted or not) had its first token wrong
            missed = row.chain_first is not None and list(acceptance.tokens[:1]) != [row.chain_first]
            for source, offered, tokens in (("model", len(model), model), (row.suffix_kind, l, row.suffix_tokens),
                                            (MISSED, len(model) if missed else 0, model)):
                if not offered or UNREAD in tokens:
                    continue
                hit = min(offered, _common_prefix(acceptance.tokens, tokens))
                row.est[source].add(hit, offered, self.decay)
                if self._pooled(seq.rule.params):
                    self._phases.setdefault((seq.rule.params.phase, source), Estimate()).add(hit, offered, self.decay)
        self.source.observe(seq)
        if seq.done:
            self._rows.pop(id(seq), None)
            self._load.pop(id(seq), None)
            self._plans.pop(id(seq), None)


class SuffixOnly(DraftPolicy):
    """choose's rounds for a call that declined the draft model's prefill: the suffix chain where it
    pays, else a plain step, priced and judged by the choose policy it belongs to (its estimates, its
    suffix source), never feeding the draft model."""

    name = "choose"
    uses_draft_model = False

    def __init__(self, choose: ChoosePolicy):
        self.choose = choose
        self.drafts_trees = choose.source.width > 1

    def plan_batch(self, seqs: list, rows: int) -> None:
        self.choose.plan_batch(seqs, rows, model=False)

    def begin(self, seq, params: SamplingParams, vocab_size: int) -> DraftRound:
        return self.choose.begin(seq, params, vocab_size, model=False)

    def observe(self, seq, tree, acceptance) -> None:
        self.choose.observe(seq, tree, acceptance)

    @property
    def owner(self) -> ChoosePolicy:
        return self.choose

    def clear_text(self) -> None:
        self.choose.clear_text()

    @property
    def records(self) -> list[dict]:
        return self.choose.records


def _parallel_drafter(engine) -> bool:
    """Whether the engine's draft model is a ParallelSpec drafter (its [MASK] tokens draft every level in
    one forward; one that reads the target's hidden states takes no other round)."""
    return bool(getattr(getattr(engine, "draft", None), "n_masks", 0))


def _kind(chain) -> str:
    """The estimate a suffix chain is priced and judged with: FALLBACK for a one-token match's."""
    return FALLBACK if chain and chain[0].fallback else "suffix"


def _unseen(seq) -> int:
    """How many of the row's tokens its draft cache has not seen (a row of a call without one: 1)."""
    return 1 if seq.draft is None else len(seq.pending(seq.draft))


def _chain(nodes) -> list:
    """The draft's first chain (its most probable path): a tree source's first branch."""
    chain, last = [], -1
    for i, n in enumerate(nodes):
        if n.parent == last:
            chain.append(n)
            last = i
    return chain


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n

