"""Lossless verification of a draft tree against the target: the one module every mode uses.

Walk down the tree from the root. At a node, the target's distribution p for the next token is
known (one target forward scored every node). Try the node's children in order:
  accept child x with probability min(1, p(x) / q(x))
  on rejection: p <- norm(max(0, p - q)); without replacement also q(x) <- 0, q <- norm(q)
The first accepted child becomes the new node; if every child is rejected the next token is drawn
from the residual p; a leaf whose children are all accepted yields a bonus token drawn from p.
This is speculative sampling (Leviathan et al. 2023) on a chain and multi-candidate speculative
sampling (Yang et al. 2024) on a tree, and the output has exactly the target's distribution.
Deterministic children (picked by a policy, not drawn from q) use the same rule with a one-hot
proposal without replacement: accept child c with probability residual(c), and on rejection
zero c in the residual and renormalise -- so c is accepted with probability p(c) given that the
candidates before it were rejected. The ratio test against q would be biased for them (q(x) = 0.9,
p(x) = 0.5 would accept 0.556 of the time instead of 0.5). A sibling group may hold deterministic
children first and sampled ones after (a prompt-lookup guess beside the drafter's draws): the
deterministic ones are tried first, and the sampled ones then run the ratio rule against the residual
they leave. That is exact because the ratio rule is exact against any current distribution r (it
emits x with probability r(x) overall), and the residual is what the target's p is, given that the
deterministic candidates were rejected.
Greedy is the same walk with one-hot p: accept the child equal to argmax p, else emit argmax p.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .draft_tree import DraftTree
from .sampling import sample


@dataclass
class Acceptance:
    path: list[int]  # accepted node indices, root to leaf
    tokens: list[int]  # their tokens followed by the corrected or bonus token
    resampled: bool  # True when the last token replaced a rejected draft (False: bonus)


def _children(tree: DraftTree) -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for i, parent in enumerate(tree.parents):
        children.setdefault(parent, []).append(i)
    return children


def accept_greedy(tree: DraftTree, best: list[int]) -> Acceptance:
    """The greedy walk: best[0] is the target's argmax after the root, best[i + 1] after node i. Accept
    the child whose token is the argmax, else emit the argmax (a bonus token at a leaf)."""
    children = _children(tree)
    path: list[int] = []
    node = -1
    while True:
        token = best[node + 1]
        match = next((c for c in children.get(node, []) if tree.tokens[c] == token), None)
        if match is None:
            return Acceptance(path, [tree.tokens[i] for i in path] + [token], bool(children.get(node)))
        path.append(match)
        node = match


def _normalise(x: torch.Tensor) -> torch.Tensor:
    total = x.sum()
    return x / total if total > 0 else x


def accept_tokens(tree: DraftTree, target_probs: torch.Tensor, greedy: bool,
                  generator: torch.Generator | None) -> Acceptance:
    """target_probs[0] is p after the root, target_probs[i + 1] is p after node i (float32, like q)."""
    if greedy:  # one transfer of every node's argmax, then a walk in Python
        return accept_greedy(tree, target_probs.argmax(-1).tolist())
    children = _children(tree)
    path: list[int] = []
    node = -1
    while True:
        p = target_probs[node + 1]
        kids = children.get(node, [])
        if not kids:  # all drafts on this path accepted (or none drafted): bonus token from p
            return Acceptance(path, [tree.tokens[i] for i in path] + [sample(p, generator)], False)
        picked = [c for c in kids if tree.deterministic(c)]  # DraftTree puts them before the sampled ones
        residual = p
        if picked:
            found, residual = _try_deterministic(tree, picked, p, generator)
            if found is not None:
                path.append(found)
                node = found
                continue
            kids = kids[len(picked):]
            if not kids:
                return Acceptance(path, [tree.tokens[i] for i in path] + [sample(residual, generator)], True)
        residual = residual.clone()
        q = tree.q(kids[0]).clone()
        for c in kids:
            if not tree.without_replacement:
                q = tree.q(c)
            x = tree.tokens[c]
            u = torch.rand((), generator=generator, dtype=residual.dtype)
            if q[x] > 0 and u * q[x] < residual[x]:  # u < p(x)/q(x), without dividing by zero
                path.append(c)
                node = c
                break
            residual = _normalise(torch.clamp(residual - q, min=0))
            if tree.without_replacement:
                q = q.clone()
                q[x] = 0
                q = _normalise(q)
        else:
            if residual.sum() <= 0:  # only reachable through float round-off when p == q
                residual = p
            return Acceptance(path, [tree.tokens[i] for i in path] + [sample(residual, generator)], True)


def _try_deterministic(tree: DraftTree, kids: list[int], p: torch.Tensor,
                       generator: torch.Generator | None) -> tuple[int | None, torch.Tensor]:
    """One-hot proposals without replacement: the accepted child, or None and the residual."""
    residual = p.clone()
    for c in kids:
        x = tree.tokens[c]
        u = torch.rand((), generator=generator, dtype=residual.dtype)
        if u < residual[x]:
            return c, residual
        if residual[x] > 0:
            residual[x] = 0
            residual = _normalise(residual)
    if residual.sum() <= 0:  # the candidates covered all of p's mass: only reachable through round-off
        residual = p
    return None, residual
