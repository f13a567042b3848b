"""The KV layout built for batches: every row of a model lives in its runtime's preallocated pool, a
batched forward writes in place and runs one attention call per layer for all rows, rows join and
leave without touching the others, forks share their prefix slots, freed slots are reused.

Every batched result is checked against the same rows forwarded one at a time (`KVCache.forward`).
"""
from __future__ import annotations

import gc

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import tiny_model
from seed_tot import Engine, SamplingParams
from seed_tot.engine import row_attention
from seed_tot.engine.kv_cache import KVCache, forward_batch
from seed_tot.engine.kv_pool import SCRATCH
from seed_tot.engine.model_runtime import ModelRuntime
from test_attention_types import build

TREE = ([10, 11, 12, 13], [-1, 0, 0, 2])  # two branches, one two deep
CHAIN = ([20, 21, 22], [-1, 0, 1])


def prefill(runtime: ModelRuntime, tokens: list[int]) -> KVCache:
    kv = KVCache()
    kv.forward(runtime, tokens, list(range(-1, len(tokens) - 1)))
    kv.commit(list(range(len(tokens))))
    return kv


def storage_pointers(runtime: ModelRuntime) -> list[int]:
    pool = runtime.pool
    return [pool.keys[i].data_ptr() for i in sorted(pool.keys)] + [pool.values[i].data_ptr() for i in sorted(pool.values)]


def snapshot(kv: KVCache) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The row's slots and its keys in every layer."""
    return kv.cache.pool.slots_of(kv.cache.line), [layer.keys.clone() for layer in kv.cache.layers]


def assert_untouched(kv: KVCache, before) -> None:
    slots, keys = snapshot(kv)
    assert torch.equal(slots, before[0])
    for old, new in zip(before[1], keys):
        assert torch.equal(old, new)


@pytest.fixture(scope="module")
def llama():
    return ModelRuntime(tiny_model("llama", seed=3))


# llama: plain; mistral-sliding: every layer slides (window 5); qwen2-sliding: mixed layers;
# gemma2: eager with soft-capping; gpt2: learned positions, MHA; falcon-mqa: the copying fallback
@pytest.mark.parametrize("arch", ["llama", "mistral-sliding", "qwen2-sliding", "gemma2", "gpt2", "falcon-mqa"])
def test_batched_rows_equal_single_rows_without_copying_history(arch):
    model = build(arch) if arch != "llama" else tiny_model("llama", seed=3)
    runtime = ModelRuntime(model)
    long_prompt, short_prompt = [(5 * i + 1) % 90 for i in range(13)], [7, 8]
    rows = [prefill(runtime, long_prompt), prefill(runtime, short_prompt)]
    rows.append(rows[0].fork())  # a copy of the long prompt: shares its prefix
    inputs = [TREE, CHAIN, ([30, 31], [-1, 0])]
    alone = [prefill(runtime, p).forward(runtime, t, par) for p, (t, par) in
             zip([long_prompt, short_prompt, long_prompt], inputs)]
    pointers = storage_pointers(runtime)
    batched = forward_batch(runtime, rows, [t for t, _ in inputs], [p for _, p in inputs])
    for got, want in zip(batched, alone):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    in_place = arch != "falcon-mqa"
    assert row_attention.serves(model) == in_place
    assert not model.config._attn_implementation.startswith("seed_tot+")  # the user's model is left as given
    assert storage_pointers(runtime) == pointers  # capacity sufficed: written in place, nothing regrown
    # the next step, after a commit, still matches one-row-at-a-time
    for kv in rows:
        kv.commit([0])
    reference = [prefill(runtime, p + [t[0]]) for p, (t, _) in zip([long_prompt, short_prompt, long_prompt], inputs)]
    step = forward_batch(runtime, rows, [[40, 41]] * 3, [[-1, -1]] * 3)
    for got, ref in zip(step, reference):
        torch.testing.assert_close(got, ref.forward(runtime, [40, 41], [-1, -1]), rtol=1e-5, atol=1e-5)



def test_the_copying_fallback_looks_for_no_shared_history(monkeypatch):
    """Rows forked from one long prompt share their first slots; the copied fallback gathers every row's
    history itself, so its forward does not pay for finding that shared stretch (a host read per forward)."""
    from seed_tot.engine import kv_pool
    model = build("falcon-mqa")
    runtime = ModelRuntime(model)
    prompt = [(3 * i + 1) % 90 for i in range(kv_pool.MIN_SHARED_READ + 8)]
    first = prefill(runtime, prompt)
    rows = [first, first.fork()]
    want = [prefill(runtime, prompt + [t]) for t in (30, 31)]

    def refuse(*args):
        raise AssertionError("the copying fallback looked for a shared history")
    monkeypatch.setattr(kv_pool, "_shared_history", refuse)
    got = forward_batch(runtime, rows, [[30, 40], [31, 41]], [[-1, 0], [-1, 0]])
    for row, (logits, ref) in enumerate(zip(got, want)):
        torch.testing.assert_close(logits[1], ref.forward(runtime, [40 + row], [-1])[0], rtol=1e-5, atol=1e-5)

def test_a_batched_forward_packs_rows_so_the_model_runs_only_real_entries(llama):
    """Rows of 4, 3 and 1 new entries run as one sequence of 8 queries, not 3 rows padded to 4 (EMS-SD):
    the linear layers and the LM head never see a padding entry between rows."""
    rows = [prefill(llama, [1, 2, 3, 4, 5]), prefill(llama, [6, 7]), prefill(llama, [8, 9, 10])]
    llama.set_padding({})  # no hardware padding either, whatever this machine's BLAS prefers
    seen = []
    embeddings = llama.model.get_input_embeddings()
    hook = embeddings.register_forward_hook(lambda module, args, out: seen.append(args[0].shape))
    try:
        logits = forward_batch(llama, rows, [TREE[0], CHAIN[0], [30]], [TREE[1], CHAIN[1], [-1]])
    finally:
        hook.remove()
        llama.set_padding(None)
    assert seen == [torch.Size([1, 8])]
    assert [lg.shape[0] for lg in logits] == [4, 3, 1]


class OpCounter(TorchDispatchMode):
    """Counts the tensor ops dispatched while `counting` is set (here: inside the first decoder layer)."""

    def __init__(self):
        super().__init__()
        self.counting, self.ops = False, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += self.counting
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("arch", ["llama", "qwen2-sliding", "gemma2"])
def test_a_decoder_layer_runs_the_same_ops_for_two_rows_and_for_eight(arch):
    """No loop over rows inside a layer: one write, one gather, one attention call whatever the batch."""
    model = build(arch) if arch != "llama" else tiny_model("llama", seed=3)
    runtime = ModelRuntime(model)
    layer = model.model.layers[0]
    counts = []
    for n_rows in (2, 8):
        rows = [prefill(runtime, [(3 * i + r) % 90 + 1 for i in range(5 + r)]) for r in range(n_rows)]
        counter = OpCounter()
        hooks = [layer.register_forward_pre_hook(lambda *a: setattr(counter, "counting", True)),
                 layer.register_forward_hook(lambda *a: setattr(counter, "counting", False))]
        try:
            with counter:
                forward_batch(runtime, rows, [TREE[0]] * n_rows, [TREE[1]] * n_rows)
        finally:
            for hook in hooks:
                hook.remove()
        counts.append(counter.ops)
    assert counts[0] == counts[1] and counts[0] > 0


def test_rows_join_and_leave_without_touching_the_others(llama):
    a, b, c = prefill(llama, [1, 2, 3, 4, 5]), prefill(llama, [6, 7]), prefill(llama, [8, 9, 10])
    forward_batch(llama, [a, b], [CHAIN[0], TREE[0]], [CHAIN[1], TREE[1]])
    before, length = snapshot(a), a.length
    forward_batch(llama, [b, c], [[50], [51, 52]], [[-1], [-1, 0]])  # a leaves, c joins
    assert a.length == length
    assert_untouched(a, before)
    logits = forward_batch(llama, [a, c], [[60], [61]], [[2], [1]])  # a rejoins: its tree tail continues
    fresh = prefill(llama, [1, 2, 3, 4, 5] + CHAIN[0])
    torch.testing.assert_close(logits[0], fresh.forward(llama, [60], [-1]), rtol=1e-5, atol=1e-5)


ROOTS = ([10, 11, 12], [-1, -1, 1])  # two first tokens: the second one's branch wins


@pytest.mark.parametrize("tree,keep", [(TREE, [0, 2, 3]), (TREE, [0, 1]), (TREE, [0]), (TREE, []), (ROOTS, [1, 2])])
def test_commit_compacts_to_what_a_fresh_prefill_of_the_accepted_tokens_gives(llama, tree, keep):
    prompt = [3, 1, 4, 1, 5]
    kv = prefill(llama, prompt)
    kv.forward(llama, *tree)
    kv.commit(keep)
    fresh = prefill(llama, prompt + [tree[0][i] for i in keep])
    assert kv.length == fresh.length and kv.parents == []
    for got, want in zip(kv.cache.layers, fresh.cache.layers):
        torch.testing.assert_close(got.keys, want.keys, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got.values, want.values, rtol=1e-5, atol=1e-5)


def test_forks_share_the_prefix_slots_and_never_write_them(llama):
    parent = prefill(llama, [9, 8, 7, 6])
    before = snapshot(parent)
    forks = [parent.fork() for _ in range(3)]
    pool = parent.cache.pool
    for fork in forks:
        assert torch.equal(pool.slots_of(fork.cache.line), before[0])  # the same slots: no copy
    assert bool((pool.refs[before[0]] == 4).all())  # held by the parent and three forks
    forward_batch(llama, forks, [TREE[0], CHAIN[0], [70]], [TREE[1], CHAIN[1], [-1]])
    forks[0].commit([0, 2, 3])
    forks[1].commit([0, 1, 2])
    forks[2].forward(llama, [71, 72], [0, 1])  # one forked row alone reads the shared prefix in place too
    assert_untouched(parent, before)
    parent.forward(llama, *TREE)  # the parent writes only past what it shared
    parent.commit([0, 1])
    assert torch.equal(pool.slots_of(parent.cache.line)[:4], before[0])
    fresh = prefill(llama, [9, 8, 7, 6] + [10, 12, 13])
    for got, want in zip(forks[0].cache.layers, fresh.cache.layers):
        torch.testing.assert_close(got.keys, want.keys, rtol=1e-5, atol=1e-5)


def test_a_rows_slots_are_freed_when_it_is_gone_and_shared_ones_when_the_last_holder_is(llama):
    parent = prefill(llama, [4, 5, 6, 7])
    pool = parent.cache.pool
    fork = parent.fork()
    fork.forward(llama, [8, 9], [-1, 0])
    prefix, own = pool.slots_of(parent.cache.line), pool.slots_of(fork.cache.line)[4:]
    n_free = pool.n_free
    del fork
    pool.collect()
    assert bool((pool.refs[own] == 0).all()) and bool((pool.refs[prefix] == 1).all())
    assert pool.n_free >= n_free + len(own) - 1
    del parent
    pool.collect()
    assert bool((pool.refs[prefix] == 0).all())


def _assert_pool_accounts_for_every_slot(pool) -> None:
    """Each slot is held (refs > 0) or on the free stack, once (the scratch slot is held for good)."""
    free = pool.free[:pool.n_free].tolist()
    held = set(torch.nonzero(pool.refs > 0).flatten().tolist())
    assert len(free) == len(set(free)), "a slot is on the free stack twice"
    assert not held & set(free), "a held slot is on the free stack"
    assert SCRATCH in held and len(held) + len(free) == pool.capacity


def test_dropped_tails_are_freed_together_at_the_next_pool_call_and_never_twice(llama):
    rows = [prefill(llama, [2, 3, 4, 5 + b]) for b in range(4)]
    pool = rows[0].cache.pool
    forward_batch(llama, rows, [CHAIN[0]] * 3 + [TREE[0]], [CHAIN[1]] * 3 + [TREE[1]])
    drafted = [pool.slots_of(kv.cache.line)[4:] for kv in rows]
    rows[0].commit([0])  # prefixes: only the lengths move, the tails wait for the next pool call
    rows[1].commit([0, 1, 2])
    rows[2].commit([])
    n_free = pool.n_free
    assert pool.n_free == n_free and bool((pool.refs[drafted[0][1:]] == 1).all())
    rows[3].commit([0, 2, 3])  # a reorder drains what waits first, then frees its own dropped entry
    assert bool((pool.refs[drafted[0][1:]] == 0).all()) and bool((pool.refs[drafted[2]] == 0).all())
    assert bool((pool.refs[drafted[1]] == 1).all()) and pool.n_free == n_free + 2 + 3 + 1
    _assert_pool_accounts_for_every_slot(pool)
    for kv, kept in zip(rows, ([20], [20, 21, 22], [], [10, 12, 13])):  # each row is its accepted tokens
        fresh = prefill(llama, [2, 3, 4, 5 + rows.index(kv)] + kept)
        for got, want in zip(kv.cache.layers, fresh.cache.layers):
            torch.testing.assert_close(got.keys, want.keys, rtol=1e-5, atol=1e-5)
    for _ in range(3):  # rounds of drafts dropped and slots reused keep the accounting exact
        forward_batch(llama, rows, [CHAIN[0]] * 4, [CHAIN[1]] * 4)
        for b, kv in enumerate(rows):
            kv.commit(list(range(b % 3)))
    pool.collect()
    _assert_pool_accounts_for_every_slot(pool)


def test_growth_beyond_capacity_is_counted_as_cache_management(llama):
    kv = prefill(llama, [1, 2])
    pool = kv.cache.pool
    capacity, spent = pool.capacity, pool.copy_s
    tokens = [(i % 80) + 1 for i in range(pool.n_free + 1)]
    kv.forward(llama, tokens, list(range(-1, len(tokens) - 1)))
    assert pool.capacity > capacity and pool.copy_s > spent
    kv.commit(list(range(len(tokens))))
    fresh = prefill(llama, [1, 2] + tokens)
    torch.testing.assert_close(kv.cache.layers[1].keys, fresh.cache.layers[1].keys, rtol=1e-5, atol=1e-5)


def test_a_finished_calls_rows_give_their_slots_back_without_the_garbage_collector():
    """No reference cycle keeps a row alive: with the cyclic collector off, memory stays one call's worth."""
    model = tiny_model("llama", seed=4)
    engine = Engine(model, None, vocab_size=96, prefix_cache_entries=0)
    gc.collect()
    gc.disable()
    try:
        for _ in range(4):
            engine.generate([[1, 2, 3, 4, 5]] * 3, SamplingParams(max_new_tokens=8), mode="parallel")
        pool = engine.target_runtime.pool
        pool.collect()
        in_use = pool.table.shape[0] - len(pool.free_lines)
    finally:
        gc.enable()
    assert in_use <= 3  # at most the last call's rows


def test_the_config_names_row_attention_only_while_a_batched_forward_runs():
    """The engine routes a model's attention through row attention by renaming its config's attention
    implementation; that rename must last only as long as a batched forward, not stay on the model."""
    model = tiny_model("llama", seed=3)
    runtime = ModelRuntime(model)
    original = model.config._attn_implementation
    seen = []
    handle = model.model.layers[0].register_forward_pre_hook(
        lambda module, args: seen.append(model.config._attn_implementation))
    rows = [prefill(runtime, [5, 6, 7]), prefill(runtime, [8, 9])]
    seen.clear()
    forward_batch(runtime, rows, [[1], [2]], [[-1], [-1]])
    handle.remove()
    assert seen == ["seed_tot+" + original]
    assert model.config._attn_implementation == original
