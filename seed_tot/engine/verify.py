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
A draft-invariant sampled row (keyed_draws.py) is that walk too, with the target's token at each slot
drawn by inverse CDF at a uniform keyed by the row's seed and the slot's position, not argmax p.
Every row of a verification is decided on the device, all rows together with one transfer of the
decisions (`decide_on_device`, below): greedy rows by their argmaxes, sampled chains in one
vectorised ratio test, sampled trees that branch by this walk vectorised over rows
(tree_decision.py). The host walk `accept_tokens` stays the reference statement of the rule.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .draft_tree import DraftTree, check_packable, packed_tokens, place_device_tokens
from .keyed_draws import slot_uniforms
from .sampling import inverse_cdf, sample
from .host_to_device import to_device
from .tree_decision import tree_decisions


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


# Sampled rows, decided on the device. Every sampled row of a verification is decided in one
# computation on the logits' device, and one transfer brings the decisions back (with the greedy
# rows' argmaxes). A chain (one child per node: sd, seed with a chain k_config, auto and specdec
# chains, lookup chains, and the empty tree of a plain decode step) needs no walk: the ratio test at
# every depth is one vectorised comparison and the first failure ends the round (`_chain_decisions`).
# A tree that branches (mcsd, k_config like (2, 2, 1), opt-tree) runs the walk above vectorised over
# rows, a loop over depths and sibling slots with every row's node a device index (tree_decision.py):
# a rejected sibling's residual is the next sibling's target, so siblings are tried in turn.
#
# Randomness: a sampled row of n draft nodes draws exactly n + 1 float32 uniforms from its own
# generator per verification, in one torch.rand call (`row_uniforms`): u[i] tests draft node i (each
# node is tested at most once), u[n] draws the round's last token by inverse CDF, whatever the
# outcome. The draws depend on nothing but the row, so a row's tokens are the same verified alone or
# beside any other rows.


def is_chain(tree: DraftTree) -> bool:
    """One child per node (the empty tree included)."""
    return all(parent == i - 1 for i, parent in enumerate(tree.parents))


def row_uniforms(tree: DraftTree, generator: torch.Generator | None) -> list[float]:
    """The randomness one verification of a sampled row consumes: len(tree) + 1 uniforms in [0, 1)."""
    return torch.rand(len(tree) + 1, generator=generator).tolist()


def decide_alone(tree: DraftTree, target_probs: torch.Tensor, greedy: bool,
                 generator: torch.Generator | None, keyed: list[float] | None = None) -> Acceptance:
    """One row decided exactly as a verification decides it among other rows (speculative.accept_rows):
    a sampled row by `accept_sampled` with its own uniforms, a greedy one by its argmaxes, a
    draft-invariant one (keyed: its slots' keyed uniforms, keyed_draws.slot_uniforms) by its keyed
    draws. For callers that verify one row outside the scheduler (PipeDec's stages, batched decoding),
    so that they draw, for a seed, the tokens the scheduler's modes draw."""
    if greedy:
        return accept_tokens(tree, target_probs, greedy, generator)
    if keyed is not None:
        return decide_on_device([], [], None, [], [tree], draw_keyed(target_probs, keyed))[0]
    return accept_sampled([tree], target_probs[None], [row_uniforms(tree, generator)])[0]


def decide_row(seq, tree: DraftTree, target_probs: torch.Tensor, params) -> Acceptance:
    """`decide_alone` with the row's own randomness: its generator's draws, or (draft_invariant) the
    keyed uniforms of its tree's slots."""
    keyed = slot_uniforms(seq, tree.parents) if params.draft_invariant and not params.greedy else None
    return decide_alone(tree, target_probs, params.greedy, seq.generator, keyed)


def draw_keyed(probs: torch.Tensor, uniforms: list[float]) -> torch.Tensor:
    """The target's token at every slot [n, V] -> [n]: the inverse CDF of its p at its keyed uniform
    (keyed_draws.py), on p's device."""
    return inverse_cdf(probs, to_device(uniforms, probs.device, torch.float64))


def accept_sampled(trees: list[DraftTree], target_probs: torch.Tensor, uniforms: list[list[float]]) -> list[Acceptance]:
    """Sampled rows (chains and branching trees), decided together: target_probs[b, 0] is row b's p
    after its root, [b, i + 1] after its node i (float32, padded to the largest tree); uniforms[b]
    from `row_uniforms`."""
    return decide_on_device([], trees, target_probs, uniforms)


def decide_on_device(greedy: list[tuple[DraftTree, torch.Tensor]], sampled: list[DraftTree],
                     sampled_probs: torch.Tensor | None, uniforms: list[list[float]],
                     keyed: list[DraftTree] = (), keyed_tokens: torch.Tensor | None = None) -> list[Acceptance]:
    """Every row of a verification, with one device-to-host transfer: greedy rows (their tree and the
    target's logits after the root and after each node, vocabulary-cut) by their argmaxes, sampled
    rows as `accept_sampled`, draft-invariant rows (keyed) by the greedy walk over their keyed draws
    (keyed_tokens: len(tree) + 1 per tree, in order, `keyed_draws`). Returns the greedy rows'
    acceptances, then the keyed rows', then the sampled rows'."""
    chains = [b for b, tree in enumerate(sampled) if is_chain(tree)]
    branching = [b for b, tree in enumerate(sampled) if not is_chain(tree)]
    # draft tokens still on the draft's device (greedy picks, sampled draws) come back in the same
    # transfer, read first
    waiting = [tree for tree in [tree for tree, _ in greedy] + list(keyed) + sampled if tree.device_tokens is not None]
    parts = []
    if waiting:
        device = greedy[0][1].device if greedy else keyed_tokens.device if keyed else sampled_probs.device
        parts.append(torch.cat([tree.device_tokens for tree in waiting]).to(device))
    if greedy:
        parts.append(torch.cat([logits for _, logits in greedy]).argmax(-1))
    if keyed:
        parts.append(keyed_tokens)
    if chains:
        width = max(len(sampled[b]) for b in chains) + 1
        parts.append(_chain_decisions([sampled[b] for b in chains], _rows(sampled_probs, chains, width),
                                      [uniforms[b] for b in chains]).flatten())
    if branching:
        width = max(len(sampled[b]) for b in branching) + 1
        tree_part = tree_decisions([sampled[b] for b in branching], _rows(sampled_probs, branching, width),
                                   [uniforms[b] for b in branching])
        depth = tree_part.shape[1] - 1
        parts.append(tree_part.flatten())
    if not parts:
        return []
    decided = (torch.cat(parts) if len(parts) > 1 else parts[0]).tolist()  # the one transfer
    out, at = [], 0
    for tree in waiting:
        n = len(tree)
        tree.read_tokens(decided[at: at + n])
        at += n
    for tree, logits in greedy:
        n = logits.shape[0]
        out.append(accept_greedy(tree, decided[at: at + n]))
        at += n
    for tree in keyed:
        n = len(tree) + 1
        out.append(accept_greedy(tree, decided[at: at + n]))
        at += n
    by_row: dict[int, Acceptance] = {}
    for b in chains:
        tree = sampled[b]
        n, token = decided[at], decided[at + 1]
        at += 2
        by_row[b] = Acceptance(list(range(n)), tree.tokens[:n] + [token], n < len(tree))
    for b in branching:
        tree = sampled[b]
        path = [node for node in decided[at: at + depth] if node >= 0]
        token = decided[at + depth]
        at += depth + 1
        last = path[-1] if path else -1
        by_row[b] = Acceptance(path, [tree.tokens[i] for i in path] + [token], last in tree.parents)
    return out + [by_row[b] for b in range(len(sampled))]


def _rows(probs: torch.Tensor, rows: list[int], width: int) -> torch.Tensor:
    """probs' rows `rows`, cut to `width` entries: a view where they are consecutive (without an
    index tensor to copy to the device), else one copy."""
    if rows == list(range(rows[0], rows[0] + len(rows))):
        return probs[rows[0]: rows[0] + len(rows), :width]
    return torch.cat([probs[b: b + 1, :width] for b in rows])


def _chain_decisions(trees: list[DraftTree], p: torch.Tensor, uniforms: list[list[float]]) -> torch.Tensor:
    """[rows, 2] on p's device: how many draft tokens each chain accepts, and its extra token."""
    rows, width, vocab = p.shape
    k = width - 1
    check_packable(trees, vocab)
    # one host-to-device copy for every row: uniforms (padding 1.0: never accepts), the extra token's
    # uniform, draft tokens as float32 (exact below 2**24; padding -1; 0 holds the place of a token
    # still on the device), and which nodes were picked
    packed = []
    for tree, u in zip(trees, uniforms):
        n, pad = len(tree), k - len(tree)
        packed.append(u[:n] + [1.0] * pad + [u[n]] + packed_tokens(tree) + [-1.0] * pad
                      + [float(tree.deterministic(i)) for i in range(n)] + [0.0] * pad)
    packed_t = to_device(packed, p.device, torch.float32)
    u, u_extra = packed_t[:, :k], packed_t[:, k]
    tokens = packed_t[:, k + 1: 2 * k + 1].long()
    place_device_tokens(tokens, trees)
    picked = packed_t[:, 2 * k + 1:] > 0
    n_draft = (tokens >= 0).sum(-1)
    at = torch.arange(rows, device=p.device)
    if k:
        tok = tokens.clamp(min=0)
        zero = p.new_zeros(vocab)  # q of a picked node or of padding: unused (picked nodes are one-hot)
        q = torch.stack([(tree.q(i) if i < len(tree) and not tree.deterministic(i) else zero)
                         .to(p.device, non_blocking=True) for tree in trees for i in range(k)]).view(rows, k, vocab)
        px = p[:, :k].gather(-1, tok[..., None])[..., 0]
        qx = torch.where(picked, torch.ones_like(px), q.gather(-1, tok[..., None])[..., 0])
        # u < p(x) / q(x) without dividing by zero, as the host walk tests it
        passed = (tokens >= 0) & (qx > 0) & (u * qx < px)
        n_acc = passed.long().cumprod(-1).sum(-1)
        stop = n_acc.clamp(max=k - 1)
        p_stop = p[at, n_acc]
        # the residual at the rejected node: max(0, p - q) for a sampled one, p without x for a picked one
        residual = torch.where(picked[at, stop, None], p_stop.scatter(-1, tok[at, stop, None], 0.0),
                               torch.clamp(p_stop - q[at, stop], min=0))
        residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_stop)  # round-off when p == q
        dist = torch.where((n_acc < n_draft)[:, None], residual, p_stop)
    else:  # every row a plain decode step
        n_acc = n_draft
        dist = p[:, 0]
    return torch.stack([n_acc, inverse_cdf(dist, u_extra)], -1)
