"""Prompt stretches scored by one call are forked, not scored again, by the next (PrefixStore in
shared_prefill.py): a later prompt holds the cache it would have had prefilled alone, greedy output
stays the target's, only the new tokens are scored, and the store forgets least recently used first."""
from __future__ import annotations

import pytest
import torch

from conftest import reference_greedy, tiny_model
from seed_tot import Engine, SamplingParams
from seed_tot.engine import shared_prefill
from seed_tot.engine.model_runtime import ModelRuntime
from seed_tot.engine.shared_prefill import MIN_SHARED, PrefixStore
from test_attention_types import build
from test_shared_prefill import HEAD, STEP, alone, history

# a ToT search's calls: step 1's prompt, then step 2's (step 1's prompt + a chosen step), then
# another problem with the same few-shot HEAD; the value call's prompts share HEAD + STEP
CALLS = [[HEAD + [1, 2, 3]] * 3,
         [HEAD + [1, 2, 3] + STEP + [4]] * 3,
         [HEAD + [9, 9] + STEP[:5], HEAD + [9, 9] + STEP[:5] + [6, 7]],
         [HEAD + STEP + [5], HEAD + STEP + [6], HEAD + STEP + [8, 8]]]


@pytest.mark.parametrize("arch", ["llama", "gemma2"])
@torch.inference_mode()
def test_a_prompt_forked_from_an_earlier_call_holds_the_cache_it_would_have_alone(arch):
    runtime = ModelRuntime(build(arch) if arch != "llama" else tiny_model("llama", seed=5))
    store = PrefixStore()
    for prompts in CALLS:
        caches, _ = shared_prefill.prefill_prompts(runtime, prompts, store=store)
        for prompt, kv in zip(prompts, caches):
            want = alone(runtime, prompt)
            assert kv.committed == len(prompt) - 1 and not kv.parents
            for layer in range(len(want.cache.layers)):
                for got, expected in zip(history(kv, layer), history(want, layer)):
                    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(kv.forward(runtime, prompt[-1:], [-1]), want.forward(runtime, prompt[-1:], [-1]),
                                       rtol=1e-5, atol=1e-5)
    assert store.hit_tokens > 0


@torch.inference_mode()
def test_a_later_call_scores_only_what_no_earlier_call_scored():
    runtime = ModelRuntime(tiny_model("llama", seed=5))
    store = PrefixStore()
    scored = []
    for prompts in CALLS:
        _, costs = shared_prefill.prefill_prompts(runtime, prompts, store=store)
        scored.append(sum(c.tokens for c in costs))
    # call 2 forks all of step 1's prompt but its last token; call 3's first prompt forks HEAD (cut out
    # of a longer stored stretch) and its second forks the first; call 4 forks HEAD and scores STEP
    # once, shared by its three prompts (each prompt's last token is scored with its first round)
    assert scored == pytest.approx([len(HEAD) + 2, 1 + len(STEP), 6 + 2, len(STEP) + 1])
    alone_scored = [sum(c.tokens for c in shared_prefill.prefill_prompts(runtime, prompts)[1]) for prompts in CALLS]
    assert alone_scored[1:] == pytest.approx([len(HEAD) + 3 + len(STEP), len(HEAD) + 2 + 4 + 2,
                                              len(HEAD) + len(STEP) + 1])


@torch.inference_mode()
def test_the_store_forgets_the_least_recently_used_stretch():
    runtime = ModelRuntime(tiny_model("llama", seed=5))
    store = PrefixStore(max_entries=2)
    heads = [[h] + HEAD for h in (1, 2, 3)]
    for head in heads:
        shared_prefill.prefill_prompts(runtime, [head + [7]], store=store)
    assert len(store) == 2
    assert store.longest(heads[0] + [7], len(HEAD) + 1)[1] == 0  # the first one was dropped
    kv, n = store.longest(heads[2] + [5, 5], len(HEAD) + 1)
    assert n == len(HEAD) + 1 and kv.committed == n
    assert store.longest(heads[2][: MIN_SHARED - 1], MIN_SHARED - 1)[1] == 0  # below MIN_SHARED: not worth a fork
    off = PrefixStore(max_entries=0)
    _, costs = shared_prefill.prefill_prompts(runtime, [heads[0] + [7]], store=off)
    assert len(off) == 0 and costs[0].tokens == len(HEAD) + 1


@torch.inference_mode()
def test_the_store_keeps_at_most_its_byte_budget_counting_a_shared_trunk_once():
    runtime = ModelRuntime(tiny_model("llama", seed=5))
    heads = [[h] + HEAD for h in (1, 2, 3)]
    probe = PrefixStore()
    shared_prefill.prefill_prompts(runtime, [heads[0] + [7]], store=probe)
    one = probe.retained_bytes()
    assert one > 0
    store = PrefixStore(max_bytes=int(2.5 * one))
    for head in heads:
        shared_prefill.prefill_prompts(runtime, [head + [7]], store=store)
    assert len(store) == 2 and store.retained_bytes() <= 2.5 * one
    assert store.longest(heads[0] + [7], len(HEAD) + 1)[1] == 0  # the least recently used went first
    # a later step forks the stored stretch and stores a longer one: the trunk's storage counts once
    trunk = PrefixStore()
    shared_prefill.prefill_prompts(runtime, [heads[0] + [7]], store=trunk)
    shared_prefill.prefill_prompts(runtime, [heads[0] + STEP + [7]], store=trunk)
    longer = PrefixStore()
    shared_prefill.prefill_prompts(runtime, [heads[0] + STEP + [7]], store=longer)
    assert len(trunk) == 2 and trunk.retained_bytes() == longer.retained_bytes() < one + longer.retained_bytes()
    tight = PrefixStore(max_bytes=one // 2)  # an entry alone over the budget is not kept
    shared_prefill.prefill_prompts(runtime, [heads[0] + [7]], store=tight)
    assert len(tight) == 0


@pytest.mark.parametrize("mode", ["ar", "parallel", "sd", "seed"])
def test_greedy_output_across_calls_with_the_store_equals_the_target_alone(mode, llama_pair):
    target, draft = llama_pair
    engine = Engine(target, draft)
    params = SamplingParams(max_new_tokens=10, temperature=0)
    for prompts in CALLS:
        results = engine.generate(prompts, params, mode=mode)
        for prompt, result in zip(prompts, results):
            assert list(result.token_ids) == reference_greedy(target, prompt, 10)
    assert engine.prefix_stores["target"].hit_tokens > 0
    assert mode in ("ar", "parallel") or engine.prefix_stores["draft"].hit_tokens > 0
    engine.clear_prefix_cache()
    assert not len(engine.prefix_stores["target"]) and not len(engine.prefix_stores["draft"])
