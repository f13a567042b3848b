"""--trace: Chrome trace JSON with worker, verifier, queue and call tracks; GPU counters via NVML or an
explicit "unavailable"; gpu.csv; the utilization figure."""
from __future__ import annotations

import csv
import json
import logging
import sys
import time
import types

import pytest
import torch

from seed_tot import SamplingParams
from seed_tot import trace as trace_module
from seed_tot.engine.params import GenerationStats
from seed_tot.synthetic import build_synthetic_engine
from seed_tot.trace import NO_GPU_LABEL, TID_CALLS, TID_TARGET, TID_WORKER0, TraceRecorder, _Call

PARAMS = SamplingParams(max_new_tokens=12, temperature=0)


@pytest.fixture(scope="module")
def engine():
    return build_synthetic_engine("tiny", 0.8, "cpu")


@pytest.fixture
def no_gpu(monkeypatch):
    """Behave as a machine without a GPU even where one exists."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def _record(tmp_path, engine, modes=("seed", "ar")):
    recorder = TraceRecorder(tmp_path, "test")
    recorder.start()
    traced = recorder.wrap(engine)
    for mode in modes:
        traced.generate([[1, 2, 3]] * 3, PARAMS, mode=mode, k_config=(1, 1, 1))
    return recorder, recorder.finish()


def _thread_names(events):
    return {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}


def test_trace_json_is_chrome_format_with_worker_verifier_queue_and_call_tracks(tmp_path, engine, no_gpu):
    _, path = _record(tmp_path, engine)
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    assert all(e["ph"] in ("X", "M", "C", "i") and "pid" in e and "name" in e for e in events)
    for e in events:
        if e["ph"] in ("X", "C", "i"):
            assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0
        if e["ph"] == "X":
            assert e["dur"] >= 0 and "tid" in e
    names = _thread_names(events)
    assert [names[TID_WORKER0 + w] for w in range(3)] == ["draft worker 0", "draft worker 1", "draft worker 2"]
    assert names[TID_TARGET] == "target verifier"
    spans = [e for e in events if e["ph"] == "X"]
    calls = [e for e in spans if e["tid"] == TID_CALLS]
    assert [c["args"]["mode"] for c in calls] == ["seed", "ar"]
    assert "3 prompts, same prompt" in calls[0]["name"]
    assert any(e["ph"] == "C" and e["name"] == "verify queue length" for e in events)
    # every call's worker and verify spans lie inside its own wall-clock span (its events were aligned to
    # it); a call's spans follow its call span in the trace
    slack = 1e3  # microseconds of rounding
    inner_of = {id(c): [] for c in calls}
    current = None
    for e in spans:
        if e["tid"] == TID_CALLS:
            current = e
        elif e["tid"] >= TID_WORKER0 or e["name"].startswith("verify"):
            inner_of[id(current)].append(e)
    for call in calls:
        inner = inner_of[id(call)]
        assert inner and any(e["name"].startswith("verify") for e in inner)
        for e in inner:
            assert call["ts"] - slack <= e["ts"] and e["ts"] + e["dur"] <= call["ts"] + call["dur"] + slack
    # ar runs one row of its call at a time: each of its target forwards verifies one worker
    assert all(len(e["args"]["workers"]) == 1 for e in inner_of[id(calls[1])] if e["name"].startswith("verify"))


def test_a_batched_verification_is_one_span_naming_every_row_it_verified(tmp_path, engine, no_gpu):
    # each row of a batched forward records its own end (read as it is committed); the trace drew one
    # "verify x1" per row, overlapping on the verifier track, instead of one "verify x3"
    recorder = TraceRecorder(tmp_path, "batched")
    recorder.start()
    results = recorder.wrap(engine).generate([[1, 2, 3]] * 3, PARAMS, mode="seed", verify_batch="all")
    events = results[0].stats.events
    path = recorder.finish()
    verifies = [e for e in events if e["type"] == "verify"]
    assert max(e["batch"] for e in verifies) == 3  # the engine did verify three rows in one forward
    spans = sorted((e for e in json.loads(path.read_text())["traceEvents"]
                    if e["ph"] == "X" and e["tid"] == TID_TARGET and e["name"].startswith("verify")),
                   key=lambda e: e["ts"])
    # one span per target forward: the rows it lists are the rows the engine verified in it
    assert sorted(len(e["args"]["workers"]) for e in spans) == sorted(
        len([v for v in verifies if v["start"] == start]) for start in {v["start"] for v in verifies})
    assert all(e["name"] == f"verify x{len(e['args']['workers'])}" for e in spans)
    assert any(len(e["args"]["workers"]) == 3 for e in spans)
    # slices on one track nest or follow each other (the Chrome format has no partial overlap)
    for a, b in zip(spans, spans[1:]):
        assert a["ts"] + a["dur"] <= b["ts"] + 1e-6


def test_without_a_gpu_the_trace_says_sampling_is_unavailable(tmp_path, engine, no_gpu, caplog):
    with caplog.at_level(logging.WARNING, logger="seed_tot.trace"):
        _, path = _record(tmp_path, engine, modes=("ar",))
    trace = json.loads(path.read_text())
    assert trace["otherData"]["gpu_sampling"].startswith("unavailable")
    assert any(e["ph"] == "i" and e["name"] == "GPU sampling unavailable" for e in trace["traceEvents"])
    assert not any(e["ph"] == "C" and e["name"].startswith("GPU") for e in trace["traceEvents"])
    assert "GPU sampling unavailable" in caplog.text
    rows = list(csv.reader((tmp_path / "gpu.csv").open()))
    assert rows == [["t_s", "util_percent", "mem_used_mib"]]


def test_without_pynvml_sampling_is_unavailable_not_an_error(tmp_path, engine, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU machine that lacks only pynvml
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml now raises ImportError
    recorder, path = _record(tmp_path, engine, modes=("ar",))
    assert "pip install nvidia-ml-py" in json.loads(path.read_text())["otherData"]["gpu_sampling"]


def test_without_a_gpu_the_trace_does_not_ask_for_pynvml(tmp_path, engine, no_gpu, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # a CPU machine: pynvml is usually absent too
    with caplog.at_level(logging.WARNING, logger="seed_tot.trace"):
        recorder, path = _record(tmp_path, engine, modes=("ar",))
    assert json.loads(path.read_text())["otherData"]["gpu_sampling"] == "unavailable: no CUDA device"
    assert "pynvml" not in caplog.text and "pynvml" not in recorder.written()


def _fake_pynvml(util: int = 73, used_mib: int = 2048) -> types.ModuleType:
    nvml = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    nvml.NVMLError = NVMLError
    nvml.nvmlInit = lambda: None
    nvml.nvmlShutdown = lambda: None
    nvml.nvmlDeviceGetName = lambda handle: "Fake GPU"
    nvml.nvmlDeviceGetUtilizationRates = lambda handle: types.SimpleNamespace(gpu=util)
    nvml.nvmlDeviceGetMemoryInfo = lambda handle: types.SimpleNamespace(used=used_mib * 2**20)
    return nvml


def test_gpu_samples_at_20hz_or_more_become_counters_csv_rows_and_the_plot(tmp_path, engine, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(trace_module, "_nvml_handle", lambda pynvml, torch: "handle")
    recorder = TraceRecorder(tmp_path, "gpu")
    recorder.start()
    recorder.wrap(engine).generate([[5, 6]], PARAMS, mode="ar")
    time.sleep(0.5)
    path = recorder.finish()
    samples = recorder.sampler.samples
    gaps = sorted(b[0] - a[0] for a, b in zip(samples, samples[1:]))
    assert len(samples) >= 5 and gaps[len(gaps) // 2] <= 1 / 20
    trace = json.loads(path.read_text())
    util = [e for e in trace["traceEvents"] if e["ph"] == "C" and e["name"] == "GPU utilization (%)"]
    mem = [e for e in trace["traceEvents"] if e["ph"] == "C" and e["name"] == "GPU memory used (MiB)"]
    assert len(util) == len(mem) == len(samples) and util[0]["args"]["util"] == 73
    assert mem[0]["args"]["MiB"] == 2048
    rows = list(csv.DictReader((tmp_path / "gpu.csv").open()))
    assert len(rows) == len(samples) and float(rows[0]["util_percent"]) == 73
    assert trace["otherData"]["gpu"] == "Fake GPU"
    assert (tmp_path / "utilization.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_png_has_one_panel_per_mode_labelled_as_engine_busy_without_gpu(tmp_path, engine, no_gpu, monkeypatch):
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure
    saved = []
    real_savefig = Figure.savefig

    def spy(fig, path, **kwargs):
        saved.append([(ax.get_title(), ax.get_ylabel()) for ax in fig.axes])
        return real_savefig(fig, path, **kwargs)

    monkeypatch.setattr(Figure, "savefig", spy)
    _record(tmp_path, engine, modes=("seed", "ar", "sd"))
    png = (tmp_path / "utilization.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    (panels,) = saved
    assert [title.split(":")[0] for title, _ in panels] == ["seed", "ar", "sd"]
    assert all(ylabel == NO_GPU_LABEL for _, ylabel in panels)


def test_without_matplotlib_the_png_is_skipped_with_a_warning(tmp_path, engine, no_gpu, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    with caplog.at_level(logging.WARNING, logger="seed_tot.trace"):
        _, path = _record(tmp_path, engine, modes=("ar",))
    assert path.is_file() and not (tmp_path / "utilization.png").exists()
    assert "matplotlib is not installed" in caplog.text


def test_seed_events_are_placed_at_the_schedulers_recorded_clock(tmp_path):
    recorder = TraceRecorder(tmp_path, "clock")
    # the scheduler started 0.25 s into a call spanning [1.0, 2.0]; its one verification took 0.1 s.
    # Aligning the last event to the call's end would put it at 1.9 s; the clock says 1.25 s.
    events = [{"type": "start", "t": 0.0, "clock": recorder.t0 + 1.25},
              {"type": "verify", "worker": 0, "start": 0.0, "end": 0.1, "enqueued": 0.0, "accepted": 1,
               "resampled": False, "batch": 1}]
    call = _Call("seed", 1.0, 2.0, None, GenerationStats(target_busy_s=0.35, wall_s=1.0), events)
    spans = [e for e in recorder._call_events(call) if e["ph"] == "X" and e["tid"] == TID_TARGET]
    assert [(e["name"], e["ts"], e["dur"]) for e in spans] == [
        ("call setup", 1.0e6, 0.25e6), ("verify x1", 1.25e6, 0.1e6)]


def test_busy_fraction_is_the_share_of_each_bin_spent_verifying(tmp_path):
    recorder = TraceRecorder(tmp_path, "bins")
    # verify spans cover [0.00, 0.05) fully and half of [0.05, 0.10); then idle until 0.20
    events = [{"type": "verify", "worker": 0, "start": 0.0, "end": 0.05, "enqueued": 0.0, "accepted": 1,
               "resampled": False, "batch": 1},
              {"type": "verify", "worker": 1, "start": 0.05, "end": 0.075, "enqueued": 0.0, "accepted": 1,
               "resampled": False, "batch": 1},
              {"type": "draft", "worker": 0, "start": 0.1, "end": 0.2, "tokens": 3}]
    stats = GenerationStats(target_busy_s=0.075, wall_s=0.2)
    call = _Call("seed", 1.0, 1.2, None, stats, events)
    _, busy = recorder.busy_series([call])
    assert busy[:4] == pytest.approx([1.0, 0.5, 0.0, 0.0], abs=1e-6)


def test_verify_spans_longer_than_the_measured_target_time_are_scaled_to_it(tmp_path):
    recorder = TraceRecorder(tmp_path, "scaled")
    events = [{"type": "verify", "worker": 0, "start": 0.0, "end": 0.1, "enqueued": 0.0, "accepted": 1,
               "resampled": False, "batch": 1}]
    call = _Call("seed", 0.0, 0.1, None, GenerationStats(target_busy_s=0.025, wall_s=0.1), events)
    _, busy = recorder.busy_series([call])
    assert busy == pytest.approx([0.25, 0.25], abs=1e-6)


def test_non_seed_calls_count_at_their_measured_busy_fraction(tmp_path):
    recorder = TraceRecorder(tmp_path, "flat")
    call = _Call("sd", 0.0, 0.2, None, GenerationStats(target_busy_s=0.08, wall_s=0.2))
    _, busy = recorder.busy_series([call])
    assert busy == pytest.approx([0.4] * len(busy), abs=1e-6)


def test_a_call_added_without_times_spans_its_measured_wall_time(tmp_path, engine, no_gpu):
    recorder = TraceRecorder(tmp_path, "generate")
    recorder.start()
    results = engine.generate([[3, 4]], PARAMS, mode="sd")
    recorder.add_call("sd", results)  # what `seed-tot generate --trace` does
    call = recorder.calls[0]
    assert call.end - call.start == pytest.approx(results[0].stats.wall_s)
    assert call.start >= -1e-3  # it began after the recorder started, not before
