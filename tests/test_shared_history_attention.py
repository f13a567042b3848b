"""Rows that hold a long stretch of history in the same pool slots (forks of one prompt) read it once:
every row's queries score it in one matmul per KV head (row_attention._shared_history_attention).

The path is exact: its logits equal the gathered path's to float32 rounding, greedy output of every
mode equals the target alone on every attention type the engine serves (sliding-window layers keep
the gathered path; their full layers take this one), and sampled output keeps the target's law.
"""
from __future__ import annotations

from collections import Counter

import pytest
import torch

import test_sampling_lossless as sampled
from conftest import count_calls, noisy_copy, reference_greedy, tiny_model
from seed_tot.engine import Engine, SamplingParams, kv_pool, row_attention
from seed_tot.engine.kv_cache import KVCache, forward_batch
from test_attention_types import ARCHS, VOCAB, build

SHARED = kv_pool.MIN_SHARED_READ + 6
STEM = [(11 * i + 5) % VOCAB for i in range(SHARED)]
# three prompts behind one long common stretch, one of them twice (a fork of the whole prompt)
PROMPTS = [STEM + [3], STEM + [8, 1], STEM + [3], STEM + [50, 2, 9]]
NEW = 10


@pytest.fixture
def shared_reads(monkeypatch):
    """How many layer forwards took the shared-history path."""
    return count_calls(monkeypatch, row_attention, "_shared_history_attention")


def _forked_rows(engine: Engine) -> list[KVCache]:
    """Three rows forked from one prefilled stem, each with a different token after it."""
    runtime = engine.target_runtime
    stem = KVCache()
    stem.forward(runtime, STEM, [i - 1 for i in range(len(STEM))])
    stem.commit(list(range(len(STEM))))
    return [stem.fork() for _ in range(3)]


@pytest.mark.parametrize("arch", ["llama", "gemma2", "gpt2"])
def test_logits_equal_the_gathered_path_to_rounding(arch, shared_reads, monkeypatch):
    engine = Engine(build(arch), None, vocab_size=VOCAB)
    tokens, parents = [[4], [9, 2], [7, 7, 1]], [[-1], [-1, 0], [-1, 0, 1]]
    rows = forward_batch(engine.target_runtime, _forked_rows(engine), tokens, parents, what="a test")
    assert shared_reads["n"] > 0
    monkeypatch.setattr(kv_pool, "MIN_SHARED_READ", 10 ** 9)  # every row's history gathered, as before
    gathered = forward_batch(engine.target_runtime, _forked_rows(engine), tokens, parents, what="a test")
    for got, want in zip(rows, gathered):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", [a for a in ARCHS if a != "falcon-mqa"])  # Falcon keeps the copying path
@pytest.mark.parametrize("mode,k_config", [("parallel", (1,)), ("mcsd", (2, 1)), ("seed", (1, 1, 1)), ("seed", (2, 1))])
def test_greedy_output_equals_the_target_alone_with_a_shared_stretch(arch, mode, k_config, shared_reads):
    target = build(arch)
    engine = Engine(target, noisy_copy(target, 0.003), vocab_size=VOCAB)
    results = engine.generate(PROMPTS, SamplingParams(max_new_tokens=NEW, temperature=0), mode=mode, k_config=k_config)
    for prompt, result in zip(PROMPTS, results):
        assert result.token_ids == reference_greedy(target, prompt, NEW), f"{arch} {mode} {k_config}"
    windows = engine.target_runtime.windows
    # mcsd verifies one sequence per forward: only batched rows can share a read
    if mode != "mcsd" and any(w is None for w in windows):  # a layer the shared path serves
        assert shared_reads["n"] > 0


def test_a_stretch_shorter_than_the_threshold_and_a_row_alone_read_as_before(shared_reads):
    target = tiny_model("llama", seed=3, vocab=VOCAB)
    engine = Engine(target, None, vocab_size=VOCAB)
    short = [STEM[: kv_pool.MIN_SHARED_READ - 2] + [t] for t in (3, 4)]
    engine.generate(short, SamplingParams(max_new_tokens=4, temperature=0), mode="parallel")
    engine.generate(PROMPTS[:1], SamplingParams(max_new_tokens=4, temperature=0), mode="ar")
    assert shared_reads["n"] == 0


def test_consecutive_shared_slots_are_read_in_place():
    read = torch.tensor([[5, 6, 7, 8, 20], [5, 6, 7, 8, 31]])
    monkey = kv_pool.MIN_SHARED_READ
    try:
        kv_pool.MIN_SHARED_READ = 2
        assert kv_pool._shared_history(read, 5) == (4, slice(5, 9))
        shared, slots = kv_pool._shared_history(torch.tensor([[5, 9, 7, 1], [5, 9, 7, 2]]), 3)
        assert shared == 3 and slots.tolist() == [5, 9, 7]  # not consecutive: their ids, gathered once
        assert kv_pool._shared_history(read, 1) == (0, None)  # below the threshold
    finally:
        kv_pool.MIN_SHARED_READ = monkey


@pytest.mark.parametrize("mode,k_config", [("parallel", (1,)), ("seed", (2, 2))])
def test_sampled_output_keeps_the_target_distribution_with_a_shared_stretch(mode, k_config, monkeypatch, shared_reads):
    stem = [(5 * i + 1) % sampled.VOCAB for i in range(SHARED)]
    monkeypatch.setattr(sampled, "PROMPT", stem)  # every sample a fork of this long prompt
    target = tiny_model("llama", seed=21, vocab=sampled.VOCAB)
    draft = noisy_copy(target, 0.6, seed=22)
    params = sampled.SETTINGS["temperature"]
    results = Engine(target, draft).generate([stem] * sampled.SAMPLES, params, mode=mode, k_config=k_config,
                                             n_workers=8, draft_batch=None, verify_batch=None)
    assert shared_reads["n"] > 0
    exact = sampled.exact_distribution(target, params)
    assert sampled.tv(Counter(tuple(r.token_ids) for r in results), exact, sampled.SAMPLES) < sampled.tv_bound(exact, sampled.SAMPLES)
