"""--trace and bench's table give a mode one target-busy figure (GenerationStats.target_busy_fraction
over the mode's runs), and --trace names every file it wrote and why gpu.csv can be empty."""
from __future__ import annotations

import pytest

from seed_tot.bench import ModeReport, ModeSpec, RunOutput
from seed_tot.bench_report import summarize_reports
from seed_tot.engine.decode_spec import DecodeSpec
from seed_tot.engine.params import GenerationStats
from seed_tot.trace import TraceRecorder, _Call

# two timed runs per mode, in rounds as bench runs them: (label, run start, run end, target busy seconds)
RUNS = [("parallel", 0.0, 1.0, 0.99), ("seed", 1.0, 3.0, 1.2), ("parallel", 3.0, 4.5, 1.4), ("seed", 4.5, 6.0, 0.9)]


def _recorder_of_runs(tmp_path) -> TraceRecorder:
    recorder = TraceRecorder(tmp_path, "bench")
    for i, (label, start, end, busy) in enumerate(RUNS):
        # each run: two calls with a gap between them (prompt building), inside the run's section
        middle = (start + end) / 2
        for lo, hi in ((start + 0.01, middle - 0.05), (middle, end - 0.01)):
            stats = GenerationStats(target_busy_s=busy / 2, wall_s=hi - lo)
            recorder.calls.append(_Call(label, lo, hi, None, stats))
        recorder.sections.append((f"{label} run {i // 2 + 1}", start, end))
    return recorder


def _table_rows() -> dict[str, dict]:
    reports = {}
    for label, start, end, busy in RUNS:
        report = reports.setdefault(label, ModeReport(ModeSpec(label, DecodeSpec(label, verify_batch="all"))))
        report.runs.append(RunOutput(end - start, GenerationStats(target_busy_s=busy, wall_s=end - start), [], None))
    rows = summarize_reports(list(reports.values()), greedy=False, synthetic=None, tot=False)
    return {row["label"]: row for row in rows}


def test_the_trace_and_the_bench_table_give_a_mode_the_same_target_busy(tmp_path):
    recorder, rows = _recorder_of_runs(tmp_path), _table_rows()
    for label in ("parallel", "seed"):
        assert recorder.target_busy_fraction(label) == pytest.approx(rows[label]["target_busy_fraction"])
    assert recorder.target_busy_fraction("parallel") == pytest.approx((0.99 + 1.4) / 2.5)


def test_without_sections_a_modes_run_is_the_span_of_its_calls(tmp_path):
    recorder = TraceRecorder(tmp_path, "generate")
    recorder.calls.append(_Call("seed", 2.0, 2.5, None, GenerationStats(target_busy_s=0.4, wall_s=0.5)))
    assert recorder.target_busy_fraction("seed") == pytest.approx(0.8)


def test_each_panel_title_carries_the_tables_target_busy_over_every_run(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure
    titles = []
    monkeypatch.setattr(Figure, "savefig", lambda fig, path, **kw: titles.extend(ax.get_title() for ax in fig.axes))
    recorder, rows = _recorder_of_runs(tmp_path), _table_rows()
    recorder.finish()
    assert [t.split(":")[0] for t in titles] == ["parallel", "seed"]
    for title, label in zip(titles, ("parallel", "seed")):
        assert f"{rows[label]['target_busy_fraction']:.0%} over every run" in title


def test_trace_names_the_png_and_the_csv_and_says_why_the_csv_is_empty(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)  # a machine without a GPU
    recorder = _recorder_of_runs(tmp_path)
    recorder.start()
    recorder.finish()
    line = recorder.written()
    for name in ("trace.json", "utilization.png", "gpu.csv"):
        assert str(tmp_path / name) in line
    assert "gpu.csv (header only: no GPU sampled, no CUDA device)" in line


def test_a_csv_with_gpu_samples_is_not_called_empty(tmp_path):
    recorder = _recorder_of_runs(tmp_path)
    recorder.sampler.samples.append((0.1, 50.0, 1024.0))
    recorder.finish()
    assert recorder.written().endswith(str(tmp_path / "gpu.csv"))
