"""A calibration timed on a busy machine is used for its run but not cached (cost_model.contention)."""
from __future__ import annotations

import json
import logging

import pytest

from seed_tot import Engine
from seed_tot.engine import cost_model
from seed_tot.engine.cost_model import Calibration, Costs, contention, load_costs

COSTS = Costs(target_fixed_s=0.01, target_per_token_s=0.001, draft_step_s=0.002)
QUIET = [[0.0100, 0.0102, 0.0101], [0.0200, 0.0203, 0.0201]]


@pytest.fixture(autouse=True)
def contention_rule(monkeypatch):
    """The rule itself (conftest counts every calibration of the suite as quiet)."""
    monkeypatch.setattr(cost_model, "CONTENTION_MIN_FORWARD_S", 1e-3)


@pytest.mark.parametrize("repeats, others_busy, threads, busy", [
    (QUIET, 0.0, 2, None),                                         # steady repeats, idle machine
    (QUIET, 1.1, 2, "other processes kept 1.1 of 2 cores busy"),  # a neighbour all along: slow but steady
    (QUIET, 1.1, None, "kept 1.1 of 2"),                           # threads not known: all cores ours
    (QUIET, 0.9, 1, None),                # one thread timed on the core the neighbour left free
    (QUIET, 1.6, 1, "beside this one's 1 thread(s)"),                # ... unless it did not leave one
    ([[0.010, 0.019, 0.011], [0.020, 0.041, 0.030]], 0.0, 2, "differed by"),  # a busy stretch now and then
    ([[0.0002, 0.0009, 0.0004]], 1.5, 2, None),  # sub-millisecond forwards: the best of the repeats is undisturbed
])
def test_contention_from_load_and_the_spread_of_repeats(repeats, others_busy, threads, busy):
    found = contention(repeats, others_busy, 2, threads)
    assert found is None if busy is None else busy in found


def _measured(engine, busy: float, repeats):
    return lambda *a, **k: Calibration(COSTS, {("target", n): times for n, times in enumerate(repeats)}, busy, 2, 2)


def test_a_contended_calibration_serves_its_run_and_is_not_cached(tmp_path, monkeypatch, llama_pair, caplog):
    monkeypatch.setenv("SEED_TOT_CACHE_DIR", str(tmp_path))
    engine = Engine(*llama_pair)
    monkeypatch.setattr(cost_model, "measure", _measured(engine, 1.1, QUIET))
    with caplog.at_level(logging.WARNING, logger="seed_tot.engine.cost_model"):
        assert load_costs(engine) == COSTS
    assert not (tmp_path / "calibration.json").exists()
    warning, = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "busy machine" in warning and "not cached" in warning and "recalibrate=true" in warning
    # a quiet one is cached (the same path, so the refusal above is the contention's doing)
    monkeypatch.setattr(cost_model, "measure", _measured(engine, 0.0, QUIET))
    load_costs(engine)
    assert len(json.loads((tmp_path / "calibration.json").read_text())) == 1
