"""Batched SEED: ready draft workers share draft forwards, queued drafts share target forwards, and
the output is still exactly the target's (greedy tokens; sampled distribution; per-seed samples)."""
from __future__ import annotations

import asyncio

import pytest
import torch

from conftest import noisy_copy, reference_greedy, rows_stopping_differently, tiny_model
from seed_tot import Engine, SamplingParams
from seed_tot.engine import speculative, summarize
from seed_tot.engine.kv_cache import KVCache
from seed_tot.engine.model_runtime import ModelRuntime
from seed_tot.engine.policies import FixedPolicy
from seed_tot.engine.seed import SeedError
from seed_tot.engine.sequence import Sequence, StopRule

MAX_NEW = 16


@pytest.fixture(scope="module")
def setup():
    target = tiny_model("qwen2", seed=7)
    return target, noisy_copy(target, 0.005)


@pytest.mark.parametrize("draft_batch,verify_batch", [(1, 1), (3, 1), (3, 3), (None, 1), (None, None), (1, None)])
@pytest.mark.parametrize("k_config", [(1, 1, 1), (2, 2, 1)])
def test_batched_seed_greedy_equals_target_alone(setup, k_config, draft_batch, verify_batch):
    target, draft = setup
    prompts = [[4, 4, 2], [4, 4, 2], [9], [3, 1, 4, 1, 5, 9, 2, 6], [7, 7]]
    refs = [reference_greedy(target, p, MAX_NEW) for p in prompts]
    results = Engine(target, draft).generate(prompts, SamplingParams(max_new_tokens=MAX_NEW, temperature=0),
                                             mode="seed", k_config=k_config, draft_batch=draft_batch,
                                             verify_batch=verify_batch)
    assert [r.token_ids for r in results] == refs


@pytest.mark.parametrize("draft_batch", [2, None])
def test_batched_drafting_with_rows_stopping_at_different_times(draft_batch):
    """EOS after 2 tokens, a stop string, and the token budget end rows at different rounds while
    the others keep sharing forwards."""
    target, prompts, tok, params, _ = rows_stopping_differently()
    engine = Engine(target, noisy_copy(target, 0.005), tokenizer=tok)
    alone = [engine.generate([p], params, mode="sd")[0] for p in prompts]
    results = engine.generate(prompts, params, mode="seed", k_config=(2, 1, 1), draft_batch=draft_batch,
                              verify_batch=None)
    assert [r.token_ids for r in results] == [a.token_ids for a in alone]
    assert [r.finish_reason for r in results] == [a.finish_reason for a in alone]
    assert {r.finish_reason for r in results} >= {"eos", "stop"}


def test_batched_seed_sampling_reproduces_sd_for_the_same_seed(setup):
    """Each row drafts from its own generator in its own order: batching changes no sample."""
    target, draft = setup
    params = SamplingParams(max_new_tokens=12, temperature=0.9, top_k=20, seed=3)
    prompts = [[1, 2, 3]] * 4 + [[8, 6]] * 2
    engine = Engine(target, draft)
    sd = engine.generate(prompts, params, mode="sd", k_config=(1, 1, 1))
    for draft_batch, verify_batch in ((None, None), (2, 3)):
        seeded = engine.generate(prompts, params, mode="seed", k_config=(1, 1, 1), draft_batch=draft_batch,
                                 verify_batch=verify_batch)
        assert [r.token_ids for r in sd] == [r.token_ids for r in seeded]


def test_batched_drafting_really_shares_draft_forwards(setup):
    target, draft = setup
    prompts = [[4, 4, 2]] * 6
    params = SamplingParams(max_new_tokens=MAX_NEW, temperature=0)
    engine = Engine(target, draft)
    one = summarize(engine.generate(prompts, params, mode="seed", draft_batch=1, verify_batch=1))
    batched = summarize(engine.generate(prompts, params, mode="seed", draft_batch=None, verify_batch=None))
    assert batched.verifications == one.verifications  # same rounds (same tokens, same acceptance)
    assert batched.draft_forwards < one.draft_forwards / 2
    assert batched.target_forwards < one.target_forwards / 2


def test_seed_batches_draft_and_target_forwards_by_default_where_the_model_takes_batched_masks(setup):
    target, draft = setup
    prompts = [[4, 4, 2]] * 6
    params = SamplingParams(max_new_tokens=MAX_NEW, temperature=0)
    engine = Engine(target, draft)
    assert engine.resolve_batches("seed", "auto", "auto") == (None, None)
    assert engine.resolve_batches("seed", 3, "auto") == (3, None)
    assert engine.resolve_batches("sd", "auto", "auto") == (1, 1)
    with pytest.raises(ValueError, match="auto"):
        engine.resolve_batches("seed", "some", 1)
    default = summarize(engine.generate(prompts, params, mode="seed"))
    paper = summarize(engine.generate(prompts, params, mode="seed", draft_batch=1, verify_batch=1))
    assert default.verifications == paper.verifications  # same rounds (same tokens, same acceptance)
    assert default.draft_forwards < paper.draft_forwards / 2
    assert default.target_forwards < paper.target_forwards / 2


def test_batched_verification_pops_in_arrival_order(setup):
    target, draft = setup
    results = Engine(target, draft).generate([[1, 2, 3]] * 5, SamplingParams(max_new_tokens=10, temperature=0),
                                             mode="seed", draft_batch=2, verify_batch=3)
    events = results[0].stats.events
    enqueued = [e["worker"] for e in events if e["type"] == "enqueue"]
    verified = [e["worker"] for e in events if e["type"] == "verify"]
    assert verified == enqueued


def _concurrently(engine, calls):
    async def run():
        return await asyncio.gather(*(engine.agenerate(prompts, params, mode="seed", **kw) for prompts, params, kw in calls))
    return asyncio.run(run())


def test_concurrent_callers_share_forwards_and_each_gets_what_it_gets_alone(setup):
    target, draft = setup
    engine = Engine(target, draft)
    calls = [([[4, 4, 2]] * 3, SamplingParams(max_new_tokens=MAX_NEW, temperature=0), dict(verify_batch=None, draft_batch=None)),
             ([[9], [3, 1, 4]], SamplingParams(max_new_tokens=10, temperature=0.8, top_k=10, seed=5),
              dict(verify_batch=None, draft_batch=None, k_config=(2, 1))),
             ([[7, 7, 7, 7]] * 2, SamplingParams(max_new_tokens=12, temperature=1.0, seed=9), dict(verify_batch=2, draft_batch=1))]
    alone = [engine.generate(prompts, params, mode="seed", **kw) for prompts, params, kw in calls]
    together = _concurrently(engine, calls)
    for a, t in zip(alone, together):
        assert [r.token_ids for r in a] == [r.token_ids for r in t]
    # the calls really shared target forwards: some verification carried more rows than its call has
    assert any(e["batch"] > len(prompts) for (prompts, _, _), results in zip(calls, together)
               for e in results[0].stats.events if e["type"] == "verify")
    assert engine.scheduler.active_calls == 0


def test_a_failing_sequence_ends_only_its_own_call(setup, monkeypatch):
    """One caller's sequence fails inside a shared verification; the other caller's sequences,
    verified in the same forwards, finish exactly as they would alone, and nothing hangs."""
    target, draft = setup
    engine = Engine(target, draft)
    real = speculative.accept_row

    def fail_for_prompt_90(job, *args):
        seq = job[0]
        if seq.prompt == [90, 89] and len(seq.generated) >= 3:
            raise RuntimeError("injected fault")
        return real(job, *args)

    monkeypatch.setattr(speculative, "accept_row", fail_for_prompt_90)
    greedy = SamplingParams(max_new_tokens=MAX_NEW, temperature=0)
    good_prompts = [[4, 4, 2], [5, 6]]
    refs = [reference_greedy(target, p, MAX_NEW) for p in good_prompts]

    async def run():
        bad = engine.agenerate([[90, 89]] * 2, greedy, mode="seed", verify_batch=None, draft_batch=None)
        good = engine.agenerate(good_prompts, greedy, mode="seed", verify_batch=None, draft_batch=None)
        return await asyncio.wait_for(asyncio.gather(bad, good, return_exceptions=True), timeout=120)

    bad, good = asyncio.run(run())
    assert isinstance(bad, SeedError) and "injected fault" in str(bad)
    assert [r.token_ids for r in good] == refs


def test_synchronous_callers_on_several_threads_share_one_scheduler(setup):
    """`generate` from several threads (what `solve --concurrency` does) runs on the engine's one
    loop: the calls share target forwards and each gets exactly its own greedy output."""
    from concurrent.futures import ThreadPoolExecutor

    target, draft = setup
    engine = Engine(target, draft)
    prompt_sets = [[[4, 4, 2]], [[9]], [[3, 1, 4]]]  # one sequence per call: any shared forward is cross-call
    params = SamplingParams(max_new_tokens=MAX_NEW, temperature=0)
    with ThreadPoolExecutor(3) as pool:
        outs = list(pool.map(lambda ps: engine.generate(ps, params, mode="seed", verify_batch=None, draft_batch=None),
                             prompt_sets))
    for prompts, results in zip(prompt_sets, outs):
        assert [r.token_ids for r in results] == [reference_greedy(target, p, MAX_NEW) for p in prompts]
    assert max(e["batch"] for results in outs for e in results[0].stats.events if e["type"] == "verify") > 1


@pytest.mark.parametrize("concurrent", [False, True])
def test_batched_and_concurrent_seed_samples_follow_the_target_distribution(concurrent):
    """SAMPLES sampled continuations through batched drafting and verification (and, concurrent=True,
    split over 5 concurrent calls sharing the scheduler) lie within the TV bound of the exact
    target distribution, while the draft's own distribution lies outside it."""
    from collections import Counter

    from test_sampling_lossless import PROMPT, SAMPLES, VOCAB, exact_distribution, tv, tv_bound

    target = tiny_model("llama", seed=21, vocab=VOCAB)
    draft = noisy_copy(target, 0.6, seed=22)
    params = SamplingParams(max_new_tokens=2, temperature=1.0, top_k=4)
    exact = exact_distribution(target, params)
    bound = tv_bound(exact, SAMPLES)
    assert tv(Counter({s: p * SAMPLES for s, p in exact_distribution(draft, params).items()}), exact, SAMPLES) > bound
    engine = Engine(target, draft)
    kw = dict(mode="seed", k_config=(2, 2), draft_batch=None, verify_batch=None)
    if concurrent:
        share = SAMPLES // 5
        calls = [([PROMPT] * share, SamplingParams(max_new_tokens=2, temperature=1.0, top_k=4, seed=i * share), {})
                 for i in range(5)]

        async def run():
            return await asyncio.gather(*(engine.agenerate(p, prm, **kw) for p, prm, _ in calls))
        results = [r for call in asyncio.run(run()) for r in call]
    else:
        results = engine.generate([PROMPT] * SAMPLES, params, **kw)
    counts = Counter(tuple(r.token_ids) for r in results)
    assert tv(counts, exact, SAMPLES) < bound


def test_on_one_forward_thread_concurrent_calls_merge_into_one_group_of_rows(setup):
    """On a CPU engine draft and target forwards share one thread. Two calls started together used
    to settle into two alternating groups (one drafting while the other verified), each forward
    carrying one call's rows only; the draft batcher now waits for the running verification, so
    the rows it frees join the same draft round and both calls' rows share forwards."""
    target, draft = setup
    engine = Engine(target, draft)
    assert engine.forward_thread is not None  # the CPU setting this is about
    greedy = SamplingParams(max_new_tokens=24, temperature=0)
    short, long = [[4, 4, 2], [9], [3, 1, 4], [7, 7]], [[1, 2, 3, 4, 5]]
    kw = dict(verify_batch=None, draft_batch=None, k_config=(1, 1))
    short_out, long_out = _concurrently(engine, [(short, greedy, kw), (long, greedy, kw)])
    assert [r.token_ids for r in short_out] == [reference_greedy(target, p, 24) for p in short]
    assert long_out[0].token_ids == reference_greedy(target, long[0], 24)
    batches = [e["batch"] for e in long_out[0].stats.events if e["type"] == "verify"]
    assert max(batches) == 5  # the long row verified in one forward with all four short rows


def test_fixed_rounds_stepped_together_draft_each_row_what_it_drafts_alone(setup, monkeypatch):
    """FixedRound.step_rows reads every greedy row's top tokens with one top-k per width in the batch
    (not per row or node): each row still gets the tree its own round drafts alone, also beside rows
    of another k_config."""
    _, draft = setup
    runtime = ModelRuntime(draft)
    params = SamplingParams(max_new_tokens=MAX_NEW, temperature=0)
    prompts = [[4, 4, 2], [9], [3, 1, 4, 1, 5, 9, 2, 6], [7, 7], [5, 6, 7, 8]]
    policies = [FixedPolicy((2, 2, 1)), FixedPolicy((1, 1, 1))]

    def rows():
        rule = StopRule(params, frozenset(), None)
        return [(Sequence(b, list(p), rule, torch.Generator(), draft=KVCache()), policies[b % 2])
                for b, p in enumerate(prompts)]

    vocab = draft.config.vocab_size
    alone = [speculative.draft_rows(runtime, [row], vocab)[0][0] for row in rows()]
    topks = []
    real_topk = torch.topk
    monkeypatch.setattr(torch, "topk", lambda *a, **k: topks.append(1) or real_topk(*a, **k))
    together = [tree for tree, _ in speculative.draft_rows(runtime, rows(), vocab)]
    assert [(t.tokens, t.parents) for t in together] == [(t.tokens, t.parents) for t in alone]
    # per draft step, one per width among the five rows: (2, 1) at depths 1 and 2, (1,) at depth 3
    assert len(topks) == 2 + 2 + 1
