"""SEED mode: lossless like every mode, FCFS verification, and failures that surface instead of hanging."""
from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from conftest import noisy_copy, reference_greedy, tiny_model
from seed_tot import Engine, SamplingParams
from seed_tot.engine import seed as seed_module
from seed_tot.engine.forward_thread import ForwardThread
from seed_tot.engine.decode_spec import DecodeSpec
from seed_tot.engine.seed import SeedError

MAX_NEW = 20


@pytest.fixture(scope="module")
def setup():
    target = tiny_model("qwen2", seed=7)
    return target, noisy_copy(target, 0.005)


@pytest.mark.parametrize("verify_batch", [1, 3])
@pytest.mark.parametrize("k_config", [(1, 1, 1), (2, 2, 1)])
@pytest.mark.parametrize("n,same_prompt", [(1, True), (2, False), (3, True), (5, False)])
def test_seed_greedy_equals_target_alone(setup, n, same_prompt, k_config, verify_batch):
    target, draft = setup
    prompts = [[4, 4, 2]] * n if same_prompt else [[4, 4, 2][: 1 + i % 3] + [i + 10] for i in range(n)]
    refs = [reference_greedy(target, p, MAX_NEW) for p in prompts]
    results = Engine(target, draft).generate(prompts, SamplingParams(max_new_tokens=MAX_NEW, temperature=0),
                                             mode="seed", k_config=k_config, verify_batch=verify_batch)
    assert [r.token_ids for r in results] == refs


@pytest.mark.parametrize("verify_batch", [1, 3])
def test_seed_greedy_with_sequences_of_very_different_lengths(verify_batch):
    target = tiny_model("llama", seed=30)
    prompts = [[7, 1], [2, 9, 9, 4], [5, 5], [3]]
    eos = reference_greedy(target, prompts[0], 40)[1]  # sequence 0 ends after 2 tokens
    target.generation_config.eos_token_id = eos
    refs = [reference_greedy(target, p, 40) for p in prompts]
    assert len(refs[0]) == 2 and max(len(r) for r in refs) == 40
    results = Engine(target, noisy_copy(target, 0.005)).generate(
        prompts, SamplingParams(max_new_tokens=40, temperature=0), mode="seed", k_config=(1, 1, 1),
        n_workers=3, verify_batch=verify_batch)
    assert [r.token_ids for r in results] == refs


def test_seed_sampling_reproduces_sd_for_the_same_seed(setup):
    """Each sequence owns its random stream and consumes it in the same order in both modes,
    so SEED's scheduling changes timing only, never the sampled tokens."""
    target, draft = setup
    params = SamplingParams(max_new_tokens=16, temperature=0.9, top_k=20, seed=3)
    prompts = [[1, 2, 3]] * 4 + [[8, 6]] * 2
    engine = Engine(target, draft)
    sd = engine.generate(prompts, params, mode="sd", k_config=(1, 1, 1))
    sd_seed = engine.generate(prompts, params, mode="seed", k_config=(1, 1, 1), n_workers=3)
    assert [r.token_ids for r in sd] == [r.token_ids for r in sd_seed]
    assert len({tuple(r.token_ids) for r in sd_seed[:4]}) > 1  # copies of one prompt sample differently


def _verify_events(results):
    return [e for e in results[0].stats.events if e["type"] == "verify"]


def test_verification_is_first_come_first_served(setup):
    target, draft = setup
    prompts = [[1, 2, 3]] * 5
    results = Engine(target, draft).generate(prompts, SamplingParams(max_new_tokens=MAX_NEW, temperature=1.0),
                                             mode="seed", k_config=(1, 1, 1))
    events = results[0].stats.events
    enqueues = [e for e in events if e["type"] == "draft"]
    verifies = _verify_events(results)
    assert len(enqueues) == len(verifies) == sum(r.stats.verifications for r in results)
    assert [v["enqueued"] for v in verifies] == sorted(v["enqueued"] for v in verifies)
    for v in verifies:  # no worker waits behind more than n other verifications
        ahead = [w for w in verifies if v["enqueued"] <= w["start"] < v["start"]]
        assert len(ahead) <= len(prompts)


def test_target_is_not_idle_while_drafts_are_queued(setup):
    target, draft = setup
    results = Engine(target, draft).generate([[1, 2, 3]] * 4, SamplingParams(max_new_tokens=MAX_NEW),
                                             mode="seed", k_config=(1, 1, 1))
    verifies = _verify_events(results)
    slack = 0.05  # seconds of event-loop scheduling between a push and the verifier's pop
    for prev, nxt in zip(verifies, verifies[1:]):
        # if the next job was already queued when the previous verification ended, it starts at once
        if nxt["enqueued"] <= prev["end"]:
            assert nxt["start"] - prev["end"] < slack


def test_a_failing_draft_worker_surfaces_as_an_error_naming_it(setup, monkeypatch):
    target, draft = setup
    real = seed_module.draft_rows

    def flaky(model, rows, *args, **kwargs):
        if any(seq.index == 2 and len(seq.generated) > 3 for seq, _ in rows):
            raise RuntimeError("injected fault")
        return real(model, rows, *args, **kwargs)

    monkeypatch.setattr(seed_module, "draft_rows", flaky)
    engine = Engine(target, draft)

    async def run():
        return await asyncio.wait_for(engine.agenerate([[1, 2, 3]] * 4, SamplingParams(max_new_tokens=MAX_NEW),
                                                       mode="seed", draft_batch=1), timeout=60)  # one row per draft forward

    with pytest.raises(SeedError, match="sequence 2"):
        asyncio.run(run())


def test_a_failing_verifier_surfaces_as_an_error_naming_the_sequence(setup, monkeypatch):
    target, draft = setup

    def broken(model, jobs, *args):
        raise RuntimeError("target out of memory")

    monkeypatch.setattr(seed_module, "score_rows", broken)  # the target forward of every verification
    with pytest.raises(SeedError, match=r"verification of sequence \d+ failed"):
        Engine(target, draft).generate([[1, 2]] * 2, SamplingParams(max_new_tokens=8), mode="seed")


def test_cancelling_the_caller_stops_every_task(setup):
    target, draft = setup
    engine = Engine(target, draft)

    async def run():
        task = asyncio.create_task(engine.agenerate([[1, 2, 3]] * 4, SamplingParams(max_new_tokens=400), mode="seed"))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        return others

    assert asyncio.run(run()) == []


def test_seed_events_count_every_round(setup):
    target, draft = setup
    results = Engine(target, draft).generate([[1, 2, 3], [4]], SamplingParams(max_new_tokens=10), mode="seed")
    kinds = Counter(e["type"] for e in results[0].stats.events)
    assert kinds["draft"] == kinds["enqueue"] == kinds["verify"] == sum(r.stats.verifications for r in results)
    assert kinds["queue"] >= 1


def test_n_workers_caps_how_many_sequences_run_at_once(setup):
    target, draft = setup
    results = Engine(target, draft).generate([[1, 2, 3]] * 5, SamplingParams(max_new_tokens=8), mode="seed",
                                             n_workers=2)
    events = results[0].stats.events
    spans = {}
    for e in events:
        if e["type"] in ("draft", "verify"):
            lo, hi = spans.get(e["worker"], (e["start"], e["end"]))
            spans[e["worker"]] = (min(lo, e["start"]), max(hi, e["end"]))
    assert len(spans) == 5
    for t, _ in spans.values():  # at any worker's start, at most 2 workers are live
        assert sum(lo <= t < hi for lo, hi in spans.values()) <= 2


def test_copies_of_one_prompt_share_the_prefilled_prefix_kv(setup):
    target, draft = setup
    engine = Engine(target, draft)
    seqs, _ = engine._start([[1, 2, 3, 4]] * 3 + [[5, 6, 7]], SamplingParams(max_new_tokens=4), "seed", (1,))
    for caches in ([s.target.cache for s in seqs], [s.draft.cache for s in seqs]):
        slots = [cache.pool.slots_of(cache.line).tolist() for cache in caches]
        assert slots[0] == slots[1] == slots[2]  # one prefill per distinct prompt: the copies hold its slots
        assert not set(slots[3]) & set(slots[0])


def test_generate_inside_an_event_loop_points_to_agenerate(setup):
    target, draft = setup
    engine = Engine(target, draft)

    async def inside():
        with pytest.raises(RuntimeError, match="agenerate"):
            engine.generate([[1, 2]], SamplingParams(max_new_tokens=2), mode="seed")
        return await engine.agenerate([[1, 2]], SamplingParams(max_new_tokens=2, temperature=0), mode="seed")

    assert len(asyncio.run(inside())[0].token_ids) == 2


class _RefusingThread(ForwardThread):
    """A forward thread that stops taking work after `accepts` submissions, as every executor does once
    the interpreter begins to exit."""

    def __init__(self, accepts: int):
        super().__init__()
        self.accepts = accepts

    def _take(self):
        self.accepts -= 1
        if self.accepts < 0:
            raise RuntimeError("cannot schedule new futures after interpreter shutdown")

    def submit(self, fn, /, *args, **kwargs):
        self._take()
        return super().submit(fn, *args, **kwargs)

    def defer(self, fn, /, *args):
        self._take()
        return super().defer(fn, *args)

    def waiting(self) -> int:  # as if other work always waited: every step is queued anew, and refused
        return 1


@pytest.mark.parametrize("accepts", [4, 12, 30])
@pytest.mark.parametrize("mode", ["seed", "parallel"])
def test_an_executor_that_refuses_work_fails_every_caller_instead_of_hanging(setup, mode, accepts):
    """Queueing the next step is outside any forward: a refusal there must reach every waiting caller
    instead of stranding them."""
    target, draft = setup
    engine = Engine(target, draft, forward_thread=_RefusingThread(accepts))

    async def run():
        calls = [engine.agenerate([[1, 2, 3]] * 3, SamplingParams(max_new_tokens=150), mode=mode) for _ in range(3)]
        return await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), timeout=60)

    outcomes = asyncio.run(run())
    assert all(isinstance(o, RuntimeError) and "interpreter shutdown" in str(o) for o in outcomes), outcomes


def test_a_call_submitted_as_the_last_one_ends_runs_to_the_end(setup):
    """When the last active call ends, the step loop stops queueing steps. A call submitted at that very
    moment (here: from the finishing call's own completion, on the step thread) must still be run."""
    target, draft = setup
    engine = Engine(target, draft)
    params = SamplingParams(max_new_tokens=12, temperature=0)
    prompt = [5, 3, 9]
    second = []

    def submit_another(_future):
        seqs, future, _ = engine._submit([prompt], params, DecodeSpec(mode="seed"))
        second.append((seqs, future))

    _, first, _ = engine._submit([prompt], params, DecodeSpec(mode="seed"))
    first.add_done_callback(submit_another)
    first.result(timeout=60)
    seqs, future = second[0]
    future.result(timeout=60)
    assert seqs[0].generated == reference_greedy(target, prompt, 12)
    assert engine.scheduler.active_calls == 0


def test_the_models_configs_name_their_own_attention_again_once_the_calls_are_over(setup):
    """The step loop names row attention in the models' configs while it has calls; the user's models
    must be left as they were given when generate returns, whatever the mode."""
    target, draft = setup
    names = (target.config._attn_implementation, draft.config._attn_implementation)
    engine = Engine(target, draft)
    for mode in ("ar", "parallel", "seed"):
        engine.generate([[1, 2, 3]] * 2, SamplingParams(max_new_tokens=4), mode=mode)
        assert (target.config._attn_implementation, draft.config._attn_implementation) == names
    assert not names[0].startswith("seed_tot+")
