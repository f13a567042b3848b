"""How `choose` prices a round's options, and the running counts it prices them from.

For a row whose draft model has per-token acceptance a_m and whose suffix source offers a chain at
acceptance a_s, each option (model chain of K, suffix chain of L, both off one root, or none) is:

    expected accepted   model chain of K: sum_i a_m^i; suffix chain of L: sum_i a_s^i; both (two
                        branches off the root): sum_i a_s^i [i <= L] + (1 - a_s^i [i <= L]) a^i [i <= K],
                        a = a_m|miss where i <= L (the model's acceptance in rounds whose suffix chain
                        missed its first token), else a_m
    step cost           K draft steps (each one forward of the draft model, shared by the rows that
                        draft with it this round: plan_batch prices the jointly planned rows at that
                        number, a row planned alone at its round's rows; the first step also feeds the
                        row's tokens the draft has not seen, every one since it last drafted)
                        + what verifying 1 + K + L tokens adds to the round's target forward
    choice              the option with the most  expected accepted - R x added seconds,  R being
                        the round's plain rate (rows / target(rows)): an option is taken only where
                        its tokens come cheaper than a plain step's, as `auto` declines a draft
                        that does not pay (none scores 0).
"""
from __future__ import annotations

from ..cost_model import Costs

COVERAGE_DECAY = 0.99  # per round of a phase's pooled rows: about its last hundred


def expected_accepted(a_model: float, k: int, a_suffix: float, l: int, missed: float | None = None) -> float:
    """Expected accepted draft tokens of a model chain of k and a suffix chain of l off one root.
    missed: the model's acceptance where the suffix chain is wrong (None: a_model, as if the two were
    independent). The two tend to be right together (both read the same context), so the model
    adds to a graft what it gets right where the suffix chain fails, which is less than its
    acceptance overall."""
    a_missed = a_model if missed is None else missed
    total = 0.0
    for i in range(1, max(k, l) + 1):
        suffix = a_suffix ** i if i <= l else 0.0
        model = (a_missed if i <= l else a_model) ** i if i <= k else 0.0
        total += suffix + (1.0 - suffix) * model  # P(the suffix chain's first i are right, else the model's)
    return total


def best_option(a_model: float, a_suffix: float, suffix_len: int, costs: Costs, max_len: int, rows: int,
                graft: bool, one_pass: bool = False, drafting: int | None = None, pending: int = 1,
                missed: float | None = None) -> tuple[int, int]:
    """(model chain length, suffix chain length) with the most expected accepted tokens minus what
    their added seconds would give at the round's plain rate; (0, 0): a plain step. The suffix chain
    may be cut to any prefix of its suffix_len nodes. one_pass: the model drafts its max_len levels
    in one forward (a ParallelSpec drafter) or not at all. drafting: the rows that share the model's
    draft steps (default: every row of the round); pending: the row's tokens the draft model has not
    seen yet (every token since it last drafted), fed at its first draft step; missed: the model's
    acceptance where the suffix chain is wrong (expected_accepted)."""
    return _best(a_model, a_suffix, suffix_len, costs, max_len, rows, graft, one_pass, drafting, pending, missed)[:2]


def option_saving(a_model: float, a_suffix: float, suffix_len: int, costs: Costs, max_len: int, rows: int,
                  graft: bool, one_pass: bool = False, missed: float | None = None) -> float:
    """Seconds per new token a row saves against plain steps by taking best_option's choice every
    round (max_len 0: the suffix chain alone): its gain is accepted tokens less the added seconds'
    worth at the plain rate, so gain / rate seconds a round, over the 1 + accepted tokens it writes."""
    k, l, gain = _best(a_model, a_suffix, suffix_len, costs, max_len, rows, graft, one_pass, missed=missed)
    if not gain:
        return 0.0
    rate = max(1, rows) / costs.target(max(1, rows))
    return gain / (rate * (1.0 + expected_accepted(a_model, k, a_suffix, l, missed)))


def _best(a_model: float, a_suffix: float, suffix_len: int, costs: Costs, max_len: int, rows: int, graft: bool,
          one_pass: bool = False, drafting: int | None = None, pending: int = 1,
          missed: float | None = None) -> tuple[int, int, float]:
    """best_option's (model length, suffix length) and its gain (0.0 for a plain step)."""
    rows = max(1, rows)
    drafting = rows if drafting is None else max(1, drafting)
    base = costs.target(rows)
    rate = rows / base
    per_step = costs.draft(drafting) / drafting  # one row's share of a draft step run for `drafting` rows
    # the first step also catches the draft up on the row's unseen tokens (as auto's batch_time prices it)
    first = costs.draft(drafting * max(1, pending)) / drafting
    best, best_gain = (0, 0), 0.0
    for k in ((0, max_len) if one_pass and max_len else range(max_len + 1)):
        for l in range(suffix_len + 1):  # any prefix of the suffix chain: a long match may pay only in part
            if (k == 0 and l == 0) or (k and l and not graft):
                continue
            drafted = 0.0 if k == 0 else first + (0 if one_pass else k - 1) * per_step
            added = costs.target(rows + k + l) - base + drafted
            gain = expected_accepted(a_model, k, a_suffix, l, missed) - rate * added
            if gain > best_gain:
                best, best_gain = (k, l), gain
    return best[0], best[1], best_gain


class Estimate:
    """Decayed judged tokens of one source: hits (accepted), trials (accepted + the first rejected)."""

    __slots__ = ("hits", "trials")

    def __init__(self):
        self.hits = self.trials = 0.0

    def add(self, accepted: int, offered: int, decay: float) -> None:
        self.hits = decay * self.hits + accepted
        self.trials = decay * self.trials + accepted + (accepted < offered)

    def value(self, start: float, weight: float) -> float:
        return (self.hits + start * weight) / (self.trials + weight)


class Coverage:
    """Decayed rounds of one phase's pooled rows: how many, and per kind of suffix chain (the estimate
    it is judged in: "suffix" or choose.FALLBACK) how many it was offered for and those chains' nodes,
    so the call pricing subtracts each kind's share at that kind's acceptance."""

    __slots__ = ("rounds", "offered", "nodes")

    def __init__(self):
        self.rounds = 0.0
        self.offered: dict[str, float] = {}
        self.nodes: dict[str, float] = {}

    def add(self, kind: str, length: int, decay: float) -> None:
        self.rounds = decay * self.rounds + 1
        for k in self.offered:
            self.offered[k] *= decay
            self.nodes[k] *= decay
        if length > 0:
            self.offered[kind] = self.offered.get(kind, 0.0) + 1
            self.nodes[kind] = self.nodes.get(kind, 0.0) + length

    def kinds(self) -> list[str]:
        """The kinds of chain offered so far."""
        return [k for k, n in self.offered.items() if n > 0]

    def share(self, kind: str) -> float:
        return self.offered.get(kind, 0.0) / self.rounds if self.rounds else 0.0

    def priced(self, alone: float, beside) -> float:
        """A saving per new token over the phase's rounds: `alone` in rounds no chain was offered for,
        beside(kind, its mean chain length) in each kind's share of them."""
        kinds = self.kinds()
        covered = sum(self.share(k) for k in kinds)
        return (1.0 - covered) * alone + sum(self.share(k) * max(0.0, beside(k, self.length(k))) for k in kinds)

    def length(self, kind: str) -> int:
        """The kind's offered chains' mean length, rounded (at least 1); 0 if none was offered."""
        offered = self.offered.get(kind, 0.0)
        return max(1, round(self.nodes[kind] / offered)) if offered else 0
