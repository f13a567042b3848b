"""Fixed-shape forwards (graphed_forward.py): a forward run at a bucketed shape gives every real row the
logits and the cache entries of the exact-size forward, whatever padding rows, padding queries and
padding history the bucket adds; on CUDA its CUDA graph's replay equals the eager forward.

On the CPU the bucketed path runs eagerly, forced with `fixed_shapes=`; the exact-size packed forward
(`fixed_shapes=False`, the CPU default) is the reference. Rows are forks of prefilled prompts, so the
reference and the bucketed forward start from the same slots and neither sees the other's entries.
"""
from __future__ import annotations

import pytest
import torch

from conftest import tiny_model
from seed_tot.engine.graphed_forward import DEFAULT_BUCKETS, Buckets, Shape, bucket, graph_refusal
from seed_tot.engine.kv_cache import KVCache, forward_batch
from seed_tot.engine.kv_pool import SCRATCH
from seed_tot.engine.model_runtime import ModelRuntime
from test_attention_types import build

ARCHS = ["llama", "qwen2-sliding", "gemma2", "mistral-sliding", "gpt2"]
SMALL_STEPS = Buckets(history_step=8)  # tiny prompts still cross history buckets
# (tokens, parents) a row may add: trees of two and three branches, chains, one token
INPUTS = [([10, 11, 12, 13], [-1, 0, 0, 2]), ([20, 21, 22], [-1, 0, 1]), ([30], [-1]),
          ([40, 41, 42, 43, 44, 45], [-1, 0, 0, 1, 1, 2]), ([50, 51], [-1, 0])]


def runtime_of(arch: str, device: str = "cpu") -> ModelRuntime:
    model = tiny_model("llama", seed=3) if arch == "llama" else build(arch)
    return ModelRuntime(model.to(device))


def prefill(runtime, tokens: list[int]) -> KVCache:
    kv = KVCache()
    forward_batch(runtime, [kv], [tokens], [list(range(-1, len(tokens) - 1))], fixed_shapes=False)
    kv.commit(list(range(len(tokens))))
    return kv


def prompts(n_rows: int, base: int = 3) -> list[list[int]]:
    """Prompts of different lengths (base + 3r tokens), so the rows' histories differ."""
    return [[(7 * i + 11 * r) % 90 + 1 for i in range(base + 3 * r)] for r in range(n_rows)]


def row_inputs(n_rows: int, decode: bool) -> list[tuple[list[int], list[int]]]:
    return [([60 + r], [-1]) if decode else INPUTS[r % len(INPUTS)] for r in range(n_rows)]


def new_entries(runtime, kv: KVCache, n: int) -> list[torch.Tensor]:
    """Keys and values of the row's last n entries in every layer."""
    pool = runtime.pool
    slots = pool.slots_of(kv.cache.line)[-n:].to(pool.device)
    return [t for layer in sorted(pool.keys) for t in pool.read(layer, slots)]


def both(runtime, rows: list[KVCache], inputs, buckets, **kwargs):
    """The same step as the exact-size forward and at a fixed shape, each on its own forks of `rows`."""
    exact, fixed = [kv.fork() for kv in rows], [kv.fork() for kv in rows]
    tokens, parents = [t for t, _ in inputs], [p for _, p in inputs]
    want = forward_batch(runtime, exact, tokens, parents, fixed_shapes=False, **kwargs)
    got = forward_batch(runtime, fixed, tokens, parents, fixed_shapes=buckets, **kwargs)
    return exact, fixed, want, got


def assert_same_rows(runtime, exact, fixed, want, got, inputs, tol: float = 1e-5) -> None:
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, rtol=tol, atol=tol)
        assert torch.equal(g.argmax(-1), w.argmax(-1))  # greedy tokens
    for a, b, (tokens, _) in zip(exact, fixed, inputs):
        assert a.parents == b.parents
        for x, y in zip(new_entries(runtime, a, len(tokens)), new_entries(runtime, b, len(tokens))):
            torch.testing.assert_close(y, x, rtol=tol, atol=tol)


def test_buckets_round_rows_queries_and_history_up_to_few_shapes():
    b = DEFAULT_BUCKETS
    assert [b.shape([1] * n, 10).rows for n in range(1, 10)] == [1, 2, 4, 4, 8, 8, 8, 8, 16]
    assert [b.shape([1] * n, 10).rows for n in (17, 24, 25)] == [24, 24, 32]
    assert b.shape([1] * 3, 10) == Shape(rows=4, width=1, tokens=4, keys=256)  # a decode step: one query per row
    assert b.shape([4, 1, 3], 10) == Shape(rows=4, width=4, tokens=8, keys=256)
    assert [b.shape([1], k).keys for k in (1, 256, 257, 2048, 2049, 3000, 5000)] == \
        [256, 256, 512, 2048, 2560, 3072, 5120]  # multiples of 256, then of an eighth of the power of two
    assert b.shape([1] * 257, 10) is None and b.shape([65], 10) is None  # too large: eager
    assert b.shape([64] * 9, 10) is None  # 576 packed queries
    assert b.shape([64] + [1] * 64, 10) is None  # a [128 rows, 64 entries] layout for 128 queries


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("decode", [False, True], ids=["trees", "decode"])
def test_bucketed_logits_and_cache_equal_the_exact_size_forward_for_rows_1_to_9(arch, decode):
    runtime = runtime_of(arch)
    seen = set()
    for n_rows in range(1, 10):
        rows = [prefill(runtime, p) for p in prompts(n_rows)]
        inputs = row_inputs(n_rows, decode)
        assert_same_rows(runtime, *both(runtime, rows, inputs, SMALL_STEPS), inputs)
        n_keys = max(len(p) + len(t) for p, (t, _) in zip(prompts(n_rows), inputs))
        seen.add(SMALL_STEPS.shape([len(t) for t, _ in inputs], n_keys))
    assert len({s.rows for s in seen}) == 5 and len({s.keys for s in seen}) >= 3  # rows 1..16, several K
    assert set(runtime.graphed.statics) == seen


def test_histories_either_side_of_a_256_key_bucket_boundary_are_exact():
    runtime = runtime_of("llama")
    for lengths in ([250, 3], [254, 100], [255, 2], [256, 40], [300, 7]):  # K 256 and 512 (incl. new entries)
        rows = [prefill(runtime, [(5 * i + n) % 90 + 1 for i in range(n)]) for n in lengths]
        inputs = [INPUTS[0], INPUTS[2]]
        assert_same_rows(runtime, *both(runtime, rows, inputs, True), inputs)
    assert {s.keys for s in runtime.graphed.statics} == {256, 512}


@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_padding_rows_and_queries_never_touch_a_slot_of_a_real_row(arch):
    runtime = runtime_of(arch)
    pool = runtime.pool
    rows = [prefill(runtime, p) for p in prompts(5)]  # 5 rows: 3 padding rows in a bucket of 8
    inputs = row_inputs(5, decode=False)
    before = {layer: (pool.keys[layer].clone(), pool.values[layer].clone()) for layer in pool.keys}
    fixed = [kv.fork() for kv in rows]
    forward_batch(runtime, fixed, [t for t, _ in inputs], [p for _, p in inputs], fixed_shapes=SMALL_STEPS)
    written = torch.cat([pool.slots_of(kv.cache.line)[-len(t):] for kv, (t, _) in zip(fixed, inputs)])
    untouched = pool.refs > 0  # every slot a row holds (free slots hold whatever memory held)
    untouched[written] = False
    untouched[SCRATCH] = False  # where padding writes
    assert SCRATCH not in written.tolist() and untouched.sum() >= sum(map(len, prompts(5)))
    for layer, (keys, values) in before.items():
        assert torch.equal(pool.keys[layer][untouched], keys[untouched])
        assert torch.equal(pool.values[layer][untouched], values[untouched])


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_greedy_decoding_at_fixed_shapes_gives_the_exact_size_tokens(arch):
    """Several rows decode greedily for 8 steps, committing each step: rows cross history buckets
    and the row count changes as rows leave."""
    runtime = runtime_of(arch)
    runs = {}
    for fixed_shapes in (False, SMALL_STEPS):
        rows = [prefill(runtime, p) for p in prompts(6)]
        last = [[5 + r] for r in range(6)]
        out = [[] for _ in rows]
        for step in range(8):
            live = list(range(6 - step // 2))  # rows leave: 6, 6, 5, 5, 4, ... rows per step
            logits = forward_batch(runtime, [rows[i] for i in live], [last[i] for i in live],
                                   [[-1]] * len(live), fixed_shapes=fixed_shapes)
            for i, lg in zip(live, logits):
                rows[i].commit([0])
                last[i] = [int(lg[-1].argmax())]
                out[i].append(last[i][0])
        runs[fixed_shapes is False] = out
    assert runs[True] == runs[False]


def test_a_pool_growth_between_steps_stays_exact():
    runtime = runtime_of("llama")
    pool = runtime.pool
    rows = [prefill(runtime, p) for p in prompts(3)]
    inputs = row_inputs(3, decode=False)
    assert_same_rows(runtime, *both(runtime, rows, inputs, True), inputs)
    generation, capacity = pool.generation, pool.capacity
    pool.collect()  # the forks of the step above are gone: their slots are free again
    big = prefill(runtime, [(i % 80) + 1 for i in range(pool.n_free + 1)])  # more than is free: the pool grows
    assert pool.capacity > capacity and pool.generation > generation
    assert_same_rows(runtime, *both(runtime, rows + [big], inputs + [INPUTS[1]], True), inputs + [INPUTS[1]])


def test_a_second_step_of_a_bucket_reuses_its_buffers_and_keep_returns_the_last_logits():
    runtime = runtime_of("llama")
    row = prefill(runtime, prompts(1)[0])
    exact, fixed, want, got = both(runtime, [row], [INPUTS[3]], True, logits_to_keep=2)
    assert got[0].shape[0] == 2
    assert_same_rows(runtime, exact, fixed, want, got, [INPUTS[3]])
    statics = dict(runtime.graphed.statics)
    both(runtime, [row], [INPUTS[3]], True, logits_to_keep=2)
    assert runtime.graphed.statics == statics  # the same buffers, not new ones


def test_the_cpu_default_and_forwards_a_bucket_cannot_serve_take_the_exact_size_forward():
    runtime = runtime_of("llama")
    assert bucket(runtime, None, None, [1], 10) is None  # the CPU default: no padding arithmetic
    assert bucket(runtime, False, None, [1], 10) is None
    assert bucket(runtime, True, [torch.zeros(1, 64)], [1], 10) is None  # a drafter's target features
    assert bucket(runtime, True, None, [80], 180) is None  # a prefill wider than the widest bucket
    found, shape = bucket(runtime, True, None, [1, 2], 10)
    assert shape == Shape(2, 2, 4, 256)
    assert bucket(runtime, SMALL_STEPS, None, [1, 2], 10) == (found, Shape(2, 2, 4, 16))
    row = prefill(runtime, [1] * 100)
    statics = dict(found.statics)
    forward_batch(runtime, [row.fork()], [list(range(1, 80))], [list(range(-1, 78))], fixed_shapes=True)
    assert found.statics == statics
    assert graph_refusal(runtime.model) is None
    runtime.model.get_output_embeddings().register_forward_pre_hook(lambda *a: None)
    assert "hook" in graph_refusal(runtime.model)  # a replayed graph would skip it: CUDA runs such a model eagerly


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")


@CUDA
@pytest.mark.parametrize("arch", ["llama", "gemma2", "gpt2"])
def test_cuda_graph_replay_equals_eager_and_a_second_step_of_a_bucket_replays(arch):
    runtime = runtime_of(arch, "cuda")
    tol = 1e-4  # GPU kernels for different shapes sum in different orders
    for n_rows, decode in ((1, True), (3, True), (3, False), (5, False), (9, True)):
        rows = [prefill(runtime, p) for p in prompts(n_rows)]
        inputs = row_inputs(n_rows, decode)
        runner_ = runtime.graphed
        captures = runner_.captures if runner_ else 0
        for step in range(2):  # the default on CUDA: bucketed and graphed (fixed_shapes=None)
            assert_same_rows(runtime, *both(runtime, rows, inputs, None), inputs, tol)
        runner_ = runtime.graphed
        assert runner_.captures == captures + 1, "the second step of a bucket must replay, not capture"
    assert runner_.replays >= 10


@CUDA
def test_cuda_graphs_are_captured_again_after_the_pool_grows_and_stay_exact():
    runtime = runtime_of("llama", "cuda")
    pool = runtime.pool
    rows = [prefill(runtime, p) for p in prompts(3)]
    inputs = row_inputs(3, decode=False)
    assert_same_rows(runtime, *both(runtime, rows, inputs, None), inputs, 1e-4)
    captures = runtime.graphed.captures
    pool.collect()
    prefill(runtime, [(i % 80) + 1 for i in range(pool.n_free + 1)])  # the pool grows: new storage
    assert_same_rows(runtime, *both(runtime, rows, inputs, None), inputs, 1e-4)
    assert runtime.graphed.captures == captures + 1


@CUDA
def test_a_forward_that_syncs_the_host_cannot_be_captured_and_runs_eagerly_and_exactly():
    runtime = runtime_of("llama", "cuda")
    norm = runtime.model.model.norm
    original = norm.forward

    def syncing(hidden):  # a data-dependent host read, as a dynamic rotary embedding does
        hidden.sum().item()
        return original(hidden)

    norm.forward = syncing  # not a hook: nothing tells the runner before it tries to capture
    rows = [prefill(runtime, p) for p in prompts(3)]
    inputs = row_inputs(3, decode=False)
    assert_same_rows(runtime, *both(runtime, rows, inputs, None), inputs, 1e-4)
    assert "capturing" in runtime.graphed.refused and runtime.graphed.captures == 0
    assert_same_rows(runtime, *both(runtime, rows, inputs, None), inputs, 1e-4)  # and later steps too
