"""`parallel` under continuous batching: overlapping parallel calls share target forwards (like seed
calls do), rows join and leave at their own steps, and each call still gets exactly what it gets alone."""
from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import noisy_copy, reference_greedy, rows_stopping_differently, tiny_model
from seed_tot import Engine, SamplingParams
from seed_tot.engine import summarize

MAX_NEW = 14
CALLS = [[[4, 4, 2], [9]], [[3, 1, 4, 1, 5, 9, 2, 6]], [[7, 7], [8, 6, 5], [8, 6, 5]]]


@pytest.fixture(scope="module")
def target():
    return tiny_model("qwen2", seed=11)


def _verify_batches(results) -> list[int]:
    """Rows per target forward this call's rows took part in (from the scheduler's timeline)."""
    return [e["batch"] for e in results[0].stats.events if e["type"] == "verify"]


def _tokens(results) -> list[list[int]]:
    return [r.token_ids for r in results]


def test_greedy_parallel_equals_the_target_alone_with_rows_stopping_at_different_steps():
    """EOS, a stop string and the token budget end rows at different steps; the others go on."""
    target, prompts, tok, params, refs = rows_stopping_differently()
    engine = Engine(target, None, tokenizer=tok)
    alone = [engine.generate([p], params, mode="ar")[0] for p in prompts]
    results = engine.generate(prompts, params, mode="parallel")
    assert _tokens(results) == _tokens(alone)
    assert [r.finish_reason for r in results] == [a.finish_reason for a in alone]
    assert {r.finish_reason for r in results} >= {"eos", "stop", "length"}
    for ref, r in zip(refs, results):  # what transformers' generate gives, cut where the rule stops
        assert r.token_ids == ref[: len(r.token_ids)]
    # rows leave when they stop: later forwards carry fewer rows, and there is one forward per step
    batches = _verify_batches(results)
    assert batches[0] == len(prompts) and batches[-1] < len(prompts)
    assert summarize(results).target_forwards == pytest.approx(max(len(r.token_ids) for r in results))


def test_concurrent_agenerate_callers_share_target_forwards_and_each_gets_what_it_gets_alone(target):
    engine = Engine(target, noisy_copy(target, 0.005))
    params = SamplingParams(max_new_tokens=MAX_NEW, temperature=0)
    alone = [engine.generate(prompts, params, mode="parallel") for prompts in CALLS]
    for prompts, results in zip(CALLS, alone):
        assert _tokens(results) == [reference_greedy(target, p, MAX_NEW) for p in prompts]
        assert max(_verify_batches(results)) == len(prompts)

    async def run():
        return await asyncio.gather(*(engine.agenerate(prompts, params, mode="parallel") for prompts in CALLS))

    together = asyncio.run(run())
    for a, t in zip(alone, together):
        assert _tokens(a) == _tokens(t)
    rows = sum(len(p) for p in CALLS)
    for prompts, results in zip(CALLS, together):
        assert max(_verify_batches(results)) > len(prompts)  # forwards carried other calls' rows
    # the counters agree: all calls' rows took fewer target forwards than the calls did apart
    apart = sum(summarize(r).target_forwards for r in alone)
    shared = sum(summarize(r).target_forwards for r in together)
    # the calls prefill one after another (on a CPU, on the one forward thread), so a later call's
    # rows may join at a later step: at most one extra forward per call after the first
    assert shared < apart and MAX_NEW - 1e-9 <= shared <= MAX_NEW + len(CALLS) - 1 + 1e-9
    assert sum(summarize(r).verifications for r in together) == rows * MAX_NEW


def test_threads_calling_generate_share_target_forwards(target):
    """What `solve --concurrency N --mode parallel` does: N threads, one engine, shared forwards."""
    engine = Engine(target, None)
    params = SamplingParams(max_new_tokens=40, temperature=0)
    alone = [engine.generate(prompts, params, mode="parallel") for prompts in CALLS]
    barrier = threading.Barrier(len(CALLS))

    def call(prompts):
        barrier.wait()
        return engine.generate(prompts, params, mode="parallel")

    with ThreadPoolExecutor(len(CALLS)) as pool:
        together = list(pool.map(call, CALLS))
    for a, t in zip(alone, together):
        assert _tokens(a) == _tokens(t)
    assert any(max(_verify_batches(results)) > len(prompts) for prompts, results in zip(CALLS, together))
    assert engine.scheduler.active_calls == 0


def test_sampled_parallel_is_the_same_alone_or_concurrent(target):
    """Each row draws from its own generator: sharing forwards with other calls changes no sample."""
    engine = Engine(target, None)
    params = [SamplingParams(max_new_tokens=MAX_NEW, temperature=0.9, top_k=20, seed=3),
              SamplingParams(max_new_tokens=10, temperature=1.0, seed=5),
              SamplingParams(max_new_tokens=12, temperature=0.7, top_p=0.9, seed=9)]
    alone = [engine.generate(prompts, p, mode="parallel") for prompts, p in zip(CALLS, params)]
    # the same draws as ar, which decodes each row on its own
    assert _tokens(alone[0]) == _tokens(engine.generate(CALLS[0], params[0], mode="ar"))
    assert _tokens(alone[2])[1] != _tokens(alone[2])[2]  # copies of a prompt draw their own samples

    async def run():
        return await asyncio.gather(*(engine.agenerate(prompts, p, mode="parallel") for prompts, p in zip(CALLS, params)))

    together = asyncio.run(run())
    for a, t in zip(alone, together):
        assert _tokens(a) == _tokens(t)


def test_parallel_needs_no_draft_model_and_shares_forwards_with_seed_calls(target):
    """An engine without a draft runs parallel (no draft cache, no draft forward); with a draft,
    parallel rows and seed drafts of overlapping calls are verified in the same target forwards."""
    bare = Engine(target, None)
    params = SamplingParams(max_new_tokens=MAX_NEW, temperature=0)
    results = bare.generate(CALLS[2], params, mode="parallel")
    assert _tokens(results) == [reference_greedy(target, p, MAX_NEW) for p in CALLS[2]]
    stats = summarize(results)
    assert stats.draft_forwards == stats.draft_prefills == stats.drafted == 0
    assert stats.target_prefills == 2  # one per distinct prompt: the copy shares its prefix

    engine = Engine(target, noisy_copy(target, 0.005))

    # the seed call runs three times as long, so the parallel call's steps fall inside it however the
    # threads are scheduled (with equal budgets the seed call could finish its few rounds first)
    long = SamplingParams(max_new_tokens=3 * MAX_NEW, temperature=0)

    async def run():
        # draft_batch=1: each seed worker drafts on its own thread, so seed drafts reach the queue
        # while parallel rows wait there (a batched draft forward lets the two phase-lock apart)
        return await asyncio.gather(engine.agenerate(CALLS[0], long, mode="seed", verify_batch=None, draft_batch=1),
                                    engine.agenerate(CALLS[1], params, mode="parallel"))

    seed, parallel = asyncio.run(run())
    for prompts, out, budget in ((CALLS[0], seed, 3 * MAX_NEW), (CALLS[1], parallel, MAX_NEW)):
        assert _tokens(out) == [reference_greedy(target, p, budget) for p in prompts]
    assert max(_verify_batches(parallel)) > len(CALLS[1])
