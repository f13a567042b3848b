"""attention="pool" (model_runtime.py): batched forwards read the KV pool in place with FlexAttention and
one block mask per forward over the pool's slots (masks.pool_block_masks), never gathering a row's history.

Proved here on the CPU, where FlexAttention runs eagerly: every mode's greedy output equals the target
alone on every attention type test_attention_types covers (sliding windows all or mixed, soft-capping,
GQA/MQA, absolute positions), the fixed-shape path (graphed_forward.py) equals the exact-size one, a
seed path's samples follow the target's law, forks of one prompt are read from the pool's own storage
through common tiles, and what the pool path cannot serve runs the gather path, said once.
"""
from __future__ import annotations

import logging

import pytest
import torch
from torch.nn.attention.flex_attention import flex_attention

import test_attention_types_sampled as sampled
from conftest import noisy_copy, reference_greedy
from seed_tot.engine import Engine, SamplingParams
from seed_tot.engine import model_runtime
from seed_tot.engine.compiled_forward import CompileSettings
from seed_tot.engine.kv_cache import KVCache, forward_batch
from seed_tot.engine.masks import POOL_BLOCK
from seed_tot.engine.model_runtime import ModelRuntime
from test_attention_types import ARCHS, NEW, PROMPTS, VOCAB, build
from test_fixed_shapes import SMALL_STEPS, assert_same_rows, both, prefill, prompts, row_inputs

# mode, k_config, verify_batch: one row per forward (ar), rows of one prompt (parallel), and seed's
# draft trees verified one row and three rows per forward
SETTINGS = [("ar", (1,), 1), ("parallel", (1,), 1), ("mcsd", (2, 2, 1), 1), ("seed", (2, 2, 1), 1),
            ("seed", (2, 1, 1), 3)]
GATHER_ONLY = {"falcon-mqa"}  # its modeling code calls sdpa itself: no pool path, the copying one


class CountingFlex:
    """FlexAttention, counting its calls and remembering the last call's inputs."""

    def __init__(self):
        self.calls = 0
        self.last = None

    def __call__(self, query, key, value, **kwargs):
        self.calls += 1
        self.last = (key, value, kwargs["block_mask"])
        return flex_attention(query, key, value, **kwargs)


@pytest.fixture(scope="module", params=list(ARCHS))
def pool_engine(request):
    target = build(request.param)
    draft = noisy_copy(target, 0.003)  # agrees often, not always: trees really branch
    refs = [reference_greedy(target, p, NEW) for p in PROMPTS]
    return request.param, Engine(target, draft, vocab_size=VOCAB, attention="pool"), refs, CountingFlex()


@pytest.mark.parametrize("mode,k_config,verify_batch", SETTINGS, ids=lambda v: str(v))
def test_greedy_output_with_pool_attention_equals_the_target_alone_on_every_attention_type(
        pool_engine, mode, k_config, verify_batch, monkeypatch):
    arch, engine, refs, flex = pool_engine
    # the engine's runtimes take FlexAttention from model_runtime at their first forward (the first
    # test of an arch) and keep it: the counter is what they keep
    monkeypatch.setattr(model_runtime, "flex_attention", flex)
    calls = flex.calls
    results = engine.generate(PROMPTS, SamplingParams(max_new_tokens=NEW, temperature=0), mode=mode,
                              k_config=k_config, verify_batch=verify_batch)
    for prompt, ref, result in zip(PROMPTS, refs, results):
        assert result.token_ids == ref, f"{arch} {mode} {k_config} vb{verify_batch}, prompt of {len(prompt)}"
    if arch in GATHER_ONLY:
        assert flex.calls == 0 and engine.target_runtime.flex is None
    else:  # the pool path really ran: one call per layer of every forward
        assert flex.calls > calls and engine.target_runtime.flex is flex


@pytest.mark.parametrize("arch", ["llama", "qwen2-sliding", "gemma2", "gpt2"])
@pytest.mark.parametrize("decode", [False, True], ids=["trees", "decode"])
def test_pool_attention_at_fixed_shapes_equals_the_exact_size_forward_and_the_gather_path(arch, decode):
    """graphed_forward.py's static path (padding rows, queries and history) with block masks built
    from its buffers gives the exact-size pool forward's logits and cache entries, and both equal the
    gather path's logits."""
    model = build(arch)
    pool, gather = ModelRuntime(model, "pool"), ModelRuntime(model, "gather")
    for n_rows in (1, 3, 5):
        inputs = row_inputs(n_rows, decode)
        rows = [prefill(pool, p) for p in prompts(n_rows)]
        exact, fixed, want, got = both(pool, rows, inputs, SMALL_STEPS)
        assert_same_rows(pool, exact, fixed, want, got, inputs)
        reference = [prefill(gather, p) for p in prompts(n_rows)]
        gathered = forward_batch(gather, reference, [t for t, _ in inputs], [p for _, p in inputs], fixed_shapes=False)
        for w, g in zip(gathered, want):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    assert pool.graphed.attend is pool.flex is flex_attention  # the fixed shapes ran the pool path too


def test_a_runtimes_first_forward_may_be_at_a_fixed_shape():
    """The fixed-shape runner is made on the first forward that fits a bucket (a short prefill on
    CUDA) and asks the runtime for its FlexAttention function then: it gets it, and the logits are
    the gather path's."""
    model = build("llama")
    pool, gather = ModelRuntime(model, "pool"), ModelRuntime(model, "gather")
    prompt = prompts(1)[0]
    chain = [list(range(-1, len(prompt) - 1))]
    got = forward_batch(pool, [KVCache()], [prompt], chain, fixed_shapes=SMALL_STEPS)
    want = forward_batch(gather, [KVCache()], [prompt], chain, fixed_shapes=False)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    assert pool.graphed.attend is flex_attention


def test_compiled_flex_attention_is_asked_for_in_vain_off_cuda_said_once(caplog):
    """Compiled FlexAttention runs on CUDA only (on the CPU torch 2.13's inductor template aborted the
    process with a heap assertion): a CPU runtime asked for it runs the eager kernel, says so once, and
    a compiled forward that would hold the kernel runs uncompiled, said once too; both stay exact."""
    model = build("gemma2")  # soft-capping, a sliding layer and a full one
    pool = ModelRuntime(model, "pool", compile_attention=True, compile=CompileSettings(enabled=True))
    gather = ModelRuntime(model, "gather")
    with caplog.at_level(logging.WARNING):
        assert pool.flex is flex_attention and pool.flex is flex_attention  # eager, asked twice
        assert pool.graph_runner().compiled is None
        for n_rows, decode, fixed in ((3, True, False), (5, True, True)):
            inputs = row_inputs(n_rows, decode)
            tokens, parents = [t for t, _ in inputs], [p for _, p in inputs]
            got = forward_batch(pool, [prefill(pool, p) for p in prompts(n_rows)], tokens, parents, fixed_shapes=fixed)
            want = forward_batch(gather, [prefill(gather, p) for p in prompts(n_rows)], tokens, parents,
                                 fixed_shapes=False)
            for w, g in zip(want, got):
                torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    said = [r.getMessage() for r in caplog.records if "CUDA only" in r.getMessage()]
    assert len([m for m in said if "FlexAttention runs eagerly" in m]) == 1
    assert len([m for m in said if "run uncompiled" in m]) == 1


def test_sampled_output_of_batched_seed_with_pool_attention_follows_the_target_distribution(monkeypatch):
    """Batched seed with a tree over Qwen2 with one sliding and one full layer: batched draft and
    verification forwards read the pool in place; the TV test of test_sampling_lossless."""
    target = build("qwen2-sliding", vocab_size=sampled.lossless.VOCAB)
    sampled.assert_samples_follow_the_target(target, monkeypatch, "top_p", "seed", (2, 2), None, attention="pool")


def test_forked_rows_read_their_shared_prompt_from_the_pool_storage_through_common_tiles(monkeypatch):
    """Four forks of one prompt (its slots held in common, nothing copied) take a step of one token
    each: the kernel gets the pool's storage tensor itself, nobody gathers from the pool, and the
    block mask lists the prompt's pool tiles once for the one query tile every row's query is in,
    every query seeing every prompt slot and no other row's new entry."""
    flex = CountingFlex()
    monkeypatch.setattr(model_runtime, "flex_attention", flex)  # what ModelRuntime.flex hands the forwards
    runtime = ModelRuntime(build("llama"), "pool")
    prompt = [(5 * i + 2) % 90 + 1 for i in range(3 * POOL_BLOCK)]  # three pool tiles and more
    root = prefill(runtime, prompt)
    rows = [root.fork() for _ in range(4)]
    pool = runtime.pool
    prompt_slots = pool.slots_of(root.cache.line)

    def no_gather(*args, **kwargs):
        raise AssertionError("attention=pool gathered a row's history")

    monkeypatch.setattr(pool, "read", no_gather)
    forward_batch(runtime, rows, [[7], [8], [9], [10]], [[-1]] * 4, fixed_shapes=False)
    keys, values, block_mask = flex.last
    last_layer = max(pool.keys)
    assert keys.data_ptr() == pool.keys[last_layer].data_ptr()  # the storage itself, not a copy
    assert values.data_ptr() == pool.values[last_layer].data_ptr()
    assert keys.shape[2] == pool.capacity
    # one query tile holds the four queries; the prompt's tiles are listed for it, each once
    tiles = set((prompt_slots // POOL_BLOCK).tolist())
    listed = [int(i) for n, idx in ((block_mask.kv_num_blocks, block_mask.kv_indices),
                                    (block_mask.full_kv_num_blocks, block_mask.full_kv_indices))
              if n is not None for i in idx[0, 0, 0, :int(n[0, 0, 0])]]
    assert block_mask.kv_num_blocks.shape[-1] == 1 and tiles <= set(listed) and len(listed) == len(set(listed))
    own = torch.stack([pool.slots_of(kv.cache.line)[-1] for kv in rows])  # each row's new slot
    query = torch.arange(4)[:, None]
    seen = block_mask.mask_mod(0, 0, query, prompt_slots[None])
    assert bool(seen.all())  # every fork's query sees the whole shared prompt
    across = block_mask.mask_mod(0, 0, query, own[None])  # [4 queries, 4 rows' new slots]
    assert torch.equal(across, torch.eye(4, dtype=torch.bool))  # its own new entry, no other row's


def test_a_model_the_pool_path_cannot_serve_runs_the_gather_path_said_once(caplog):
    model = build("falcon-mqa")  # calls sdpa itself: attention never reaches the pool
    runtime = ModelRuntime(model, "pool")
    with caplog.at_level(logging.WARNING, logger=model_runtime.__name__):
        assert runtime.flex is None and runtime.flex is None
    assert [r.message for r in caplog.records].count(caplog.records[0].message) == 1
    assert "attention=pool cannot serve it exactly" in caplog.text
    with pytest.raises(ValueError, match="attention='paged': expected one of gather, pool"):
        ModelRuntime(model, "paged")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_cuda_graph_replay_with_pool_attention_equals_the_exact_size_forward(arch):
    """On CUDA (compiled FlexAttention): each bucket's graph, block masks built inside it, replays the
    exact-size forward's logits and cache entries, a second step of a bucket included."""
    runtime = ModelRuntime(build(arch).to("cuda"), "pool")
    for n_rows, decode in ((1, True), (3, False), (9, True)):
        rows = [prefill(runtime, p) for p in prompts(n_rows)]
        inputs = row_inputs(n_rows, decode)
        for _ in range(2):
            assert_same_rows(runtime, *both(runtime, rows, inputs, None), inputs, 1e-4)
    assert runtime.graphed.replays >= 3 and runtime.graphed.attend is runtime.flex
