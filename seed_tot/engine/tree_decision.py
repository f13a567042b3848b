"""Sampled draft trees that branch, decided on the device: verify.py's walk, vectorised over rows.

The rule is verify.py's (read its docstring): at each node, try its children in order, the picked
(deterministic) ones first with one-hot proposals, then the sampled ones with the ratio test against
the residual; the first accepted child becomes the new node, and a node whose children are all
rejected, or a leaf, ends the round with a token drawn from the residual (or from p at a leaf).

Vectorised: every row stands at one node, held as a device index tensor. A Python loop runs over
the depths (up to the deepest tree) and, at each depth, over the sibling slots (up to the widest
sibling group at that depth); each step gathers every row's child in that slot from children tables
made on the host, tests it, and updates each row's residual and q with `torch.where` (a row whose
slot is padding, or that accepted a child or finished already, keeps its state). Nothing on the
device is read until the caller's one transfer of the decisions.

Randomness: a row of n nodes draws exactly n + 1 float32 uniforms from its own generator per
verification (verify.row_uniforms), the chain budget: u[i] tests node i, and u[n] draws the round's
last token by inverse CDF. A node is tested at most once (only when its parent is the current node
and its earlier siblings were rejected), so one uniform per node covers every path, and a row's
draws depend on nothing but the row: its tokens are the same decided alone or beside other rows.
"""
from __future__ import annotations

import torch

from .draft_tree import DraftTree, check_packable, packed_tokens, place_device_tokens
from .host_to_device import to_device
from .sampling import inverse_cdf


def _normalise(x: torch.Tensor) -> torch.Tensor:
    """Each row divided by its sum; a row without mass stays as it is (verify._normalise, per row)."""
    total = x.sum(-1, keepdim=True)
    return torch.where(total > 0, x / torch.where(total > 0, total, torch.ones_like(total)), x)


def _children(tree: DraftTree) -> list[list[int]]:
    """Per entry (0: the root, i + 1: node i) its children, in the tree's order (picked ones first)."""
    kids: list[list[int]] = [[] for _ in range(len(tree) + 1)]
    for i, parent in enumerate(tree.parents):
        kids[parent + 1].append(i)
    return kids


def tree_decisions(trees: list[DraftTree], p: torch.Tensor, uniforms: list[list[float]]) -> torch.Tensor:
    """[rows, depth + 1] on p's device: row b's accepted nodes root to leaf (padded with -1; depth is
    the deepest tree's), then its last token. p[b, 0] is row b's target distribution after its root,
    p[b, i + 1] after its node i (float32, padded); uniforms[b] from verify.row_uniforms."""
    rows, _, vocab = p.shape
    device = p.device
    check_packable(trees, vocab)
    kids = [_children(tree) for tree in trees]
    n = max(len(tree) for tree in trees)
    width = max(len(k) for row in kids for k in row)
    # per depth (that of the node whose children are tried), the widest sibling group, and whether
    # any row holds a picked or a sampled child in each slot: work no row needs is skipped
    depth_of = [[0] * (len(tree) + 1) for tree in trees]
    slots: list[list[tuple[bool, bool]]] = []
    for b, tree in enumerate(trees):
        for i, parent in enumerate(tree.parents):
            depth_of[b][i + 1] = depth_of[b][parent + 1] + 1
        for entry, children in enumerate(kids[b]):
            d = depth_of[b][entry]
            while len(slots) <= d:
                slots.append([])
            for s, c in enumerate(children):
                if len(slots[d]) <= s:
                    slots[d].append((False, False))
                picked, sampled = slots[d][s]
                slots[d][s] = (picked or tree.deterministic(c), sampled or not tree.deterministic(c))

    # q: every row's draft distributions stacked, after one all-zero row (what padding points at)
    q_rows, offsets, at_row = [p.new_zeros(1, vocab)], [], 1
    for tree in trees:
        offsets.append(at_row)
        if any(not tree.deterministic(i) for i in range(len(tree))):
            q_rows.append(tree.draft_probs.to(device, non_blocking=True))
            at_row += tree.draft_probs.shape[0]
    q_all = torch.cat(q_rows) if len(q_rows) > 1 else q_rows[0]

    # one host-to-device copy for every row: per entry its children (padding -1); per node its token,
    # whether it is picked, whether it is the first sampled child of its group (where the residual the
    # picked ones left is checked for round-off), whether it brings its own q (every sampled child
    # with replacement, the first one without: its later siblings read the q their rejections left),
    # that q's row in q_all; then the uniforms (padding 1.0: never accepts)
    packed = []
    for b, tree in enumerate(trees):
        size = len(tree)
        table = [c for k in kids[b] for c in k + [-1] * (width - len(k))] + [-1] * ((n - size) * width)
        first = [0.0] * size
        fresh = [0.0] * size
        for k in kids[b]:
            sampled = [c for c in k if not tree.deterministic(c)]
            for j, c in enumerate(sampled):
                first[c] = float(j == 0)
                fresh[c] = float(j == 0 or not tree.without_replacement)
        pad = [0.0] * (n - size)
        packed.append(table + packed_tokens(tree) + pad + [float(tree.deterministic(i)) for i in range(size)] + pad
                      + first + pad + fresh + pad
                      + [float(offsets[b] + tree.q_index[i]) if fresh[i] else 0.0 for i in range(size)] + pad
                      + uniforms[b][:size] + [1.0] * (n - size) + [uniforms[b][size]])
    on_device = to_device(packed, device, torch.float32)
    table_end = (n + 1) * width
    children = on_device[:, :table_end].long().view(rows, n + 1, width)
    token, picked, first, fresh, q_row, u = on_device[:, table_end: table_end + 6 * n].view(rows, 6, n).unbind(1)
    token, q_row = token.long(), q_row.long()
    place_device_tokens(token, trees)
    picked, first, fresh = picked > 0, first > 0, fresh > 0
    u_extra = on_device[:, -1]

    at = torch.arange(rows, device=device)
    cur = torch.zeros(rows, dtype=torch.long, device=device)  # each row's entry: 0 the root, i + 1 node i
    active = torch.ones(rows, dtype=torch.bool, device=device)  # not finished yet
    dist = p[:, 0]  # the distribution each row's last token is drawn from, once it finishes
    q = q_all[0].expand(rows, vocab)
    path = []
    for d, depth_slots in enumerate(slots):
        p_cur = p[at, cur]
        residual = p_cur
        walking = active.clone()  # still trying children at this depth
        chosen = torch.full_like(cur, -1)
        for s, (any_picked, any_sampled) in enumerate(depth_slots):
            child = children[at, cur, s]
            live = walking & (child >= 0)
            c = child.clamp(min=0)
            x = token[at, c][:, None]
            is_picked = picked[at, c]
            if any_sampled:
                # the candidates the picked ones left: only reachable through round-off if empty
                empty = (live & first[at, c])[:, None] & (residual.sum(-1, keepdim=True) <= 0)
                residual = torch.where(empty, p_cur, residual)
                q = torch.where((live & fresh[at, c])[:, None], q_all[q_row[at, c]], q)
            r_x = residual.gather(-1, x)[:, 0]
            if any_sampled:
                q_x = q.gather(-1, x)[:, 0]
                # u < p(x) / q(x) without dividing by zero; a picked child: u < residual(x)
                accept = torch.where(is_picked, u[at, c] < r_x, (q_x > 0) & (u[at, c] * q_x < r_x))
            else:
                accept = u[at, c] < r_x
            accept &= live
            reject = (live & ~accept)[:, None]
            if any_picked:  # a rejected picked child: zero it in the residual and renormalise
                dropped = torch.where((r_x > 0)[:, None], _normalise(residual.scatter(-1, x, 0.0)), residual)
                residual = torch.where(reject & is_picked[:, None], dropped, residual)
            if any_sampled:  # a rejected sampled child: residual <- norm(max(0, residual - q))
                residual = torch.where(reject & ~is_picked[:, None], _normalise(torch.clamp(residual - q, min=0)),
                                       residual)
                # without replacement the next sibling was drawn from q without x: q(x) <- 0, q <- norm(q)
                # (with replacement the next sibling brings its own q, so this q is never read again)
                q = torch.where(reject & ~is_picked[:, None], _normalise(q.scatter(-1, x, 0.0)), q)
            chosen = torch.where(accept, child, chosen)
            walking &= ~accept
        # rows still walking rejected every child (or stand at a leaf, where the residual is p)
        residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_cur)  # round-off when p == q
        dist = torch.where(walking[:, None], residual, dist)
        active &= ~walking
        path.append(chosen)
        cur = torch.where(active, chosen + 1, cur)
    # the last depth holds leaves only: every row has finished, and its chosen column is all -1
    return torch.stack(path[:-1] + [inverse_cdf(dist, u_extra)], -1)
