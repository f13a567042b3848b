"""Target forward costs measured at the load a run actually has (`choose`'s option costs=measured).

The calibration (cost_model.py) times one row scoring n query tokens after a 64-token prefix, once
per machine. A ToT run's verifications are something else: several rows, each over its own history
of hundreds of tokens, gathered per layer, and a round in which one row drafts pads every row's
queries to its width. On the 2-core CPU, six 700-token rows decode in about 1.5x the calibrated
cost of six query tokens, and a drafted token adds about 3x the calibrated slope
(docs/benchmarks.md, "Costs measured at the run's load"), so a policy priced by the calibration takes
drafts whose tokens cost more than a plain step's.

So the scheduler reports every verification forward it runs (rows, query tokens, seconds from
launch to the decisions read back: `DraftPolicy.observe_forward`), and this keeps a decayed least
squares fit of

    seconds = a + b x query tokens + c x rows

held by a ridge toward the calibrated curve's line (which says: query tokens alone, c = 0), so that
before any forward the fit is the calibration, and along a direction the run has not explored (rows
that never drafted leave b and c apart unseen) it stays near it. `at(rows)` is a `Costs`-like view for a
round of `rows` rows: its target(n) reads the fit at those rows.

The draft model's steps are measured too, where it runs on the CPU (`DraftPolicy.observe_draft_forward`:
the entries a draft forward fed, and its seconds with the round's picks): beside a target on the same
cores and through a batch's gathered histories, a draft step costs more than the calibration's lone
step (docs/benchmarks.md, "Draft steps priced as measured"), enough to flip a round's choice, which
for a dear draft sits near its margin. `at(rows)`'s
draft(n) is the calibration's scaled by the decayed ratio of measured seconds to what the
calibration priced those forwards at, held toward 1 by DRAFT_PRIOR_STEPS one-token steps.

The seconds are wall-clock, so only a row whose drafts cannot change its tokens (greedy, or
drafter-invariant sampling: base.reads_others) may be priced with them; any other sampled row keeps
the calibration, so that its sample for a seed never depends on how fast the machine was.
"""
from __future__ import annotations

import numpy as np

from .cost_model import Costs, RoundCosts

COST_PRICING = ("measured", "calibrated")
# where the calibrated curve's line is read (rows, query tokens), and the scale of a round's tokens and rows
PRIOR_POINTS = ((1, 1), (1, 8), (4, 4), (4, 16), (16, 16), (16, 48))
TYPICAL_TOKENS = 8.0
DRAFT_PRIOR_STEPS = 4.0  # the draft cost ratio's prior (1.0), worth this many one-token calibrated steps



class LoadCosts:
    """A decayed least-squares fit of verification seconds on (1, query tokens, rows), starting from
    the calibrated `Costs`."""

    def __init__(self, calibrated: Costs, decay: float = 0.97, prior_weight: float = 0.1):
        if not 0 < decay <= 1 or prior_weight <= 0:
            raise ValueError("LoadCosts needs 0 < decay <= 1 and prior_weight > 0")
        self.calibrated, self.decay = calibrated, decay
        self.forwards = 0  # verification forwards observed
        # the prior: the calibrated curve's line in query tokens (rows add nothing), held with the weight
        # of `prior_weight` forwards at a typical round's scale, never decayed, so a direction the run
        # has not explored (rows that never drafted leave tokens and rows apart unseen) stays the prior's
        x = np.array([[1.0, tokens, rows] for rows, tokens in PRIOR_POINTS])
        y = np.array([calibrated.target(tokens) for _, tokens in PRIOR_POINTS])
        self._prior = np.linalg.lstsq(x, y, rcond=None)[0]
        self._penalty = prior_weight * np.diag([1.0, TYPICAL_TOKENS ** 2, TYPICAL_TOKENS ** 2])
        self._xtx, self._xty = np.zeros((3, 3)), np.zeros(3)
        self._coef = self._prior.copy()
        # draft forwards: decayed measured seconds, and what the calibration priced the same forwards at
        self._draft_seen = self._draft_priced = 0.0
        self._draft_prior = DRAFT_PRIOR_STEPS * calibrated.draft(1)

    def observe(self, rows: int, tokens: int, seconds: float) -> None:
        """One verification forward of `rows` rows and `tokens` query tokens took `seconds`."""
        if rows < 1 or tokens < rows or not seconds > 0:
            return
        x = np.array([1.0, tokens, rows])
        self._xtx = self.decay * self._xtx + np.outer(x, x)
        self._xty = self.decay * self._xty + x * seconds
        self.forwards += 1
        # least squares with a ridge toward the prior: (X'X + P) coef = X'y + P prior
        coef = np.linalg.solve(self._xtx + self._penalty, self._xty + self._penalty @ self._prior)
        # a forward of more tokens or rows never costs less: a negative slope is noise of a narrow spread
        coef[1], coef[2] = max(coef[1], 0.0), max(coef[2], 0.0)
        self._coef = coef

    def observe_draft(self, tokens: int, seconds: float) -> None:
        """One draft forward that fed `tokens` entries (rows x their fed tokens) took `seconds`."""
        if tokens < 1 or not seconds > 0:
            return
        self._draft_seen = self.decay * self._draft_seen + seconds
        self._draft_priced = self.decay * self._draft_priced + self.calibrated.draft(tokens)

    def draft_scale(self) -> float:
        """Measured draft seconds over the calibration's price of the same forwards (1.0 before any)."""
        return (self._draft_seen + self._draft_prior) / (self._draft_priced + self._draft_prior)

    def target(self, rows: int, tokens: int) -> float:
        """Seconds of one verification forward of `rows` rows carrying `tokens` query tokens."""
        a, b, c = self._coef
        return max(a + b * tokens + c * rows, 1e-6)

    def at(self, rows: int) -> "AtLoad":
        return AtLoad(self, rows)


class AtLoad(RoundCosts):
    """The costs a round of `rows` rows is planned with: target(n) from the fit at those rows, draft(n)
    the calibration's at the measured draft ratio."""

    def __init__(self, costs: LoadCosts, rows: int):
        super().__init__(costs.calibrated, rows)
        self.load = costs
        self._draft_scale = costs.draft_scale()
        self.draft_step_s = self.calibrated.draft_step_s * self._draft_scale

    def target(self, tokens: int) -> float:
        return self.load.target(self.rows, tokens)

    def draft(self, tokens: int) -> float:
        return self.calibrated.draft(tokens) * self._draft_scale
