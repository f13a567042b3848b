"""Row padding (query_padding.py): the choice from measured costs, and padded forwards that leave
caches, greedy output and the sampled distribution exactly as unpadded ones."""
from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from conftest import noisy_copy, reference_greedy, tiny_model
from test_sampling_lossless import SAMPLES, pair, sample_through_engine, tv, tv_bound  # noqa: F401 (pair: a fixture)
from seed_tot import Engine, SamplingParams
from seed_tot.engine.kv_cache import KVCache, forward_batch
from seed_tot.engine.model_runtime import ModelRuntime
from seed_tot.engine.policies.base import HiddenCapture
from seed_tot.engine.policies.specdec import SpecDecPolicy
from seed_tot.engine.query_padding import choose_padding, measure_padding
from seed_tot.engine.speculative import prefill

PAD_ALL = {n: 8 for n in range(1, 8)}  # every small forward runs 8 rows: the most padding there can be


def test_padding_goes_to_the_fewest_rows_near_the_cheapest_and_only_where_it_saves():
    # an MKL-like step: 2 and 3 rows cost 2.2x and 3x one row, 4 rows 1.8x, 8 rows as cheap as 4 (noise);
    # 6 -> 8 would save only 12.5%: not padded
    cost = {1: 1.0, 2: 2.2, 3: 3.0, 4: 1.8, 5: 1.9, 6: 2.0, 7: 3.4, 8: 1.75}
    assert choose_padding(cost) == {2: 4, 3: 4, 7: 8}
    assert choose_padding({1: 1.0, 2: 1.1, 3: 1.2, 4: 1.3}) == {}  # costs that grow with rows: never pad
    assert choose_padding({1: 1.0, 2: 2.0, 3: 1.9}) == {}  # 5% cheaper is not worth padding


def test_small_models_and_explicit_tables():
    model = tiny_model("llama", seed=1)
    runtime = ModelRuntime(model)
    assert measure_padding(model) == {}  # products of a few thousand weights: timing them is noise
    assert runtime.padded_rows(3) == 3
    runtime.set_padding({3: 4})
    assert runtime.padded_rows(3) == 4 and runtime.padded_rows(2) == 2 and runtime.padded_rows(40) == 40
    assert ModelRuntime(model).padded_rows(3) == 3  # a table is its runtime's, not the model's
    with pytest.raises(ValueError, match="only be padded up"):
        runtime.set_padding({4: 3})


def test_a_padded_forward_leaves_the_cache_and_logits_of_an_unpadded_one():
    runtime = ModelRuntime(tiny_model("llama", seed=2))
    plain, padded = KVCache(), KVCache()
    for kv in (plain, padded):
        prefill(runtime, kv, [3, 1, 4, 1, 5])
    tokens, parents = [9, 2, 6], [-1, 0, 0]  # a tree: the 4D-mask path
    want = plain.forward(runtime, tokens, parents)
    runtime.set_padding(PAD_ALL)
    got = padded.forward(runtime, tokens, parents)
    assert got.shape == want.shape and padded.parents == plain.parents and padded.length == plain.length
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    last = padded.forward(runtime, [7, 7], [2, 3], logits_to_keep=1)  # a chain off node 2, only its last logits
    assert last.shape[0] == 1
    torch.testing.assert_close(last, plain.forward(runtime, [7, 7], [2, 3])[-1:], atol=1e-5, rtol=1e-4)
    for kv in (plain, padded):
        kv.commit([0, 2, 3, 4])
    for mine, ref in zip(padded.cache.layers, plain.cache.layers):
        assert mine.owner.length == ref.owner.length
        torch.testing.assert_close(mine.keys, ref.keys, atol=1e-5, rtol=1e-4)


def test_padding_queries_of_a_batched_forward_never_reach_a_row():
    runtime = ModelRuntime(tiny_model("llama", seed=2))
    rows = [KVCache(), KVCache()]
    for kv, prompt in zip(rows, ([3, 1, 4], [2, 7, 1, 8, 2])):
        prefill(runtime, kv, prompt)
    runtime.set_padding(PAD_ALL)  # 2 rows x 1 query, packed -> 8 queries, 6 of them no row's
    logits = forward_batch(runtime, rows, [[5], [6]], [[-1], [-1]])
    assert [lg.shape[0] for lg in logits] == [1, 1]
    assert [len(kv.parents) for kv in rows] == [1, 1]
    assert [kv.cache.length for kv in rows] == [3, 5]  # 2 and 4 prompt entries, 1 new entry each


@pytest.mark.parametrize("mode,k_config,batch", [("sd", (1, 1), 1), ("mcsd", (2, 2), 1), ("seed", (1, 1, 1), None)])
def test_greedy_output_with_every_forward_padded_equals_the_target_alone(mode, k_config, batch):
    target = tiny_model("llama", seed=3)
    draft = noisy_copy(target, 0.3)
    engine = Engine(target, draft)
    engine.target_runtime.set_padding(PAD_ALL)
    engine.draft_runtime.set_padding(PAD_ALL)
    prompts = [[5], [1, 2, 3, 4, 5, 6, 7], [9, 9, 2]]
    results = engine.generate(prompts, SamplingParams(max_new_tokens=20, temperature=0), mode=mode,
                              k_config=k_config, draft_batch=batch, verify_batch=batch)
    assert [r.token_ids for r in results] == [reference_greedy(target, p, 20) for p in prompts]


def test_a_policy_reading_hidden_states_sees_only_real_entries_when_padded():
    target = tiny_model("llama", seed=3)
    prompt = [1, 2, 3, 4, 5, 6, 7]

    class RecordingHead(torch.nn.Module):  # P̂ = 0.8 whatever it reads; it records what it read
        def __init__(self):
            super().__init__()
            self.logit = torch.nn.Parameter(torch.tensor(math.log(0.8 / 0.2)))
            self.seen = []

        def forward(self, hidden):
            self.seen.append(hidden.clone())
            return self.logit.expand(hidden.shape[:-1])

    heads = []
    for padding in ({}, PAD_ALL):
        draft = noisy_copy(target, 0.005)
        engine = Engine(target, draft)
        engine.draft_runtime.set_padding(padding)
        head = RecordingHead()
        policy = SpecDecPolicy(head, h=0.5, capture=engine.draft_runtime.capture(HiddenCapture))
        result = engine.generate([prompt], SamplingParams(max_new_tokens=16, temperature=0), mode="sd",
                                 draft_policy=policy)[0]
        assert result.token_ids == reference_greedy(target, prompt, 16)
        heads.append(head)
    plain, padded = heads
    assert len(plain.seen) == len(padded.seen) > 0
    for want, got in zip(plain.seen, padded.seen):  # the real last entry's state, never a padding entry's
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_sampled_output_with_padded_forwards_follows_the_target_distribution(pair):
    target, draft = pair
    results, exact = sample_through_engine(target, draft, "top_k", "sd", (1, 1), padding=PAD_ALL)
    assert tv(Counter(tuple(r.token_ids) for r in results), exact, SAMPLES) < tv_bound(exact, SAMPLES)
