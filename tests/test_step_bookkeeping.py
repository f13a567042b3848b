"""The per-step shortcuts of the host path are exact: a sequence's pending tokens without building its
token list, a model's placement read from one parameter (still right after the model is cast), a
decode step of equal-length rows run without a mask, and row attention outside inference mode."""
from __future__ import annotations

import torch

from conftest import tiny_model
from seed_tot.engine.kv_cache import KVCache, forward_batch
from seed_tot.engine.model_runtime import ModelRuntime
from seed_tot.engine.params import SamplingParams
from seed_tot.engine.sequence import Sequence, StopRule
from test_kv_layout import prefill


def _sequence(prompt: list[int], generated: list[int]) -> Sequence:
    rule = StopRule(SamplingParams(max_new_tokens=64), frozenset(), None)
    return Sequence(0, list(prompt), rule, torch.Generator(), generated=list(generated))


def test_pending_tokens_equal_the_token_list_past_the_cache_at_every_length():
    for prompt, generated in (([1, 2, 3, 4], [5, 6, 7]), ([9], []), ([], [3, 4]), ([1, 2], [3])):
        seq = _sequence(prompt, generated)
        for seen in range(seq.length + 1):
            kv = KVCache(committed=seen)
            assert seq.pending(kv) == (prompt + generated)[seen:], (prompt, generated, seen)
        assert seq.length == len(prompt + generated)


def test_placement_follows_the_model_when_it_is_cast():
    model = tiny_model()
    runtime = ModelRuntime(model)
    assert runtime.placement == (model.device, model.dtype)
    model.to(torch.float64)  # Module.to swaps each parameter's data: the parameter read is the same object
    assert runtime.placement == (model.device, torch.float64) == (model.device, model.dtype)
    model.to(torch.float32)
    assert runtime.placement[1] is torch.float32


@torch.inference_mode()
def test_a_maskless_decode_step_of_equal_rows_equals_the_model_on_the_whole_sequence():
    model = tiny_model()
    runtime = ModelRuntime(model)
    prompts = [[3, 5, 7, 9, 11], [4, 6, 8, 10, 12], [13, 1, 2, 3, 4]]  # one length: the step needs no mask
    caches, sequences = [prefill(runtime, p) for p in prompts], [list(p) for p in prompts]
    for step in range(3):
        tokens = [[20 + step + b] for b in range(len(prompts))]
        logits = forward_batch(runtime, caches, tokens, [[-1]] * len(prompts))
        for b, kv in enumerate(caches):
            sequences[b] += tokens[b]
            # the stock forward of the whole sequence, no cache of ours: an independent reference
            expected = model(input_ids=torch.tensor([sequences[b]])).logits[0, -1:]
            torch.testing.assert_close(logits[b], expected, rtol=1e-4, atol=1e-4)
            kv.commit([0])


def test_row_attention_runs_with_autograd_enabled_and_matches_inference_mode():
    runtime = ModelRuntime(tiny_model())
    prompts = [[3, 5, 7, 9], [4, 6, 8]]  # unequal rows: masked, padded reads
    with torch.inference_mode():
        reference = forward_batch(runtime, [prefill(runtime, p) for p in prompts], [[30], [31]], [[-1], [-1]])
    caches = [prefill(runtime, p) for p in prompts]
    with torch.enable_grad():
        logits = forward_batch(runtime, caches, [[30], [31]], [[-1], [-1]])
    for got, want in zip(logits, reference):
        torch.testing.assert_close(got, want)
