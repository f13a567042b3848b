"""On a CPU every forward of an engine (prefill, drafts, verification, every mode, concurrent callers)
runs on the engine's one forward thread (engine/forward_thread.py says why)."""
from __future__ import annotations

import threading
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


def test_a_forward_thread_runs_nested_calls_inline_instead_of_deadlocking():
    thread = ForwardThread()
    outer = thread.call(lambda: (threading.get_ident(), thread.call(threading.get_ident)))
    assert outer[0] == outer[1] != threading.get_ident()
    with pytest.raises(ValueError, match="inner"):
        thread.call(lambda: thread.call(_raise))


def _raise():
    raise ValueError("inner")
