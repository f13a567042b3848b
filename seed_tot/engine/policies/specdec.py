"""`specdec`: SpecDec++ (Huang et al. 2024, seed 004) -- a chain whose length a trained head decides.

The head reads the draft's final hidden state at each drafted token Y_j (the forward that feeds
Y_j also yields q for Y_{j+1}) and predicts P̂_j = P(Y_j accepted | Y_1..Y_{j-1} accepted). After
drafting Y_i, drafting stops once the chance that some earlier token is rejected is high enough:
    1 - prod_{j < i} P̂_j > h        (and min_len <= i <= max_len; EOS and the token budget stop too)
so with a constant head a, K = the smallest i >= min_len with 1 - a^(i-1) > h.
Options: head (a directory from `seed-tot train-head`), h (threshold), min_len, max_len.
Tokens are sampled from q (sampled decoding) or the draft's argmax (greedy, deterministic).
"""
from __future__ import annotations

import logging

import torch

from ..params import SamplingParams
from ..sampling import multinomial
from .base import DraftPolicy, DraftRound, Feed, HiddenCapture, TreeBuilder, option
from .head import accept_probability

log = logging.getLogger(__name__)


class SpecDecPolicy(DraftPolicy):
    name = "specdec"
    drafts_trees = False  # one chain, cut where the head predicts a rejection

    def __init__(self, head, h: float = 0.5, min_len: int = 2, max_len: int = 20, eos_ids=frozenset(),
                 capture: HiddenCapture | None = None):
        if not 0 < h < 1 or min_len < 1 or max_len < min_len:
            raise ValueError(f"specdec needs 0 < h < 1 and 1 <= min_len <= max_len, got h={h}, "
                             f"min_len={min_len}, max_len={max_len}")
        self.head, self.h, self.min_len, self.max_len = head, h, min_len, max_len
        self.eos_ids, self.capture = frozenset(eos_ids), capture

    @classmethod
    def parse_options(cls, head=None, h=0.5, min_len=2, max_len=20) -> dict:
        if head is None:
            raise ValueError("draft policy 'specdec' needs a trained head: --head DIR (policy option head=DIR)")
        o = {"head": str(head), "h": option(cls.name, "h", h, float),
             "min_len": option(cls.name, "min_len", min_len, int, 1),
             "max_len": option(cls.name, "max_len", max_len, int, 1)}
        # checked here, not only in __init__: a command checks its options before it loads any model
        if not 0 < o["h"] < 1:
            raise ValueError(f"draft policy {cls.name!r}: option h={h!r} must be between 0 and 1 (a rejection "
                             f"probability), exclusive")
        if o["max_len"] < o["min_len"]:
            raise ValueError(f"draft policy {cls.name!r}: option max_len={max_len!r} must be >= min_len={min_len!r}")
        return o

    @classmethod
    def from_options(cls, engine, k_config, params, **options) -> "SpecDecPolicy":
        o = cls.parse_options(**options)
        return cls(load_checked_head(o["head"], engine, params), o["h"], o["min_len"], o["max_len"],
                   engine.eos_ids, engine.draft_runtime.capture(HiddenCapture))

    def predict(self, hidden: torch.Tensor) -> float:
        """P̂ for the token whose entry produced `hidden` (one vector)."""
        return accept_probability(self.head, hidden)

    def enough(self, n: int, rnd: "SpecDecRound") -> bool:
        """Stop after n drafted tokens: a rejection among them is likely enough (SpecDec++'s rule)."""
        return n >= self.min_len and 1.0 - rnd.survival > self.h

    def begin(self, seq, params: SamplingParams, vocab_size: int) -> DraftRound:
        return SpecDecRound(TreeBuilder(seq, params, vocab_size), self)


def load_checked_head(head: str, engine, params: SamplingParams) -> torch.nn.Module:
    """The head in directory `head`, refused unless trained for this engine's models and hidden size,
    on the draft's device; a warning when it was trained for other sampling settings."""
    from .head import load_head

    model, trained_for = load_head(head, engine.target_name, engine.draft_name)
    hidden = engine.draft.get_output_embeddings().weight.shape[1]
    if model.config["hidden_size"] != hidden:
        raise ValueError(f"{head}: head reads hidden size {model.config['hidden_size']}, the draft has {hidden}")
    sampled = {k: trained_for.get(k) for k in ("temperature", "top_k", "top_p")}
    now = {"temperature": params.temperature, "top_k": params.top_k, "top_p": params.top_p}
    if sampled != now:  # acceptances depend on the sampling settings: say so, still usable
        log.warning("head %s was trained for sampling %s, running with %s", head, sampled, now)
    return model.to(engine.draft.device)


class SpecDecRound(DraftRound):
    """A chain drafted one token per forward, judged by the head, until `policy.enough(n, round)`
    (SpecDec++'s threshold, or `auto`'s cost rule), max_len, EOS or the token budget."""

    needs_hidden = True

    def __init__(self, builder: TreeBuilder, policy):
        self.b, self.policy = builder, policy
        self.max_len = min(policy.max_len, max(1, builder.remaining))
        self.survival = 1.0  # prod of P̂ over the drafted tokens fed so far
        self.survival_sum = 0.0  # sum over those tokens of the survival up to each: expected accepted ones
        self.last_p: float | None = None  # P̂ of the last judged token
        self.last = -1

    def first_feed(self) -> Feed:
        return self.b.pending_feed()

    def step(self, logits: torch.Tensor, hidden: torch.Tensor | None) -> Feed | None:
        b, policy = self.b, self.policy
        if self.last >= 0:  # the last fed entry is a drafted token: the head judges it
            self.last_p = policy.predict(hidden[-1])
            self.survival *= self.last_p
            self.survival_sum += self.survival
        node_logits = logits[-1]
        if b.params.greedy:
            token, q = int(node_logits[: b.vocab_size].float().argmax()), None
        else:
            q = b.q(node_logits)
            token = int(multinomial(q, 1, b.seq.generator))
        self.last = b.add(self.last, token, q, self.survival)
        n = len(b.tokens)
        if n >= self.max_len or token in policy.eos_ids or policy.enough(n, self):
            return None
        return b.feed_nodes([self.last])

    def finish(self):
        return self.b.tree()
