"""Every mode is exact on every attention type the engine accepts, and refuses the rest up front.

Sliding windows (all layers, or mixed with full layers), multi-query attention, absolute position
embeddings: each mode's greedy output equals transformers' own greedy generate of the target alone,
for prompts longer than the window, one-token prompts and a draft that agrees often.
"""
from __future__ import annotations

import pytest
import torch
import transformers as tf

from conftest import noisy_copy, reference_greedy
from seed_tot.engine import Engine, SamplingParams
from seed_tot.engine.masks import AttentionLayout, UnsupportedAttention

VOCAB = 128
WINDOW = 5
NEW = 12
# one prompt longer than the window, a one-token prompt, one shorter than the window
PROMPTS = [[(7 * i + 3) % VOCAB for i in range(17)], [42], [5, 9, 77, 31]]

_SMALL = dict(vocab_size=VOCAB, initializer_range=0.15, bos_token_id=None, eos_token_id=None, pad_token_id=None)
_DECODER = dict(_SMALL, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=256)

# name -> (config class, model class, config kwargs)
ARCHS = {
    "llama": (tf.LlamaConfig, tf.LlamaForCausalLM, dict(_DECODER, num_hidden_layers=2)),
    # Qwen2 with max_window_layers=1: layer 0 full attention, layer 1 sliding (a per-layer pattern)
    "qwen2-sliding": (tf.Qwen2Config, tf.Qwen2ForCausalLM,
                      dict(_DECODER, num_hidden_layers=2, use_sliding_window=True, sliding_window=WINDOW,
                           max_window_layers=1)),
    "mistral-sliding": (tf.MistralConfig, tf.MistralForCausalLM,
                        dict(_DECODER, num_hidden_layers=2, sliding_window=WINDOW)),
    "gemma2": (tf.Gemma2Config, tf.Gemma2ForCausalLM,
               dict(_DECODER, num_hidden_layers=2, head_dim=16, sliding_window=WINDOW,
                    layer_types=["sliding_attention", "full_attention"])),
    "gemma3": (tf.Gemma3TextConfig, tf.Gemma3ForCausalLM,
               dict(_DECODER, num_hidden_layers=2, head_dim=16, sliding_window=WINDOW,
                    layer_types=["sliding_attention", "full_attention"])),
    "phi3": (tf.Phi3Config, tf.Phi3ForCausalLM, dict(_DECODER, num_hidden_layers=2, sliding_window=WINDOW)),
    "gpt2": (tf.GPT2Config, tf.GPT2LMHeadModel, dict(_SMALL, n_embd=64, n_layer=2, n_head=4, n_positions=256)),
    "gpt-neox": (tf.GPTNeoXConfig, tf.GPTNeoXForCausalLM,
                 dict(_SMALL, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      max_position_embeddings=256)),
    "opt": (tf.OPTConfig, tf.OPTForCausalLM,
            dict(_SMALL, hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
                 word_embed_proj_dim=64, max_position_embeddings=256)),
    "falcon-mqa": (tf.FalconConfig, tf.FalconForCausalLM,
                   dict(_SMALL, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, multi_query=True,
                        new_decoder_architecture=False, alibi=False, parallel_attn=True)),
}

# mode, k_config, verify_batch
SETTINGS = [("ar", (1,), 1), ("parallel", (1,), 1), ("sd", (1, 1, 1), 1), ("mcsd", (2, 2, 1), 1),
            ("mcsd", (3, 1), 1), ("seed", (1, 1, 1), 1), ("seed", (1, 1, 1), 3), ("seed", (2, 2, 1), 1),
            ("seed", (2, 1, 1), 3)]


def build(arch: str, seed: int = 0, **overrides):
    config_cls, model_cls, kwargs = ARCHS[arch]
    torch.manual_seed(seed)
    config = config_cls(**{**kwargs, **overrides})
    config._attn_implementation = "eager" if arch.startswith("gemma") else "sdpa"
    model = model_cls(config).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


@pytest.fixture(scope="module", params=list(ARCHS))
def arch_engine(request):
    target = build(request.param)
    draft = noisy_copy(target, 0.003)  # agrees often, not always
    refs = [reference_greedy(target, p, NEW) for p in PROMPTS]
    return request.param, Engine(target, draft, vocab_size=VOCAB), refs


@pytest.mark.parametrize("mode,k_config,verify_batch", SETTINGS, ids=lambda v: str(v))
def test_greedy_output_equals_the_target_alone_on_every_attention_type(arch_engine, mode, k_config, verify_batch):
    arch, engine, refs = arch_engine
    results = engine.generate(PROMPTS, SamplingParams(max_new_tokens=NEW, temperature=0), mode=mode,
                              k_config=k_config, verify_batch=verify_batch)
    for prompt, ref, result in zip(PROMPTS, refs, results):
        assert result.token_ids == ref, f"{arch} {mode} {k_config} vb{verify_batch}, prompt of {len(prompt)}"


def test_the_draft_agrees_often_so_trees_and_windows_are_really_exercised(arch_engine):
    _, engine, _ = arch_engine
    results = engine.generate(PROMPTS, SamplingParams(max_new_tokens=NEW, temperature=0), mode="sd")
    stats = [r.stats for r in results]
    assert sum(s.accepted for s in stats) / sum(s.draft_depth for s in stats) > 0.5


def test_sliding_window_masks_hide_keys_a_window_behind_in_positions_not_cache_slots():
    model = build("gemma2")
    layout = AttentionLayout.of(model)
    assert layout.as_dict and layout.windows == {"sliding_attention": WINDOW, "full_attention": None}
    mistral = AttentionLayout.of(build("mistral-sliding"))
    assert not mistral.as_dict and mistral.windows == {"full_attention": WINDOW}
    assert AttentionLayout.of(build("llama")).windows == {"full_attention": None}


@pytest.mark.parametrize("arch,alibi_kwargs", [
    ("bloom", {}), ("falcon-alibi", {})])
def test_alibi_models_are_refused_up_front_for_tree_and_batched_paths(arch, alibi_kwargs):
    if arch == "bloom":
        config = tf.BloomConfig(**_SMALL, hidden_size=64, n_layer=2, n_head=4)
        torch.manual_seed(0)
        target = tf.BloomForCausalLM(config).eval()
    else:
        target = build("falcon-mqa", alibi=True)
    target.generation_config.eos_token_id = None
    target.generation_config.pad_token_id = 0
    engine = Engine(target, noisy_copy(target, 0.003), vocab_size=VOCAB)
    params = SamplingParams(max_new_tokens=6, temperature=0)
    for kwargs in (dict(mode="mcsd", k_config=(2, 1)), dict(mode="seed", k_config=(2, 1)),
                   dict(mode="seed", k_config=(1, 1), verify_batch=2)):
        with pytest.raises(UnsupportedAttention, match="ALiBi.*Modes that are exact for it: ar, parallel, sd"):
            engine.generate(PROMPTS[:2], params, **kwargs)
    # seed's default batch sizes fall back to the paper's execution here instead of refusing
    assert engine.resolve_batches("seed", "auto", "auto") == (1, 1)
    # the modes the message names do work, and are exact
    refs = [reference_greedy(target, p, 6) for p in PROMPTS[:2]]
    for mode in ("ar", "parallel", "sd", "seed"):
        out = engine.generate(PROMPTS[:2], params, mode=mode, k_config=(1, 1))
        assert [r.token_ids for r in out] == refs, mode


@pytest.mark.parametrize("arch", ["gpt2", "opt"])
def test_context_overflow_of_absolute_position_models_is_refused_with_the_numbers(arch):
    target = build(arch, n_positions=24) if arch == "gpt2" else build(arch, max_position_embeddings=24)
    engine = Engine(target, noisy_copy(target, 0.003), vocab_size=VOCAB)
    with pytest.raises(ValueError, match=r"24 positions.*\(17 tokens\).*\(12\) needs 29"):
        engine.generate(PROMPTS[:1], SamplingParams(max_new_tokens=12, temperature=0), mode="sd")
    out = engine.generate(PROMPTS[:1], SamplingParams(max_new_tokens=7, temperature=0), mode="seed")
    assert len(out[0].token_ids) == 7  # exactly at the limit still runs


def test_rotary_models_keep_generating_past_max_position_embeddings():
    target = build("llama", max_position_embeddings=20)
    engine = Engine(target, noisy_copy(target, 0.003), vocab_size=VOCAB)
    out = engine.generate(PROMPTS[:1], SamplingParams(max_new_tokens=12, temperature=0), mode="mcsd", k_config=(2, 1))
    assert out[0].token_ids == reference_greedy(target, PROMPTS[0], 12)
