"""Which levels of a drafted tree a round keeps: the cost cut of `parallelspec` (parallelspec.py's
module doc has the why and the exactness argument).

A level is a list of nodes (parent slot, token, q, p̂), p̂ being the node's estimated chance of
acceptance along its path. Keeping levels 1..d of a draft is worth

    E(d) / time(d),   E(d) = 1 + sum of p̂ over nodes at depth <= d,   time(d) = t_draft + t_target(tokens(d))

expected new tokens per second of the round; `row_cut` picks d for one row, `joint_cut` for every
row of a batched round that shares one verification forward.
"""
from __future__ import annotations

from ..cost_model import Costs


def row_cut(levels: list[list[tuple]], costs: Costs, rows: int = 1, draft_forwards: int = 1,
            level_by_level: bool = False) -> int:
    """The number of levels whose draft has the most expected tokens per second, in a forward of `rows`
    rows that each draft like this one (1: the row alone); level_by_level: the first level that does
    not raise the rate ends the draft (a sampled row's rule: whether a level is kept then depends on
    nothing drawn at or below it)."""
    expected, nodes, best, best_rate = 1.0, 0, 1, -1.0
    draft_s = costs.draft(rows) * draft_forwards  # already spent: it only weighs against the target's
    for d, level in enumerate(levels, 1):
        expected += sum(node[3] for node in level)
        nodes += len(level)
        target_s = costs.target(rows * (nodes + 1))  # non-decreasing in tokens (Costs reads a monotone fit)
        rate = rows * expected / (draft_s + target_s)
        if rate > best_rate:  # ties keep the shallower draft
            best, best_rate = d, rate
        elif level_by_level:
            break
    return best


class JointCut:
    """The rows of one batched round that are cut together, keyed by id(seq): each row's round stores
    its levels once drawn, and the first to finish cuts them all."""

    def __init__(self, costs: Costs, other_tokens: int, draft_forwards: int = 1):
        self.costs, self.other_tokens, self.draft_forwards = costs, other_tokens, draft_forwards
        self.levels: dict[int, list] = {}
        self._kept: dict[int, int] | None = None

    def kept(self, key: int) -> int:
        if self._kept is None:  # the first finish(): every row's step has run
            keys = list(self.levels)
            self._kept = dict(zip(keys, joint_cut([self.levels[k] for k in keys], self.costs, self.other_tokens,
                                                  self.draft_forwards)))
        return self._kept[key]


def joint_cut(rows: list[list[list[tuple]]], costs: Costs, other_tokens: int = 0, draft_forwards: int = 1) -> list[int]:
    """Levels kept per row for the most expected tokens per second of the round: every row keeps its
    first level; then, greedily, the level with the most p̂ per verified token anywhere joins while
    that raises (expected tokens) / (draft + target time). Within a row a level's p̂ sum never exceeds
    its parent level's, so levels join in order. `other_tokens`: rows of the forward that draft
    nothing here, one verified token each at least."""
    kept = [min(1, len(levels)) for levels in rows]
    expected = other_tokens + sum(1 + sum(n[3] for n in levels[0]) if levels else 1 for levels in rows)
    tokens = other_tokens + sum(1 + (len(levels[0]) if levels else 0) for levels in rows)
    draft_s = costs.draft(len(rows)) * draft_forwards  # the round's drafter forwards (one per pass), already spent
    target_s = costs.target(tokens)
    while True:
        open_rows = [i for i, levels in enumerate(rows) if kept[i] < len(levels)]
        if not open_rows:
            return kept
        i = max(open_rows, key=lambda i: sum(n[3] for n in rows[i][kept[i]]) / len(rows[i][kept[i]]))
        level = rows[i][kept[i]]
        next_s = costs.target(tokens + len(level))  # never below target_s: Costs reads a monotone fit
        gain = sum(n[3] for n in level)
        if (expected + gain) / (draft_s + next_s) <= expected / (draft_s + target_s):
            return kept
        kept[i] += 1
        expected, tokens, target_s = expected + gain, tokens + len(level), next_s
