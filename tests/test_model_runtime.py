"""What an engine keeps about a model lives in the engine's `ModelRuntime`s (model_runtime.py), never on
the model: two engines over one model object each have their own pool, padding and hooks, and only the
model's config, which they share, counts the row-attention naming for both of them."""
from __future__ import annotations

import gc

import pytest
import torch

from conftest import noisy_copy, reference_greedy, tiny_model
from seed_tot import Engine, SamplingParams
from seed_tot.engine import row_attention
from seed_tot.engine.hidden_capture import HiddenCapture
from seed_tot.engine.kv_cache import KVCache, forward_batch
from seed_tot.engine.model_runtime import ModelRuntime
from seed_tot.engine.speculative import prefill

GREEDY = SamplingParams(max_new_tokens=10, temperature=0)
PROMPTS = [[5, 6, 7, 8], [9, 1], [5, 6, 7, 8]]


def test_an_engine_sets_nothing_on_its_models():
    target = tiny_model("llama", seed=3)
    draft = noisy_copy(target, 0.01)
    before = [(dict(vars(m)), m.config.to_dict()) for m in (target, draft)]
    Engine(target, draft).generate(PROMPTS, GREEDY, mode="seed", k_config=(2, 2))
    assert [(dict(vars(m)), m.config.to_dict()) for m in (target, draft)] == before


def test_two_engines_over_one_model_each_keep_their_own_state():
    target = tiny_model("llama", seed=3)
    draft = noisy_copy(target, 0.01)
    one, two = Engine(target, draft), Engine(target, draft)
    assert one.target_runtime.pool is not two.target_runtime.pool
    one.target_runtime.set_padding({1: 2})
    assert two.target_runtime.padded_rows(1) == 1
    for engine in (one, two):
        results = engine.generate(PROMPTS, GREEDY, mode="seed", k_config=(1, 1))
        assert [r.token_ids for r in results] == [reference_greedy(target, p, 10) for p in PROMPTS]
    # a row lives in the pool of the runtime that scored it: another runtime refuses it
    kv = KVCache()
    prefill(one.target_runtime, kv, [1, 2, 3])
    with pytest.raises(RuntimeError, match="entries live in another pool"):
        kv.forward(two.target_runtime, [4], [-1])


def test_one_engines_release_leaves_row_attention_named_while_another_engine_forwards_the_model():
    """The naming is counted per config, not per runtime: an engine that lets go of it (its last call
    ended, on its own thread) while another engine's batched forward of the same model is halfway
    through its layers must leave it named for the rest of that forward."""
    model = tiny_model("llama", seed=3)
    original = model.config._attn_implementation
    first, second = ModelRuntime(model), ModelRuntime(model)
    rows = [KVCache(), KVCache()]
    for kv, prompt in zip(rows, ([5, 6, 7], [8, 9])):
        prefill(second, kv, prompt)
    reference = [kv.fork() for kv in rows]
    want = forward_batch(second, reference, [[1], [2]], [[-1], [-1]])

    row_attention.hold(first.config)  # the first engine has calls
    seen = []
    layers = model.model.layers
    hooks = [layers[0].register_forward_pre_hook(lambda *a: row_attention.release(first.config)),
             layers[-1].register_forward_pre_hook(lambda *a: seen.append(model.config._attn_implementation))]
    try:
        got = forward_batch(second, rows, [[1], [2]], [[-1], [-1]])
    finally:
        for hook in hooks:
            hook.remove()
    assert seen == ["seed_tot+" + original]
    assert model.config._attn_implementation == original
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_a_runtimes_capture_hook_goes_with_the_runtime():
    model = tiny_model("llama", seed=3)
    head = model.get_output_embeddings()
    runtime = ModelRuntime(model)
    assert runtime.capture(HiddenCapture) is runtime.capture(HiddenCapture)  # one hook per kind
    assert len(head._forward_pre_hooks) == 1 and runtime.capturing
    del runtime
    gc.collect()
    assert len(head._forward_pre_hooks) == 0
