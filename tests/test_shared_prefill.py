"""Prompts that begin alike are prefilled once per shared stretch (shared_prefill.py), and what each
prompt ends up with is the cache it would have had prefilled alone."""
from __future__ import annotations

import pytest
import torch

from conftest import reference_greedy, tiny_model
from seed_tot import Engine, SamplingParams
from seed_tot.engine import shared_prefill
from seed_tot.engine.model_runtime import ModelRuntime
from seed_tot.engine.kv_cache import KVCache
from test_attention_types import build

HEAD = [(7 * i + 3) % 90 for i in range(40)]  # 40 tokens: more than MIN_SHARED
STEP = [(11 * i + 5) % 90 for i in range(35)]
PROMPTS = [HEAD + [1, 2, 3], HEAD + STEP + [4, 5], HEAD + STEP + [6], HEAD + [1, 2, 3], [9, 8, 7]]


@torch.inference_mode()
def alone(runtime, prompt: list[int]) -> KVCache:
    kv = KVCache()
    kv.forward(runtime, prompt[:-1], [i - 1 for i in range(len(prompt) - 1)], logits_to_keep=1)
    kv.commit(list(range(len(prompt) - 1)))
    return kv


def history(kv: KVCache, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    return kv.cache.layers[layer].keys, kv.cache.layers[layer].values


@pytest.mark.parametrize("arch", ["llama", "mistral-sliding", "gemma2", "gpt2", "falcon-mqa"])
@torch.inference_mode()  # as the engine runs: caches hold inference tensors
def test_every_prompt_holds_the_cache_it_would_have_alone(arch):
    runtime = ModelRuntime(build(arch) if arch != "llama" else tiny_model("llama", seed=5))
    caches, _ = shared_prefill.prefill_prompts(runtime, PROMPTS)
    for prompt, kv in zip(PROMPTS, caches):
        want = alone(runtime, prompt)
        assert kv.committed == want.committed == len(prompt) - 1 and not kv.parents
        for layer in range(len(want.cache.layers)):
            for got, expected in zip(history(kv, layer), history(want, layer)):
                torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        # and the next forward (the prompt's last token) scores as it would alone
        torch.testing.assert_close(kv.forward(runtime, prompt[-1:], [-1]), want.forward(runtime, prompt[-1:], [-1]),
                                   rtol=1e-5, atol=1e-5)


def test_a_shared_stretch_is_scored_once():
    runtime = ModelRuntime(tiny_model("llama", seed=5))
    _, costs = shared_prefill.prefill_prompts(runtime, PROMPTS)
    # HEAD once, STEP once (shared by prompts 1 and 2), then each distinct prompt's own tail but its last token
    assert sum(c.tokens for c in costs) == pytest.approx(40 + 2 + 35 + 1 + 0 + 2)
    assert sum(c.forwards for c in costs) == pytest.approx(2 + 4 - 1)  # HEAD, STEP, 3 tails (prompt 2's is empty)
    assert costs[3].tokens == 0  # a copy of prompt 0 forks its whole cache


def test_short_common_beginnings_are_not_split_off():
    runtime = ModelRuntime(tiny_model("llama", seed=5))
    short = HEAD[: shared_prefill.MIN_SHARED - 1]
    _, costs = shared_prefill.prefill_prompts(runtime, [short + [1, 2], short + [3, 4]])
    assert sum(c.forwards for c in costs) == 2 and sum(c.tokens for c in costs) == 2 * len(short) + 2


@pytest.mark.parametrize("mode", ["ar", "parallel", "sd", "seed"])
def test_greedy_output_with_shared_prompt_beginnings_equals_the_target_alone(mode, llama_pair):
    target, draft = llama_pair
    engine = Engine(target, draft)
    params = SamplingParams(max_new_tokens=12, temperature=0)
    results = engine.generate(PROMPTS, params, mode=mode)
    for prompt, result in zip(PROMPTS, results):
        assert list(result.token_ids) == reference_greedy(target, prompt, 12)
