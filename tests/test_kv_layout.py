"""The KV layout built for batches (issue 10): rows grow in place, a batched forward reads every row's
storage where it lies, rows join and leave without touching the others, forks share their prefix.

Every batched result is checked against the same rows forwarded one at a time (`KVCache.forward`).
"""
from __future__ import annotations

import pytest
import torch

from conftest import tiny_model
from seed_tot.engine.kv_cache import KVCache, forward_batch
from seed_tot.engine.query_padding import set_padding
from test_attention_types import build

TREE = ([10, 11, 12, 13], [-1, 0, 0, 2])  # two branches, one two deep
CHAIN = ([20, 21, 22], [-1, 0, 1])


def prefill(model, tokens: list[int]) -> KVCache:
    kv = KVCache()
    kv.forward(model, tokens, list(range(-1, len(tokens) - 1)))
    kv.commit(list(range(len(tokens))))
    return kv


def own_pointers(kv: KVCache) -> list[int]:
    return [layer.own_keys.data_ptr() for layer in kv.cache.layers] + \
        [layer.own_values.data_ptr() for layer in kv.cache.layers]


def own_snapshot(kv: KVCache) -> list[torch.Tensor]:
    return [layer.own_keys[:, :, :layer.n_own].clone() for layer in kv.cache.layers]


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama", seed=3)


# llama: plain; mistral-sliding: every layer slides (window 5); qwen2-sliding: mixed layers;
# gemma2: eager with soft-capping; gpt2: learned positions, MHA; falcon-mqa: the copying fallback
@pytest.mark.parametrize("arch", ["llama", "mistral-sliding", "qwen2-sliding", "gemma2", "gpt2", "falcon-mqa"])
def test_batched_rows_equal_single_rows_without_copying_history(arch):
    model = build(arch) if arch != "llama" else tiny_model("llama", seed=3)
    long_prompt, short_prompt = [(5 * i + 1) % 90 for i in range(13)], [7, 8]
    rows = [prefill(model, long_prompt), prefill(model, short_prompt)]
    rows.append(rows[0].fork())  # a copy of the long prompt: shares its prefix
    inputs = [TREE, CHAIN, ([30, 31], [-1, 0])]
    alone = [prefill(model, p).forward(model, t, par) for p, (t, par) in
             zip([long_prompt, short_prompt, long_prompt], inputs)]
    owned = [r for r in rows if r.cache.layers[0].own_keys is not None]
    pointers = [own_pointers(r) for r in owned]
    batched = forward_batch(model, rows, [t for t, _ in inputs], [p for _, p in inputs])
    for got, want in zip(batched, alone):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    in_place = arch != "falcon-mqa"
    assert model.config._attn_implementation.startswith("seed_tot+") == in_place
    if in_place:  # capacity sufficed: every row's storage is the one it had, nothing was gathered
        assert [own_pointers(r) for r in owned] == pointers
    # the next step, after a commit, still matches one-row-at-a-time
    for kv in rows:
        kv.commit([0])
    reference = [prefill(model, p + [t[0]]) for p, (t, _) in zip([long_prompt, short_prompt, long_prompt], inputs)]
    step = forward_batch(model, rows, [[40, 41]] * 3, [[-1, -1]] * 3)
    for got, ref in zip(step, reference):
        torch.testing.assert_close(got, ref.forward(model, [40, 41], [-1, -1]), rtol=1e-5, atol=1e-5)


def test_a_batched_forward_packs_rows_so_the_model_runs_only_real_entries(llama):
    """Rows of 4, 3 and 1 new entries run as one sequence of 8 queries, not 3 rows padded to 4 (EMS-SD):
    the linear layers and the LM head never see a padding entry between rows."""
    rows = [prefill(llama, [1, 2, 3, 4, 5]), prefill(llama, [6, 7]), prefill(llama, [8, 9, 10])]
    set_padding(llama, {})  # no hardware padding either, whatever this machine's BLAS prefers
    seen = []
    hook = llama.get_input_embeddings().register_forward_hook(lambda module, args, out: seen.append(args[0].shape))
    try:
        logits = forward_batch(llama, rows, [TREE[0], CHAIN[0], [30]], [TREE[1], CHAIN[1], [-1]])
    finally:
        hook.remove()
        llama.__dict__.pop("_seed_tot_row_padding")
    assert seen == [torch.Size([1, 8])]
    assert [lg.shape[0] for lg in logits] == [4, 3, 1]


def test_rows_join_and_leave_without_touching_the_others(llama):
    a, b, c = prefill(llama, [1, 2, 3, 4, 5]), prefill(llama, [6, 7]), prefill(llama, [8, 9, 10])
    forward_batch(llama, [a, b], [CHAIN[0], TREE[0]], [CHAIN[1], TREE[1]])
    pointers, before, length = own_pointers(a), own_snapshot(a), a.length
    forward_batch(llama, [b, c], [[50], [51, 52]], [[-1], [-1, 0]])  # a leaves, c joins
    assert own_pointers(a) == pointers and a.length == length
    for old, layer in zip(before, a.cache.layers):
        assert torch.equal(old, layer.own_keys[:, :, :layer.n_own])
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


def test_forks_share_the_prefix_storage_and_never_write_it(llama):
    parent = prefill(llama, [9, 8, 7, 6])
    before = own_snapshot(parent)
    forks = [parent.fork() for _ in range(3)]
    for fork in forks:
        for shared, mine in zip(fork.cache.layers, parent.cache.layers):
            assert shared.shared[0][0].data_ptr() == mine.own_keys.data_ptr()  # the same storage, no copy
    forward_batch(llama, forks, [TREE[0], CHAIN[0], [70]], [TREE[1], CHAIN[1], [-1]])
    forks[0].commit([0, 2, 3])
    forks[1].commit([0, 1, 2])
    forks[2].forward(llama, [71, 72], [0, 1])  # one forked row alone reads the shared prefix in place too
    parent.forward(llama, *TREE)  # the parent writes only past what it shared
    parent.commit([0, 1])
    for old, layer in zip(before, parent.cache.layers):
        assert torch.equal(old, layer.own_keys[:, :, :old.shape[-2]])
    fresh = prefill(llama, [9, 8, 7, 6] + [10, 12, 13])
    for got, want in zip(forks[0].cache.layers, fresh.cache.layers):
        torch.testing.assert_close(got.keys, want.keys, rtol=1e-5, atol=1e-5)


def test_growth_beyond_capacity_is_counted_as_cache_management(llama):
    kv = prefill(llama, [1, 2])
    capacity = kv.cache.layers[0].own_keys.shape[-2]
    spent = kv.copy_s
    tokens = [(i % 80) + 1 for i in range(capacity)]
    kv.forward(llama, tokens, list(range(-1, len(tokens) - 1)))
    assert kv.cache.layers[0].own_keys.shape[-2] > capacity and kv.copy_s > spent
    kv.commit(list(range(len(tokens))))
    fresh = prefill(llama, [1, 2] + tokens)
    torch.testing.assert_close(kv.cache.layers[1].keys, fresh.cache.layers[1].keys, rtol=1e-5, atol=1e-5)
