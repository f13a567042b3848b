"""--trace shows prompt scoring as the target's work: a call's prefill span lasts as long as the
prefill forwards did, it counts in the target's busy curve, and a utilization.png panel's title
gives the busy fraction its own curve shows."""
from __future__ import annotations

import re

import pytest
import torch

from seed_tot import SamplingParams
from seed_tot.engine.params import GenerationStats
from seed_tot.synthetic import build_synthetic_engine
from seed_tot.trace import TID_TARGET, TraceRecorder, _Call

PARAMS = SamplingParams(max_new_tokens=8, temperature=0)


def _verify(start: float, end: float) -> dict:
    return {"type": "verify", "worker": 0, "start": start, "end": end, "enqueued": start, "accepted": 1,
            "resampled": False, "batch": 1}


def _long_prefill_call(recorder: TraceRecorder) -> _Call:
    """The reported shape: a call over [0, 4] s whose first second is the target scoring its prompts,
    then verifications that keep it busy to the end."""
    events = [{"type": "start", "t": 0.0, "clock": recorder.t0},
              {"type": "prefill", "model": "target", "start": 0.0, "end": 1.0, "prompts": 3},
              *[_verify(1.0 + 0.5 * i, 1.5 + 0.5 * i) for i in range(6)]]
    stats = GenerationStats(target_busy_s=4.0, target_prefill_s=1.0, wall_s=4.0)
    return _Call("seed", 0.0, 4.0, None, stats, events)


def test_a_real_calls_prefill_span_lasts_as_long_as_its_prompt_scoring(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    engine = build_synthetic_engine("tiny", 0.8, "cpu")
    recorder = TraceRecorder(tmp_path, "prefill")
    recorder.start()
    long_prompt = list(range(1, 200))  # enough prompt to score that its forward is not a rounding error
    recorder.wrap(engine).generate([long_prompt] * 3, PARAMS, mode="seed", k_config=(1, 1))
    call = recorder.calls[0]
    spans = [e for e in recorder._call_events(call) if e["ph"] == "X" and e["tid"] == TID_TARGET]
    prefill = [e for e in spans if e["name"].startswith("target prefill")]
    verify = [e for e in spans if e["name"].startswith("verify")]
    assert len(prefill) == 1 and verify
    # timed around the forwards whose busy time the stats report, so never shorter than it
    assert prefill[0]["dur"] >= 0.99 * call.stats.target_prefill_s * 1e6 > 0
    assert call.start * 1e6 <= prefill[0]["ts"] and prefill[0]["ts"] + prefill[0]["dur"] <= min(v["ts"] for v in verify)


def test_prompt_scoring_counts_in_the_target_busy_curve(tmp_path):
    recorder = TraceRecorder(tmp_path, "busy")
    xs, busy = recorder.busy_series([_long_prefill_call(recorder)])
    scoring = [b for x, b in zip(xs, busy) if x < 1.0]
    assert scoring and min(scoring) == pytest.approx(1.0)  # the target scoring prompts is busy, not idle
    assert recorder.curve_busy([_long_prefill_call(recorder)]) == pytest.approx(1.0)


def test_a_panel_title_gives_the_busy_fraction_its_curve_shows(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    panels = []

    def capture(fig, path, **kwargs):
        for ax in fig.axes:
            line = ax.lines[0]
            panels.append((ax.get_title(), list(line.get_xdata()), list(line.get_ydata())))

    monkeypatch.setattr(Figure, "savefig", capture)
    recorder = TraceRecorder(tmp_path, "title")
    recorder.start()
    recorder.calls.append(_long_prefill_call(recorder))
    half_idle = _long_prefill_call(recorder)  # a second mode: busy for half its wall time
    half_idle.label, half_idle.stats = "parallel", GenerationStats(target_busy_s=2.0, target_prefill_s=0.5, wall_s=4.0)
    half_idle.start, half_idle.end = 4.0, 8.0
    recorder.calls.append(half_idle)
    recorder.finish()
    assert len(panels) == 2
    for title, xs, ys in panels:
        stop = 4.0
        widths = [min(b - a, stop - a) for a, b in zip(xs, xs[1:] + [stop])]
        curve_mean = sum(y * w for y, w in zip(ys, widths)) / stop
        shown = int(re.search(r"target busy (\d+)%", title).group(1))  # the first busy figure: the headline
        assert shown == round(curve_mean), (title, curve_mean)
