"""benchmarks/speculation_ceiling.py's whole-workload pricing: prompt scoring, which no draft
shortens, caps what a decode speedup gives a ToT workload (Amdahl's law)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "speculation_ceiling.py"


@pytest.fixture(scope="module")
def ceiling():
    spec = importlib.util.spec_from_file_location("speculation_ceiling", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_without_prompt_scoring_the_workload_gains_what_decoding_gains(ceiling):
    assert ceiling.over_workload(1.7, 0.0) == pytest.approx(1.7)


def test_prompt_scoring_caps_the_workload_below_the_decode_gain(ceiling):
    # a prompt-heavy ToT workload (58% of the baseline's wall scoring prompts, as on the Qwen tot-step):
    # even an unbounded decode speedup cannot beat 1 / 0.58
    assert ceiling.over_workload(1.72, 0.58) == pytest.approx(1 / (0.58 + 0.42 / 1.72))
    assert ceiling.over_workload(1e9, 0.58) == pytest.approx(1 / 0.58)  # even a free, instant decode
    assert ceiling.over_workload(1.0, 0.58) == pytest.approx(1.0)  # no gain stays no gain
    assert ceiling.over_workload(0.8, 0.3) > 0.8  # a loss shrinks too, toward 1
