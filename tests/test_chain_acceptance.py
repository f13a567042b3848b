"""Sampled chains are decided on the device, every row of a verification at once (verify.accept_sampled):
the output keeps the target's distribution, a row's tokens do not depend on the rows beside it, and
the decisions of every row (greedy, chain, or tree that branches: test_tree_decision.py) reach the
host in one transfer.

The distribution checks reuse test_sampling_lossless's total-variation statistic and its bound (the
largest TV among simulated draws from the exact distribution itself)."""
from __future__ import annotations

import asyncio
import itertools
import math
import warnings
from collections import Counter

import pytest
import torch

from seed_tot import Engine, SamplingParams
from seed_tot.engine import seed as seed_module
from seed_tot.engine.draft_tree import DETERMINISTIC, DraftTree
from seed_tot.engine.policies.opt_tree import OptTreePolicy
from seed_tot.engine.verify import accept_sampled, accept_tokens, decide_on_device, row_uniforms
from test_sampling_lossless import (PROMPT, SAMPLES, SETTINGS, exact_distribution, pair,  # noqa: F401 (pair: a fixture)
                                    tv, tv_bound)

V = 3
POSITIONS = 5  # a first round drafts up to 4 tokens; later rounds draft what is left, down to none
TRIALS = 12_000
# the target's p at each position (whatever came before: a product law, enumerable), and a draft q far from it
P = torch.tensor([[0.6, 0.3, 0.1], [0.1, 0.2, 0.7], [0.34, 0.33, 0.33], [0.0, 0.5, 0.5], [0.8, 0.0, 0.2]])
Q = torch.tensor([[0.1, 0.2, 0.7], [0.7, 0.2, 0.1], [0.05, 0.05, 0.9], [0.5, 0.5, 0.0], [0.1, 0.8, 0.1]])


def _product_law(probs: torch.Tensor) -> dict[tuple[int, ...], float]:
    """The law of POSITIONS independent tokens, token i drawn from probs[i]."""
    return {s: math.prod(float(probs[i, t]) for i, t in enumerate(s))
            for s in itertools.product(range(V), repeat=POSITIONS)}


def _chain(tokens: list[int], positions: list[int], picked: bool) -> DraftTree:
    parents = [i - 1 for i in range(len(tokens))]
    if picked:  # chosen without randomness (prompt lookup): one-hot proposals, no q row at all
        return DraftTree(parents, tokens, torch.empty(0, V), q_index=[DETERMINISTIC] * len(tokens))
    return DraftTree(parents, tokens, Q[positions].reshape(len(tokens), V))


def _rounds_until_full(picked: bool) -> list[tuple[int, ...]]:
    """TRIALS sequences of POSITIONS tokens, every round of every trial decided in one accept_sampled call.
    Trial b drafts at most b % 5 tokens a round (0: plain decode steps), never past the last position,
    so one call holds chains of lengths 0..4 side by side."""
    gen = torch.Generator().manual_seed(0)
    out: list[list[int]] = [[] for _ in range(TRIALS)]
    while any(len(o) < POSITIONS for o in out):
        live = [b for b in range(TRIALS) if len(out[b]) < POSITIONS]
        trees, rows = [], []
        for b in live:
            at = len(out[b])
            n = min(b % 5, POSITIONS - 1 - at)
            positions = list(range(at, at + n))
            if picked:
                tokens = [(at + i) % V for i in range(n)]
            else:
                tokens = [int(torch.multinomial(Q[pos], 1, generator=gen)) for pos in positions]
            trees.append(_chain(tokens, positions, picked))
            rows.append(P[at: at + n + 1])
        width = max(len(r) for r in rows)
        probs = torch.stack([torch.cat([r, torch.full((width - len(r), V), 1 / V)]) for r in rows])
        for b, acc in zip(live, accept_sampled(trees, probs, [row_uniforms(t, gen) for t in trees])):
            out[b] += acc.tokens
    return [tuple(o) for o in out]


@pytest.mark.parametrize("picked", [False, True], ids=["sampled", "picked"])
def test_chains_of_every_length_in_one_batch_sample_the_target_distribution(picked):
    exact, draft_law = _product_law(P), _product_law(Q)
    bound = tv_bound(exact, TRIALS)
    assert tv(Counter({s: p * TRIALS for s, p in draft_law.items()}), exact, TRIALS) > bound, \
        "q too close to p for this test to detect a lossy verifier"
    samples = _rounds_until_full(picked)
    assert tv(Counter(samples), exact, TRIALS) < bound
    assert all(s[3] != 0 and s[4] != 1 for s in samples)  # tokens the target gives no mass never appear


def test_accepting_every_draft_token_is_caught_by_the_distribution_check():
    """The statistic has power here: a verifier that keeps q's draws would emit q's product law."""
    exact, draft_law = _product_law(P), _product_law(Q)
    assert 0.5 * sum(abs(draft_law[s] - exact[s]) for s in exact) > 3 * tv_bound(exact, TRIALS)


CHAINS = [[i - 1 for i in range(n)] for n in range(5)]


def random_rows(n_rows: int, vocab: int = 11, shapes: list[list[int]] = CHAINS, picked_every: int = 0):
    """Rows of `shapes` (parents lists) in turn, by default chains of lengths 0..4; their padded p,
    and a fresh generator per row. picked_every=k: the root's first child is picked in every k-th row.
    Every other row's siblings were drawn with replacement (which a chain does not read)."""
    g = torch.Generator().manual_seed(5)
    trees, probs = [], []
    for b in range(n_rows):
        parents = shapes[b % len(shapes)]
        n = len(parents)
        q = torch.rand(n, vocab, generator=g).softmax(-1)
        tokens = [int(torch.multinomial(q[i], 1, generator=g)) for i in range(n)]
        q_index = [DETERMINISTIC if i == 0 and picked_every and b % picked_every == 0 else i for i in range(n)]
        trees.append(DraftTree(parents, tokens, q, without_replacement=b % 2 == 0, q_index=q_index))
        probs.append((torch.rand(n + 1, vocab, generator=g) * 3).softmax(-1))
    width = max(len(p) for p in probs)
    padded = torch.stack([torch.cat([p, torch.full((width - len(p), vocab), 1 / vocab)]) for p in probs])
    return trees, padded, [torch.Generator().manual_seed(100 + b) for b in range(n_rows)]


def test_a_row_decides_the_same_alone_or_batched_with_other_rows():
    trees, probs, gens = random_rows(9)
    together = accept_sampled(trees, probs, [row_uniforms(t, g) for t, g in zip(trees, gens)])
    _, _, gens = random_rows(9)  # the same seeds again
    alone = [accept_sampled([t], probs[b: b + 1, : len(t) + 1], [row_uniforms(t, gens[b])])[0]
             for b, t in enumerate(trees)]
    assert together == alone
    assert {a.resampled for a in together} == {True, False}


def test_sampled_rows_get_the_same_tokens_alone_or_sharing_a_verification(pair):
    """ar (one row a step) and parallel (every row in one forward), sd and seed: same seed, same tokens."""
    target, draft = pair
    engine = Engine(target, draft)
    prompts = [[1, 4, 2], [3], [2, 2, 5, 1], [6, 0]]
    params = SamplingParams(max_new_tokens=10, temperature=0.9, top_k=6, seed=11)
    ar = engine.generate(prompts, params, mode="ar")
    parallel = engine.generate(prompts, params, mode="parallel")
    assert [r.token_ids for r in ar] == [r.token_ids for r in parallel]
    sd = engine.generate(prompts, params, mode="sd", k_config=(1, 1, 1))
    seeded = engine.generate(prompts, params, mode="seed", k_config=(1, 1, 1), draft_batch=None, verify_batch=None)
    assert [r.token_ids for r in sd] == [r.token_ids for r in seeded]


def test_rows_with_different_params_in_one_verification_each_follow_their_target(pair):
    """Concurrent calls with the temperature, top-k and top-p settings, chains and empty trees (a
    parallel call), verified together: each call's samples within the bound of its own target law."""
    target, draft = pair
    engine = Engine(target, draft)
    calls = [("temperature", "seed", {"k_config": (1, 1)}), ("top_k", "seed", {"k_config": (1,)}),
             ("top_p", "parallel", {})]

    async def run():
        return await asyncio.gather(*(engine.agenerate([PROMPT] * SAMPLES, SETTINGS[s], mode=mode, **k,
                                                       draft_batch=None, verify_batch=None)
                                      for s, mode, k in calls))
    for (setting, _, _), results in zip(calls, asyncio.run(run())):
        exact = exact_distribution(target, SETTINGS[setting])
        assert tv(Counter(tuple(r.token_ids) for r in results), exact, SAMPLES) < tv_bound(exact, SAMPLES), setting
    # the calls really shared verifications: some carried more rows than one call has
    assert max(e["batch"] for e in results[0].stats.events if e["type"] == "verify") > SAMPLES


_HOST_READS = {torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.__bool__, torch.Tensor.__int__,
               torch.Tensor.__float__, torch.Tensor.__index__, torch.Tensor.numpy, torch.Tensor.cpu}


def _on_device_marker(reads: list[int]) -> type:
    """A tensor subclass that every op on it propagates, counting each read of one into Python
    (tolist, item, bool, ...): on a CPU the only way to see what would be a device-to-host transfer
    on an accelerator."""
    class OnDevice(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            if func in _HOST_READS:
                reads[0] += 1
            return super().__torch_function__(func, types, args, kwargs or {})
    return OnDevice


def _count_host_reads(monkeypatch) -> list[int]:
    """Per verification (seed._verify_isolated's accept_rows call): how many times data computed from
    the target's logits or the drafts' q reached Python (those tensors marked by _on_device_marker)."""
    reads = [0]
    on_device = _on_device_marker(reads)
    real_score, real_accept = seed_module.score_rows, seed_module.accept_rows
    counts: list[int] = []

    def score(model, rows, *args):
        scored = real_score(model, rows, *args)
        for row in scored:
            row.logits = row.logits.as_subclass(on_device)
        for _, tree, _ in rows:
            tree.draft_probs = tree.draft_probs.as_subclass(on_device)
        return scored

    def accept(rows, scored, *args):
        before = reads[0]
        out = real_accept(rows, scored, *args)
        counts.append(reads[0] - before)
        return out

    monkeypatch.setattr(seed_module, "score_rows", score)
    monkeypatch.setattr(seed_module, "accept_rows", accept)
    return counts


def test_a_batched_verification_brings_its_decisions_to_the_host_once(pair, monkeypatch):
    """Sampled chains of several lengths, empty trees, sampled trees that branch (fixed k_configs and
    opt-tree's picked candidates) and greedy rows, in shared verifications: one read of device data
    per verification."""
    target, draft = pair
    engine = Engine(target, draft)
    counts = _count_host_reads(monkeypatch)

    async def run(calls):
        return await asyncio.gather(*(engine.agenerate([PROMPT, [5, 1]] * 3, params, mode=mode, **k,
                                                       draft_batch=None, verify_batch=None)
                                      for params, mode, k in calls))
    sampled = SamplingParams(max_new_tokens=6, temperature=0.8, top_k=5, seed=2)
    results = asyncio.run(run([(sampled, "seed", {"k_config": (1, 1, 1, 1)}),
                               (SETTINGS["top_p"], "seed", {"k_config": (1,)}), (sampled, "parallel", {}),
                               (SamplingParams(max_new_tokens=6, temperature=0), "seed", {"k_config": (1, 1)}),
                               (sampled, "seed", {"k_config": (2, 2)}), (SETTINGS["top_k"], "seed", {"k_config": (3, 1)}),
                               (sampled, "seed", {"draft_policy": OptTreePolicy(n=4, delta=0.0, max_depth=2)})]))
    assert counts and set(counts) == {1}
    assert max(e["batch"] for e in results[0][0].stats.events if e["type"] == "verify") > 6
    assert sum(r.stats.accepted for r in results[4]) > 0


def test_the_host_read_counter_sees_the_host_walk():
    """The counter works: the host walk (verify.accept_tokens) on marked tensors reads many times."""
    reads = [0]
    on_device = _on_device_marker(reads)
    q = torch.tensor([[0.1, 0.2, 0.3, 0.4]]).as_subclass(on_device)
    tree = DraftTree([-1, -1, 0], [3, 2, 1], q, q_index=[0, 0, 0])
    accept_tokens(tree, torch.full((4, 4), 0.25).as_subclass(on_device), False, torch.Generator().manual_seed(0))
    assert reads[0] > 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_deciding_greedy_rows_and_sampled_rows_synchronises_once():
    """What the CPU test infers, measured: torch's sync debug mode reports every synchronising call.
    Greedy rows, sampled chains and sampled trees that branch (sampled and picked children)."""
    trees, probs, gens = random_rows(9, vocab=1000)
    g = torch.Generator().manual_seed(9)
    trees += [DraftTree([-1, -1, 0, 1], [5, 6, 7, 8], torch.rand(4, 1000, generator=g).softmax(-1)),
              DraftTree([-1, -1, -1, 2], [1, 2, 3, 4], torch.rand(1, 1000, generator=g).softmax(-1),
                        q_index=[DETERMINISTIC, 0, 0, DETERMINISTIC])]
    probs = torch.cat([probs, torch.rand(2, probs.shape[1], 1000, generator=g).softmax(-1)])
    gens += [torch.Generator().manual_seed(200), torch.Generator().manual_seed(201)]
    for tree in trees:
        tree.draft_probs = tree.draft_probs.cuda()
    greedy = [(DraftTree([-1, 0], [1, 2], torch.rand(2, 1000).cuda()), torch.randn(3, 1000, device="cuda"))]
    probs = probs.cuda()
    uniforms = [row_uniforms(t, g) for t, g in zip(trees, gens)]
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            decided = decide_on_device(greedy, trees, probs, uniforms)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "called a synchronizing" in str(w.message)]
    assert len(syncs) == 1, [str(w.message) for w in syncs]
    assert len(decided) == 12
