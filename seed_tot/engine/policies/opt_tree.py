"""`opt-tree`: OPT-Tree's adaptive draft tree (Wang et al. 2024, seed 002, Algorithm 1).

Each draft step expands the newest layer: every frontier node proposes its n most likely children,
scored by the path probability p̂ (the product of the draft's probabilities along the path), and
the layer keeps the n best. The tree to verify is T_sub, the n nodes of the whole tree with the
largest p̂; E_sub = sum of their p̂ estimates the accepted length, so E(A) = 1 + E_sub tokens per
round. Growth stops when a layer raises E_sub by less than delta, at max_depth, or at the token
budget. p̂ decreases along every path, so top-n by p̂ (ties: lower index, i.e. shallower first) is
closed under "parent of" and already in topological order; only frontier nodes inside T_sub can
have children that enter a later T_sub, so only they are fed.

The nodes are picked, not sampled: they are deterministic candidates, which the verifier checks
with the one-hot rule, so the output keeps the target's distribution at any temperature.
Options: n (node budget), delta, max_depth, temperature (of p̂; default: the sampling settings'
processed distribution when sampling, the plain softmax when greedy).
"""
from __future__ import annotations

import dataclasses

import torch

from ..params import SamplingParams
from ..sampling import process_logits
from .base import DraftPolicy, DraftRound, Feed, TreeBuilder, option


@dataclasses.dataclass(frozen=True)
class OptTreeOptions:
    n: int = 8
    delta: float = 0.2
    max_depth: int = 8
    temperature: float | None = None

    def __post_init__(self) -> None:
        if self.n < 1 or self.max_depth < 1:
            raise ValueError(f"opt-tree needs n >= 1 and max_depth >= 1, got n={self.n}, max_depth={self.max_depth}")
        if self.delta < 0:
            raise ValueError(f"opt-tree delta must be >= 0, got {self.delta}")
        if self.temperature is not None and self.temperature <= 0:
            raise ValueError(f"opt-tree temperature must be > 0, got {self.temperature}")


class OptTreePolicy(DraftPolicy):
    name = "opt-tree"

    def __init__(self, n: int = 8, delta: float = 0.2, max_depth: int = 8, temperature: float | None = None):
        self.options = OptTreeOptions(int(n), float(delta), int(max_depth),
                                      None if temperature is None else float(temperature))
        self.drafts_trees = self.options.n > 1  # n = 1 keeps one node per layer: a chain

    @classmethod
    def may_draft_trees(cls, engine, k_config, options) -> bool:
        return options["n"] == "auto" or options["n"] > 1  # derived n is at least 2

    @classmethod
    def parse_options(cls, n=8, delta=0.2, max_depth=8, temperature=None) -> dict:
        """n and delta may be "auto": derived from this hardware's calibrated forward costs (engine/cost_model.py)."""
        return {"n": option(cls.name, "n", n, int, 1, words=("auto",)),
                "delta": option(cls.name, "delta", delta, float, 0, words=("auto",)),
                "max_depth": option(cls.name, "max_depth", max_depth, int, 1),
                "temperature": None if temperature is None else option(cls.name, "temperature", temperature, float)}

    @classmethod
    def from_options(cls, engine, k_config, params, **options) -> "OptTreePolicy":
        o = cls.parse_options(**options)
        if "auto" in (o["n"], o["delta"]):
            from ..cost_model import derive_opt_tree_options, load_costs
            derived = derive_opt_tree_options(load_costs(engine))
            o.update({key: derived[key] for key in ("n", "delta") if o[key] == "auto"})
        return cls(o["n"], o["delta"], o["max_depth"], o["temperature"])

    def begin(self, seq, params: SamplingParams, vocab_size: int) -> DraftRound:
        return OptTreeRound(TreeBuilder(seq, params, vocab_size), self.options)


class OptTreeRound(DraftRound):
    def __init__(self, builder: TreeBuilder, options: OptTreeOptions):
        self.b, self.o = builder, options
        self.max_depth = min(options.max_depth, max(1, builder.remaining))
        self.depth = 0
        self.frontier: list[int] = []  # nodes fed by the last step (-1: the root)
        self.best: list[int] = []  # T_sub
        self.e_sub = 0.0

    def first_feed(self) -> Feed:
        return self.b.pending_feed()

    def _phat_dist(self, logits: torch.Tensor) -> torch.Tensor:
        b = self.b
        if self.o.temperature is not None:
            return torch.softmax(logits[: b.vocab_size].float() / self.o.temperature, -1)
        if b.params.greedy:
            return torch.softmax(logits[: b.vocab_size].float(), -1)
        return process_logits(logits, b.params, b.vocab_size)

    def step(self, logits: torch.Tensor, hidden: torch.Tensor | None) -> Feed | None:
        b, n = self.b, self.o.n
        frontier = [(-1, logits[-1])] if self.depth == 0 else list(zip(self.frontier, logits))
        candidates = []  # (p̂, parent, token)
        for node, node_logits in frontier:
            base = 1.0 if node < 0 else b.path_probs[node]
            probs = self._phat_dist(node_logits)
            top = torch.topk(probs, min(n, int((probs > 0).sum())))
            candidates += [(base * float(v), node, int(t)) for v, t in zip(top.values, top.indices)]
        candidates.sort(key=lambda c: -c[0])  # stable: ties keep parent order, then token rank
        layer = [b.add(parent, tok, None, phat) for phat, parent, tok in candidates[:n]]
        self.depth += 1
        ranked = sorted(range(len(b.tokens)), key=lambda i: (-b.path_probs[i], i))
        best = sorted(ranked[:n])
        e_sub = sum(b.path_probs[i] for i in best)
        gain, self.best, self.e_sub = e_sub - self.e_sub, best, e_sub
        in_best = set(best)
        self.frontier = [i for i in layer if i in in_best]
        if gain < self.o.delta or self.depth >= self.max_depth or not self.frontier:
            return None
        return b.feed_nodes(self.frontier)

    def finish(self):
        return self.b.tree(self.best, with_path_probs=True)

