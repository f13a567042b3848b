"""PipeDec's dynamic prediction tree (Yin et al. 2025, "layer update").

The tree's root is the newest emitted token; its descendants are draft guesses, one layer deeper
per tick. A new layer comes from the deepest layer: each node's top-c children by draft
probability, scored by path log-probability, the best w kept. When the target emits a token, the
tree either rerooted at the matching child (hit: only that child's subtree survives) or restarts
from the new token (miss). Every process keeps an identical replica, so every stage prunes its
own cache and in-flight activations from the same (token) decision without further messages.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


def expand_layer(path_logp: torch.Tensor, child_logp: torch.Tensor, children: int,
                 width: int) -> tuple[list[int], list[int], torch.Tensor]:
    """One layer update. path_logp [n]: the deepest layer's path log-probabilities; child_logp [n, V]:
    each node's draft log-probabilities for its next token. Returns the new layer in breadth-first
    order (by parent, then by draft rank): parent positions within the deepest layer, tokens, and
    path log-probabilities. At most `children` per parent and `width` in all.

    A policy-independent step: OPT-Tree's layer growth is the same top-c / best-w selection."""
    if children < 1 or width < 1:
        raise ValueError(f"a prediction tree needs children >= 1 and width >= 1, got {children} and {width}")
    top = torch.topk(child_logp.double(), min(children, child_logp.shape[-1]), dim=-1)
    scores = path_logp.double()[:, None] + top.values  # [n, c]
    k = min(width, scores.numel())
    best = torch.sort(torch.topk(scores.flatten(), k).indices).values  # parent-major, rank-minor
    c = top.values.shape[1]
    parents, ranks = best // c, best % c
    return parents.tolist(), top.indices[parents, ranks].tolist(), scores[parents, ranks]


@dataclass
class Node:
    token: int
    parent: int  # node id, -1 for the root
    logp: float  # path log-probability under the draft (relative to the tree's first root)


class PredictionTree:
    """Node ids only grow (unique for the whole generation); `layers[k]` lists the ids at depth k
    below the root, breadth-first."""

    def __init__(self, root_token: int):
        self.nodes: dict[int, Node] = {0: Node(root_token, -1, 0.0)}
        self.layers: list[list[int]] = [[0]]
        self.next_id = 1

    @property
    def root(self) -> int:
        return self.layers[0][0]

    def add_layer(self, parent_ids: list[int], tokens: list[int], logps: list[float]) -> list[int]:
        if any(p not in self.layers[-1] for p in parent_ids):
            raise ValueError("a new tree layer must hang off the deepest layer")
        ids = list(range(self.next_id, self.next_id + len(tokens)))
        self.next_id += len(tokens)
        for i, p, t, lp in zip(ids, parent_ids, tokens, logps):
            self.nodes[i] = Node(int(t), int(p), float(lp))
        if ids:
            self.layers.append(ids)
        return ids

    def advance(self, token: int) -> bool:
        """The target emitted `token` at the root: reroot at the matching child (True) or restart."""
        match = [c for c in self.layers[1] if self.nodes[c].token == token] if len(self.layers) > 1 else []
        if match:
            alive = {match[0]}
            layers = [[match[0]]]
            for layer in self.layers[2:]:
                kept = [n for n in layer if self.nodes[n].parent in alive]
                if not kept:
                    break
                alive.update(kept)
                layers.append(kept)
            self.layers = layers
            self.nodes = {n: self.nodes[n] for n in alive}
            return True
        root = self.next_id
        self.next_id += 1
        self.nodes = {root: Node(int(token), -1, 0.0)}
        self.layers = [[root]]
        return False

    def ids(self) -> list[int]:
        return [n for layer in self.layers for n in layer]

    def __contains__(self, node: int) -> bool:
        return node in self.nodes
