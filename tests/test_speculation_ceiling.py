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


def test_points_price_forwards_in_milliseconds_by_query_tokens(ceiling):
    _, costs = ceiling.from_points("target=1:8.0,9:10.0;draft=1:1.0")
    assert costs.target(1) == pytest.approx(8e-3)
    assert costs.target(5) == pytest.approx(9e-3)  # read between the measured sizes
    assert costs.draft(1) == costs.draft(9) == pytest.approx(1e-3)  # one draft point: flat
    _, free = ceiling.from_points("target=1:8.0,9:10.0")
    assert free.draft(4) == 0.0  # no draft= part: a free draft


def test_a_free_draft_bounds_what_speculation_gives_over_parallel(ceiling):
    # every row of a round accepts a draft token with probability alpha; a free draft and a verification
    # costing what one token costs would give (1 - alpha^(K+1)) / (1 - alpha) tokens per row per round
    _, flat = ceiling.from_points("target=1:10.0,64:10.0")
    ratio, plan = ceiling.ceiling(flat, 0.5, 4, max_len=3)
    assert plan == [3] * 4 and ratio == pytest.approx((1 - 0.5 ** 4) / 0.5)
    _, costly = ceiling.from_points("target=1:10.0,64:10.0;draft=1:5.0")
    assert ceiling.ceiling(costly, 0.5, 4, max_len=3)[0] < ratio


@pytest.mark.parametrize("text", ["target=1:8.0", "target=1-8.0,2:9", "drafts=1:1;target=1:1,2:2"])
def test_malformed_points_name_what_was_expected(ceiling, text):
    with pytest.raises(SystemExit, match="--points"):
        ceiling.from_points(text)


def test_the_drafts_prefill_is_paid_on_top_of_the_decode_ratio(ceiling):
    # the 2026-11-26 (956e5da) entry's Qwen tot-step: target prompts 53% of parallel's wall, the 0.5B's prompts 17% more
    assert ceiling.over_workload(1.18, 0.53, 0.17) == pytest.approx(1 / (0.53 + 0.47 / 1.18 + 0.17))
    assert ceiling.over_workload(1.18, 0.53, 0.17) < 1.0 < ceiling.over_workload(1.18, 0.53)
    assert ceiling.over_workload(1.5, 0.0, 0.0) == pytest.approx(1.5)
