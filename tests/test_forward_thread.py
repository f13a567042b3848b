"""On a CPU every forward of an engine (prefill, drafts, verification, every mode, concurrent callers)
runs on the engine's one forward thread, which also loads its models (engine/forward_thread.py says why)."""
from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import noisy_copy, tiny_model
from seed_tot import Engine, SamplingParams
from seed_tot.engine.forward_thread import ForwardThread


class ThreadLog:
    def __init__(self, *models):
        self.threads: set[int] = set()
        for model in models:
            model.register_forward_hook(lambda *_: self.threads.add(threading.get_ident()))


@pytest.mark.parametrize("mode,batches", [("ar", {}), ("sd", {}), ("parallel", {}), ("seed", {}),
                                          ("seed", {"draft_batch": 1, "verify_batch": 1})])
def test_every_forward_of_a_cpu_engine_runs_on_its_one_forward_thread(mode, batches):
    target = tiny_model("llama", seed=4)
    draft = noisy_copy(target, 0.01)
    log = ThreadLog(target, draft)
    engine = Engine(target, draft)
    params = SamplingParams(max_new_tokens=6, temperature=0)
    prompts = [[3, 17, 4, 9, 22], [8, 1, 60], [8, 1, 60]]
    with ThreadPoolExecutor(2) as callers:  # two callers at once, as `solve --concurrency 2`
        list(callers.map(lambda _: engine.generate(prompts, params, mode=mode, **batches), range(2)))
    assert len(log.threads) == 1 and threading.get_ident() not in log.threads


def test_from_pretrained_loads_the_models_on_the_thread_that_runs_their_forwards(tiny_model_dirs, monkeypatch):
    import seed_tot.engine.engine as engine_module

    loaded_on: set[int] = set()
    real_load = engine_module.load_model

    def load_and_note_thread(*args, **kwargs):
        loaded_on.add(threading.get_ident())
        return real_load(*args, **kwargs)

    monkeypatch.setattr(engine_module, "load_model", load_and_note_thread)
    target_dir, draft_dir = tiny_model_dirs
    engine = Engine.from_pretrained(target=target_dir, draft=draft_dir, device="cpu")
    log = ThreadLog(engine.target, engine.draft)
    engine.generate([[3, 4, 5]], SamplingParams(max_new_tokens=4, temperature=0), mode="sd")
    assert len(loaded_on) == 1 and loaded_on == log.threads and threading.get_ident() not in loaded_on
    # an engine over the same models shares the thread; so does work handed to it
    other = Engine(engine.target, engine.draft, engine.tokenizer, forward_thread=engine.forward_thread)
    other.generate([[3, 4, 5]], SamplingParams(max_new_tokens=4, temperature=0), mode="seed")
    assert log.threads == loaded_on == {other.on_forward_thread(threading.get_ident)}


@pytest.mark.parametrize("mode", ["parallel", "seed", "sd"])
def test_generate_from_work_on_the_forward_thread_runs_inline_instead_of_deadlocking(mode):
    target = tiny_model("llama", seed=4)
    draft = noisy_copy(target, 0.01)
    log = ThreadLog(target, draft)
    engine = Engine(target, draft)
    params = SamplingParams(max_new_tokens=6, temperature=0)
    prompts = [[3, 17, 4, 9, 22], [8, 1, 60]]
    alone = engine.generate(prompts, params, mode=mode)
    inside = engine.on_forward_thread(engine.generate, prompts, params, mode=mode)  # as train-drafter does
    assert [r.token_ids for r in inside] == [r.token_ids for r in alone]
    assert log.threads == {engine.on_forward_thread(threading.get_ident)}


def test_a_forward_thread_runs_nested_calls_inline_instead_of_deadlocking():
    thread = ForwardThread()
    outer = thread.call(lambda: (threading.get_ident(), thread.call(threading.get_ident)))
    assert outer[0] == outer[1] != threading.get_ident()
    with pytest.raises(ValueError, match="inner"):
        thread.call(lambda: thread.call(_raise))


def _raise():
    raise ValueError("inner")


def test_deferred_work_queues_behind_earlier_work_even_from_the_thread_itself():
    """A step loop queues its next step with `defer`: it must not run inline on the thread (submit does,
    to avoid deadlock) but after the work queued before it, so other work takes its turn between steps."""
    thread = ForwardThread()
    order, done = [], threading.Event()

    def step(n):
        order.append(f"step {n}")
        if n < 2:
            thread.defer(step, n + 1)
            thread.pool.submit(order.append, f"other {n}")  # queued behind the next step
        else:
            done.set()

    thread.defer(step, 0)
    assert done.wait(5)
    thread.call(lambda: None)  # drain
    assert order == ["step 0", "step 1", "other 0", "step 2", "other 1"]


def test_a_policy_that_calibrates_is_built_once_on_the_forward_thread(monkeypatch, tmp_path):
    """`auto` calibrates forward costs when first built: its forwards ran on the caller's thread (beside
    the step loop's, and leaving that thread an OpenMP team), and two callers' first calls built it twice."""
    from seed_tot.engine import policies

    monkeypatch.setenv("SEED_TOT_CACHE_DIR", str(tmp_path))  # an empty cache: the first build calibrates
    target = tiny_model("llama", seed=4)
    draft = noisy_copy(target, 0.01)
    log = ThreadLog(target, draft)
    engine = Engine(target, draft)
    built = []
    real = policies.make_policy

    def counted(*args, **kwargs):
        built.append(threading.get_ident())
        return real(*args, **kwargs)

    monkeypatch.setattr(policies, "make_policy", counted)
    params = SamplingParams(max_new_tokens=4, temperature=0)
    with ThreadPoolExecutor(2) as callers:
        list(callers.map(lambda _: engine.generate([[3, 17, 4]], params, mode="sd", draft_policy="auto"), range(2)))
    assert len(built) == 1 and (tmp_path / "calibration.json").is_file()
    assert log.threads == {engine.forward_thread._ident} and built[0] == engine.forward_thread._ident


def test_the_forward_thread_of_an_engine_that_is_gone_ends():
    """Every engine on a CPU owns a thread (and an OpenMP team once it runs a forward): once the
    engine is gone its thread must end too, or a process that builds engine after engine (a test
    suite, a benchmark's runs) piles threads up until it cannot start one more."""
    import gc

    target = tiny_model("llama", seed=4)
    engine = Engine(target, noisy_copy(target, 0.01))
    engine.generate([[3, 17, 4, 9]], SamplingParams(max_new_tokens=4, temperature=0), mode="seed")
    ident = engine.forward_thread._ident
    worker = next(t for t in threading.enumerate() if t.ident == ident)
    del engine
    # the step loop's last deferred step may still hold the engine when generate returns, and the
    # engine and its scheduler refer to each other: collect until that step is done, as a later
    # automatic collection would; a thread the engine's pool keeps alive never ends
    deadline = time.monotonic() + 30
    while worker.is_alive() and time.monotonic() < deadline:
        gc.collect()
        worker.join(timeout=0.1)
    assert not worker.is_alive()
