"""PipeDec's dynamic prediction tree against naive references."""
from __future__ import annotations

import torch

from seed_tot.engine.masks import FULL, AttentionLayout
from seed_tot.engine.pipeline.stages import tree_mask
from seed_tot.engine.pipeline.tree import PredictionTree, expand_layer


def _naive_expand(path_logp, child_logp, c, w):
    """Every (parent, token) pair among each parent's top-c, best w by path log-probability."""
    cands = []
    for i in range(len(path_logp)):
        ranked = sorted(range(child_logp.shape[1]), key=lambda t: -float(child_logp[i, t]))[:c]
        cands += [(float(path_logp[i] + child_logp[i, t]), i, t) for t in ranked]
    best = sorted(cands, key=lambda x: -x[0])[:w]
    return sorted((i, t) for _, i, t in best)


def test_layer_update_matches_naive_top_c_best_w():
    gen = torch.Generator().manual_seed(0)
    for n, vocab, c, w in [(1, 10, 3, 2), (3, 12, 2, 4), (4, 9, 3, 20), (5, 30, 1, 3)]:
        path = torch.randn(n, generator=gen, dtype=torch.float64)
        child = torch.log_softmax(torch.randn(n, vocab, generator=gen, dtype=torch.float64), -1)
        parents, tokens, scores = expand_layer(path, child, c, w)
        assert sorted(zip(parents, tokens)) == _naive_expand(path, child, c, w)
        assert len(tokens) <= w
        assert all(parents.count(p) <= c for p in set(parents))
        assert parents == sorted(parents)  # breadth-first: siblings together, in parent order
        for p, t, s in zip(parents, tokens, scores.tolist()):
            assert abs(s - float(path[p] + child[p, t])) < 1e-12


def _grow(tree, widths, gen):
    for w in widths:
        deepest = tree.layers[-1]
        logp = torch.log_softmax(torch.randn(len(deepest), 8, generator=gen, dtype=torch.float64), -1)
        rows, tokens, scores = expand_layer(torch.tensor([tree.nodes[n].logp for n in deepest]), logp, 2, w)
        tree.add_layer([deepest[r] for r in rows], tokens, scores.tolist())


def _ancestors(tree, node):
    out = []
    while node in tree.nodes:  # the new root's pruned parent is no longer in the tree
        out.append(node)
        node = tree.nodes[node].parent
    return out


def test_hit_keeps_exactly_the_hit_childs_subtree():
    gen = torch.Generator().manual_seed(1)
    tree = PredictionTree(3)
    _grow(tree, [3, 4, 4], gen)
    before = {n: (node.token, node.parent) for n, node in tree.nodes.items()}
    child = tree.layers[1][1]
    parent_of = {n: p for n, (_, p) in before.items()}

    def descends(n):
        while n != -1:
            if n == child:
                return True
            n = parent_of[n]
        return False

    assert tree.advance(before[child][0]) is True
    assert tree.root == child
    assert set(tree.ids()) == {n for n in before if descends(n)}
    for depth, layer in enumerate(tree.layers):  # layers are still breadth-first depths below the new root
        for n in layer:
            assert len(_ancestors(tree, n)) - 1 == depth


def test_miss_restarts_from_the_new_token():
    gen = torch.Generator().manual_seed(2)
    tree = PredictionTree(3)
    _grow(tree, [3, 3], gen)
    taken = {tree.nodes[n].token for n in tree.layers[1]}
    token = next(t for t in range(8) if t not in taken)
    old_ids = set(tree.ids())
    assert tree.advance(token) is False
    assert tree.layers == [[tree.root]] and tree.nodes[tree.root].token == token
    assert tree.root not in old_ids  # ids are never reused, so stale activations can't be mistaken for it


def test_tree_mask_rows_are_the_ancestor_relation():
    parents = [-1, 0, 0, 1, 2, 1, 3]  # entries in breadth-first order
    committed, n_old = 4, 2
    layout = AttentionLayout("llama", {FULL: None}, False, False, None)
    positions, mask = tree_mask(layout, committed, parents, n_old, torch.float32, torch.device("cpu"))
    allowed = mask[0, 0] == 0
    for row, entry in enumerate(range(n_old, len(parents))):
        anc = set()
        e = entry
        while e >= 0:
            anc.add(e)
            e = parents[e]
        expect = [True] * committed + [j in anc for j in range(len(parents))]
        assert allowed[row].tolist() == expect
        assert int(positions[0, row]) == committed + len(anc) - 1
