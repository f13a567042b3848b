"""A forward whose rows mostly decode one token while a few verify drafts runs the one-query rows'
attention apart from the wider rows' (row_attention.RowSplit), so a row that drafts does not pad
every other row's queries to its width.

The split is exact: its logits equal one attention call's to float32 rounding on every attention
type row attention serves (sliding windows, soft-caps, eager and sdpa, with a shared history), greedy
output of every mode equals the target alone, and sampled output keeps the target's law.
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

HISTORY = [(7 * i + 3) % VOCAB for i in range(40)]
NEW = 10


@pytest.fixture
def splits(monkeypatch):
    """How many layer forwards took the split path; every mixed forward splits (no minimum)."""
    monkeypatch.setattr(row_attention, "SPLIT_MIN_PAIRS", 0)
    return count_calls(monkeypatch, row_attention, "_split_attention")


def _rows(engine: Engine, forked: bool) -> list[KVCache]:
    """Four rows with histories of different lengths, or forked from one prefilled stem (a shared read)."""
    runtime = engine.target_runtime
    if forked:
        stem = KVCache()
        stem.forward(runtime, HISTORY, [i - 1 for i in range(len(HISTORY))])
        stem.commit(list(range(len(HISTORY))))
        return [stem.fork() for _ in range(4)]
    rows = []
    for length in (40, 23, 31, 12):
        kv = KVCache()
        kv.forward(runtime, HISTORY[:length], [i - 1 for i in range(length)])
        kv.commit(list(range(length)))
        rows.append(kv)
    return rows


# one-query rows around a chain of 3 and a tree of 3 (two children of the first entry)
TOKENS = [[4], [9, 2, 6], [5], [7, 7, 1]]
PARENTS = [[-1], [-1, 0, 1], [-1], [-1, 0, 0]]


@pytest.mark.parametrize("forked", [False, True])
@pytest.mark.parametrize("arch", [a for a in ARCHS if a != "falcon-mqa"])  # Falcon keeps the copying path
def test_logits_equal_one_attention_call_to_rounding(arch, forked, splits, monkeypatch):
    engine = Engine(build(arch), None, vocab_size=VOCAB)
    if forked:
        monkeypatch.setattr(kv_pool, "MIN_SHARED_READ", 8)
    rows = forward_batch(engine.target_runtime, _rows(engine, forked), TOKENS, PARENTS, what="a test")
    assert splits["n"] > 0
    monkeypatch.setattr(row_attention, "SPLIT_MIN_PAIRS", 10 ** 9)  # one call for every row, as before
    taken = splits["n"]
    whole = forward_batch(engine.target_runtime, _rows(engine, forked), TOKENS, PARENTS, what="a test")
    assert splits["n"] == taken
    for got, want in zip(rows, whole):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_forward_splits_only_where_it_spares_enough_padding():
    read = torch.zeros(3, 300, dtype=torch.long)
    masks = {None: torch.zeros(3, 1, 4, 300)}
    assert row_attention.RowSplit.of([1, 1, 4], [0, 1, 2], read, masks) is not None  # 2 rows x 3 x 300 pairs
    assert row_attention.RowSplit.of([1, 1, 1], [0, 1, 2], read, masks) is None  # nothing wider
    assert row_attention.RowSplit.of([2, 3, 4], [0, 2, 5], read, masks) is None  # no one-query row
    short = torch.zeros(3, 8, dtype=torch.long)
    assert row_attention.RowSplit.of([1, 1, 2], [0, 1, 2], short, {None: torch.zeros(3, 1, 2, 8)}) is None
    split = row_attention.RowSplit.of([1, 3, 1], [0, 1, 4], read, {None: torch.zeros(3, 1, 3, 300)})
    # packed query j's output: row 0 -> one-query output 0; row 1's three -> wide output 0..2; row 2 -> 1
    assert split.out.tolist() == [0, 2, 3, 4, 1]
    assert split.q_one.tolist() == [0, 4] and split.q_wide.tolist() == [1, 2, 3]


@pytest.mark.parametrize("arch", [a for a in ARCHS if a != "falcon-mqa"])
@pytest.mark.parametrize("mode,policy", [("seed", "lookup"), ("seed", "choose"), ("sd", "suffix")])
def test_greedy_output_equals_the_target_alone_with_split_forwards(arch, mode, policy, splits):
    target = build(arch)
    engine = Engine(target, noisy_copy(target, 0.003), vocab_size=VOCAB)
    # repeated stretches, so text drafts find matches in some rows and not in others
    prompts = [HISTORY[:12] + HISTORY[:6], HISTORY[5:9], HISTORY[:20] + HISTORY[3:9], [3, 1]]
    results = engine.generate(prompts, SamplingParams(max_new_tokens=NEW, temperature=0), mode=mode,
                              draft_policy=policy)
    for prompt, result in zip(prompts, results):
        assert result.token_ids == reference_greedy(target, prompt, NEW), f"{arch} {mode} {policy}"
    if mode == "seed":  # sd verifies one sequence per forward: nothing to split
        assert splits["n"] > 0


@pytest.mark.parametrize("setting", ["temperature", "top_k"])
def test_sampled_output_keeps_the_target_distribution_with_split_forwards(setting, splits):
    target = tiny_model("llama", seed=21, vocab=sampled.VOCAB)
    params = sampled.SETTINGS[setting]
    # prompt lookup drafts where the row's text repeats itself and not elsewhere: rows of both widths
    results = Engine(target, None).generate([sampled.PROMPT] * sampled.SAMPLES, params, mode="seed",
                                            draft_policy="lookup", n_workers=8, draft_batch=None, verify_batch=None)
    assert splits["n"] > 0
    exact = sampled.exact_distribution(target, params)
    assert sampled.tv(Counter(tuple(r.token_ids) for r in results), exact, sampled.SAMPLES) < sampled.tv_bound(exact, sampled.SAMPLES)
