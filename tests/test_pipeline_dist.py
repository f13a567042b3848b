"""The real multi-process pipeline (torch.distributed, gloo): equal to the simulation, clean failures."""
from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import threading
import time

import pytest

from conftest import noisy_copy, tiny_model
from seed_tot import SamplingParams
from seed_tot.engine.pipeline import ModelSource, PipelineConfig, launch, simulate

PROMPTS = [[5, 9, 13, 2, 7], [4, 8]]


@pytest.fixture(scope="module")
def pair():
    target = tiny_model("llama", layers=3)
    return target, noisy_copy(target, 0.01)


def _same(sim, real):
    assert [o.result.token_ids for o in real] == [o.result.token_ids for o in sim]
    assert [o.stats.to_dict() for o in real] == [o.stats.to_dict() for o in sim]  # ticks, hits, forwards per rank


@pytest.mark.parametrize("mode,temperature", [("pipedec", 0.0), ("pipedec", 0.9), ("stpp", 0.9), ("pp", 0.0)])
def test_three_stage_gloo_run_equals_simulation_in_tokens_and_ticks(pair, mode, temperature):
    target, draft = pair
    params = SamplingParams(max_new_tokens=8, temperature=temperature, seed=5)
    cfg = PipelineConfig(mode=mode, n_stages=3, width=3, children=2, k_config=(2, 1))
    sim = simulate(target, draft, PROMPTS, params, cfg, 96)
    real = launch(ModelSource(target, draft), PROMPTS, params, cfg, 96, target_layers=3, timeout_s=60)
    _same(sim, real)
    assert multiprocessing.active_children() == []


def test_killed_stage_is_a_clear_error_within_the_timeout_and_leaves_no_process(pair):
    target, draft = pair
    params = SamplingParams(max_new_tokens=1500, temperature=0)
    cfg = PipelineConfig(mode="pipedec", n_stages=3, width=2, children=2)
    outcome = {}

    def run():
        try:
            launch(ModelSource(target, draft), [PROMPTS[0]], params, cfg, 96, target_layers=3, timeout_s=60)
        except RuntimeError as err:
            outcome["error"] = str(err)

    thread = threading.Thread(target=run)
    start = time.monotonic()
    thread.start()
    while len(multiprocessing.active_children()) < 4 and time.monotonic() - start < 30:
        time.sleep(0.05)
    time.sleep(0.2)  # let the ranks meet and start ticking
    victim = sorted(p.pid for p in multiprocessing.active_children())[2]
    os.kill(victim, signal.SIGKILL)
    thread.join(timeout=45)
    assert not thread.is_alive(), "the driver did not notice the dead stage"
    assert "died (SIGKILL)" in outcome["error"] and "rank" in outcome["error"]
    assert multiprocessing.active_children() == []



def test_outputs_larger_than_a_pipe_buffer_come_back(pair, monkeypatch):
    """Rank 0 hands its outputs to the launcher through a pipe, and the launcher read them only once every rank
    had exited: past 64 KiB rank 0's put waited for a reader that waited for it, until the timeout."""
    from seed_tot.engine.pipeline import launcher

    big = ["x" * (1 << 20)]  # what many prompts' or long outputs' results weigh, without generating them

    def run_rank(rank, *job):  # a forked rank runs this in place of the pipeline
        return big if rank == 0 else []

    monkeypatch.setattr(launcher, "run_rank", run_rank)
    target, draft = pair
    out = launch(ModelSource(target, draft), PROMPTS, SamplingParams(max_new_tokens=2), PipelineConfig(n_stages=2),
                 96, target_layers=3, timeout_s=30, start_method="fork")
    assert out == big
    assert multiprocessing.active_children() == []


def test_port_in_use_is_a_clear_error(pair):
    target, draft = pair
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ValueError, match=f"port {port} on 127.0.0.1 is already in use"):
            launch(ModelSource(target, draft), PROMPTS, SamplingParams(max_new_tokens=2), PipelineConfig(n_stages=2),
                   96, target_layers=3, port=port)


def test_more_stages_than_layers_fails_before_any_process_starts(pair):
    target, draft = pair
    with pytest.raises(ValueError, match="3 decoder layers into 4 stages"):
        launch(ModelSource(target, draft), PROMPTS, SamplingParams(max_new_tokens=2), PipelineConfig(n_stages=4),
               96, target_layers=3)
    assert multiprocessing.active_children() == []
