"""Sampled output follows the target's distribution on every attention type test_attention_types
covers (its greedy tests' sampled half): sliding windows (all layers, or mixed with full layers),
multi-query attention, absolute position embeddings, and ALiBi in the modes that take it. The TV
test of test_sampling_lossless, over a prompt longer than the window, so the window hides keys."""
from __future__ import annotations

from collections import Counter

import pytest
import torch
import transformers as tf

import test_sampling_lossless as lossless
from conftest import noisy_copy
from seed_tot import Engine
from test_attention_types import _SMALL, ARCHS, WINDOW, build

PROMPT = [(3 * i + 1) % lossless.VOCAB for i in range(9)]
assert len(PROMPT) > WINDOW
# Gemma scales its embeddings by sqrt(hidden): at the shared initializer_range a tiny model's
# continuation is certain, and a certain law proves nothing
INIT = {"gemma2": 0.05, "gemma3": 0.05}


def assert_samples_follow_the_target(target, monkeypatch, setting: str, mode: str, k_config, batch,
                                     attention: str = "gather") -> None:
    """test_sampling_lossless's engine run and TV test on this file's PROMPT, with a draft (noisy copy)
    whose own law lies outside the bound, so that a lossy verifier would show (attention: the
    engine's attention path, model_runtime.py)."""
    monkeypatch.setattr(lossless, "PROMPT", PROMPT)
    draft = noisy_copy(target, 0.3)
    params = lossless.SETTINGS[setting]
    exact = lossless.exact_distribution(target, params)
    bound = lossless.tv_bound(exact, lossless.SAMPLES)
    draft_law = lossless.exact_distribution(draft, params)
    assert lossless.tv(Counter({s: p * lossless.SAMPLES for s, p in draft_law.items()}), exact, lossless.SAMPLES) > bound
    results = Engine(target, draft, vocab_size=lossless.VOCAB, attention=attention).generate(
        [PROMPT] * lossless.SAMPLES, params, mode=mode, k_config=k_config, n_workers=8, draft_batch=batch,
        verify_batch=batch)
    stats = [r.stats for r in results]
    assert 0.05 < sum(s.accepted for s in stats) / sum(s.draft_depth for s in stats) < 0.95
    assert lossless.tv(Counter(tuple(r.token_ids) for r in results), exact, lossless.SAMPLES) < bound


@pytest.mark.parametrize("arch", list(ARCHS))
def test_sampled_output_follows_the_target_distribution_on_every_attention_type(arch, monkeypatch):
    """Batched seed with a tree: batched draft and verification forwards over each row's history
    (row attention, or the copying path for Falcon), tree masks and sliding windows."""
    target = build(arch, vocab_size=lossless.VOCAB, **({"initializer_range": INIT[arch]} if arch in INIT else {}))
    assert_samples_follow_the_target(target, monkeypatch, "top_p", "seed", (2, 2), None)


def test_sampled_output_follows_the_target_distribution_on_alibi(monkeypatch):
    """ALiBi (Bloom) in seed at one row per forward, the stock-cache path that sd shares."""
    torch.manual_seed(0)
    target = tf.BloomForCausalLM(tf.BloomConfig(**{**_SMALL, "vocab_size": lossless.VOCAB}, hidden_size=64,
                                                n_layer=2, n_head=4)).eval()
    target.generation_config.eos_token_id = None
    target.generation_config.pad_token_id = 0
    assert_samples_follow_the_target(target, monkeypatch, "temperature", "seed", (1, 1), 1)
