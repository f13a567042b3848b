"""PipeDec stages: a target split into layer ranges computes exactly what the whole model does."""
from __future__ import annotations

import pytest
import torch

from conftest import reference_greedy, tiny_model
from seed_tot import SamplingParams
from seed_tot.engine.pipeline import PipelineConfig, build_stages, simulate, split_layers
from seed_tot.engine.pipeline.stages import StageKV

PROMPT = [5, 9, 13, 2, 7, 30]


def _staged_logits(stages, caches, ids, tokens, parents):
    hidden = None
    for stage, cache in zip(stages, caches):
        hidden = stage.run(cache, ids, tokens, parents, hidden)
    return hidden


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_staged_forward_equals_whole_model_logits(arch):
    model = tiny_model(arch, layers=3)
    stages = build_stages(model, 3)
    caches = [StageKV() for _ in stages]
    ids = list(range(len(PROMPT)))
    staged = _staged_logits(stages, caches, ids, PROMPT, [-1] + ids[:-1])
    with torch.no_grad():
        whole = model(torch.tensor([PROMPT])).logits[0]
    torch.testing.assert_close(staged, whole, rtol=1e-4, atol=1e-4)
    # and one more token on top of the per-stage caches equals the whole model on the longer input
    staged_next = _staged_logits(stages, caches, [99], [17], [ids[-1]])
    with torch.no_grad():
        whole_next = model(torch.tensor([PROMPT + [17]])).logits[0, -1:]
    torch.testing.assert_close(staged_next, whole_next, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_staged_greedy_tokens_equal_target_alone(arch):
    model = tiny_model(arch, layers=3)
    params = SamplingParams(max_new_tokens=10, temperature=0)
    out = simulate(model, None, [PROMPT], params, PipelineConfig(mode="pp", n_stages=3), 96)[0]
    assert out.result.token_ids == reference_greedy(model, PROMPT, 10)


def test_split_layers_is_contiguous_and_balanced():
    ranges = split_layers(7, 3)
    assert [list(r) for r in ranges] == [[0, 1, 2], [3, 4], [5, 6]]
    assert [list(r) for r in split_layers(2, 2)] == [[0], [1]]


def test_more_stages_than_layers_is_a_clear_error():
    with pytest.raises(ValueError, match="2 decoder layers into 3 stages"):
        split_layers(2, 3)
    with pytest.raises(ValueError, match="at least one target stage"):
        split_layers(2, 0)


def test_stage_kv_after_reroot_equals_fresh_prefill_of_committed_plus_subtree():
    model = tiny_model("llama", layers=2)
    stages = build_stages(model, 2)
    prefix = PROMPT[:-1]
    pre_ids = [-(i + 2) for i in range(len(prefix))]
    # a tree under the root PROMPT[-1] (id 0): children 1, 2; grandchildren 3 (of 1), 4 (of 2), 5 (of 1)
    tree_ids, tree_tokens, tree_parents = [0, 1, 2, 3, 4, 5], [PROMPT[-1], 40, 41, 42, 43, 44], [pre_ids[-1], 0, 0, 1, 2, 1]
    caches = [StageKV() for _ in stages]
    _staged_logits(stages, caches, pre_ids, prefix, [-1] + pre_ids[:-1])
    for c in caches:
        c.retain(list(pre_ids), [])
    _staged_logits(stages, caches, tree_ids, tree_tokens, tree_parents)
    for c in caches:  # hit on node 1: commit the old root 0, keep node 1's subtree {1, 3, 5}
        c.retain([0], [1, 3, 5])
    fresh = [StageKV() for _ in stages]
    chain = pre_ids + [0]
    _staged_logits(stages, fresh, chain, PROMPT, [-1] + chain[:-1])
    for c in fresh:
        c.retain(chain, [])
    _staged_logits(stages, fresh, [1, 3, 5], [40, 42, 44], [0, 1, 1])
    for old, new in zip(caches, fresh):
        assert (old.kv.committed, old.kv.parents, old.ids) == (new.kv.committed, new.kv.parents, new.ids)
        for a, b in zip(old.kv.cache.layers, new.kv.cache.layers):
            torch.testing.assert_close(a.keys, b.keys, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(a.values, b.values, rtol=1e-5, atol=1e-5)
    # and both caches give the same logits for the next layer
    torch.testing.assert_close(_staged_logits(stages, caches, [6], [45], [3]),
                               _staged_logits(stages, fresh, [6], [45], [3]), rtol=1e-5, atol=1e-5)


def _sliding_model(arch: str):
    import transformers as tf

    common = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, initializer_range=0.15, sliding_window=3, bos_token_id=None,
                  eos_token_id=None, pad_token_id=None)
    torch.manual_seed(4)
    if arch == "qwen2":  # layer 0 full attention, layers 1-2 sliding: one mask per layer type
        return tf.Qwen2ForCausalLM(tf.Qwen2Config(**common, use_sliding_window=True, max_window_layers=1)).eval()
    return tf.MistralForCausalLM(tf.MistralConfig(**common)).eval()


@pytest.mark.parametrize("arch", ["qwen2", "mistral"])
def test_stages_apply_sliding_windows_like_the_whole_model(arch):
    model = _sliding_model(arch)
    stages = build_stages(model, 3)
    caches = [StageKV() for _ in stages]
    ids = list(range(len(PROMPT)))
    # a tree on top of the prompt: node 7 and 8 are siblings, 9 a child of 8 (positions past the window)
    _staged_logits(stages, caches, ids, PROMPT, [-1] + ids[:-1])
    staged = _staged_logits(stages, caches, [7, 8, 9], [17, 18, 19], [ids[-1], ids[-1], 8])
    with torch.no_grad():
        whole = [model(torch.tensor([PROMPT + path])).logits[0, -1] for path in ([17], [18], [18, 19])]
    torch.testing.assert_close(staged, torch.stack(whole), rtol=1e-4, atol=1e-4)


def test_models_whose_forward_does_more_than_embed_layers_norm_head_are_refused():
    import transformers as tf

    model = tf.Gemma2ForCausalLM(tf.Gemma2Config(vocab_size=96, hidden_size=64, intermediate_size=128,
                                                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                                 head_dim=16)).eval()
    with pytest.raises(ValueError, match="pipeline stages support llama, qwen2, qwen3, mistral models"):
        build_stages(model, 2)
