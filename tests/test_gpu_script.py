"""benchmarks/gpu.sh --smoke: the GPU benchmark's steps, on the tiny preset on the CPU, without
`datasets` installed, report a row for every mode of every step as that mode finishes, after the step
table's figures (eager, graphed and compiled per bucket, with compile times)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEED_MODES = ["ar", "parallel", "seed", "sd", "seed@db1@vb1"]
REPLAY_MODES = ["parallel", "seed+choose", "seed+suffix", "seed"]
# in gpu.sh's order
STEPS = {"thoughts": SPEED_MODES, "tot-step": SPEED_MODES, "tot-step-other-schedule": ["parallel", "seed"],
         # the replay-* preset: the target replays a recorded real run, so text drafts see real text
         "replay-tot-step": REPLAY_MODES,
         "tot-gsm8k": ["parallel", "seed", "parallel@c4", "seed@c4"], "replay-tot-gsm8k": REPLAY_MODES}


def test_smoke_reports_every_mode_of_every_step_with_reference_outputs_and_no_datasets(tmp_path):
    # a `datasets` that cannot be imported, as on the GPU image: the local GSM8K JSONL must load without it
    blocked = tmp_path / "no-datasets" / "datasets"
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text("raise ImportError('datasets is not installed on this image')\n")
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable,
           "PYTHONPATH": os.pathsep.join(p for p in (str(blocked.parent), os.environ.get("PYTHONPATH")) if p),
           # no time cap here: a loaded CI machine must not turn a slow step into missing rows
           "CAP_S": "1500"}
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu.sh"), "--smoke"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=3000)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    for step, labels in STEPS.items():
        for label in labels:
            assert f"{_workload(step)}: {label} after run 1 of 1" in proc.stdout  # printed as soon as it ran
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    expected = [(_workload(step), label) for step, labels in STEPS.items() for label in labels]
    assert [(r["workload"], r["label"]) for r in rows] == expected
    # greedy: every mode reproduces the reference's tokens (thoughts, tot-step) or predictions (tot-gsm8k)
    assert all(r["matches_ar"] for r in rows), [(r["workload"], r["label"]) for r in rows if not r["matches_ar"]]
    for step in STEPS:  # each step's whole JSON document too, not only the streamed rows
        document = json.loads((out / f"{step}.json").read_text())
        assert [m["label"] for m in document["modes"]] == STEPS[step]
        assert ("replaying" in document["target"]) == step.startswith("replay-")
    # each mode's printed row carries the target's busy share (the SEED paper's Fig. 4 figure)
    assert proc.stdout.count("target busy") >= len(STEPS) and all("target_busy_fraction" in r for r in rows)
    # the A/B step of the step loop's schedules: the same workload, the other schedule (draft_stream.py)
    steps = [step for step, labels in STEPS.items() for _ in labels]  # each row's gpu.sh step, in order
    turns = [r for step, r in zip(steps, rows) if r["label"] == "seed" and _workload(step) == "tot-step"
             and not step.startswith("replay-")]
    assert len(turns) == 2 and turns[0]["overlap_drafting"] != turns[1]["overlap_drafting"]
    assert_step_table(proc.stdout, out / "step-table.jsonl")
    # then both attention paths, eager and at fixed shapes, each figure as it is measured, tokens equal
    pooled = [json.loads(line) for line in (out / "pool-attention.jsonl").read_text().splitlines()][1:]
    assert {(f["attention"], f["kind"]) for f in pooled} == {(a, k) for a in ("gather", "pool") for k in ("decode", "tree4")}
    assert all(f["same_tokens"] and f["eager_ms"] > 0 and f["graphed_ms"] > 0 for f in pooled)
    assert stdout_order(proc.stdout, "== step-table", "== pool-attention", "== thoughts")


def stdout_order(stdout: str, *markers: str) -> bool:
    return [stdout.index(m) for m in markers] == sorted(stdout.index(m) for m in markers)


def _workload(step: str) -> str:
    """The bench workload a gpu.sh step runs: a replay-* step runs its workload on the replay preset, and
    tot-step-other-schedule runs tot-step with the step loop's other schedule."""
    return step.removeprefix("replay-").removesuffix("-other-schedule")


def assert_step_table(stdout: str, path) -> None:
    """The step table comes first, one line per figure, each printed as it was measured: per bucket the
    eager, graphed and compiled step against the bandwidth floor, and the compile time of the bucket."""
    assert stdout.index("== step-table") < stdout.index("== thoughts")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert all(json.dumps(line) in stdout for line in lines)  # to the screen too
    assert lines[0]["bandwidth_source"] == "measured copy" and lines[0]["bandwidth_gb_s"] > 0
    assert lines[1]["model"] == "tiny" and lines[1]["floor_ms"] > 0
    figures = lines[2:]
    # every eager and graphed figure before the first compile: a time cap that cuts the table cuts compiles only
    assert [(f["way"], f["width"]) for f in figures] == [(way, w) for way in ("eager", "graphed", "compiled") for w in (1, 4)]
    assert all(f["rows"] == 1 and 0 < f["floor_share"] and f["ms"] > 0 for f in figures)
    compiled = [f for f in figures if f["way"] == "compiled"]
    assert all(len(f["compile_s"]) == 1 and f["fell_back"] == 0 for f in compiled)  # one bucket compiled each
    assert all(f["same_tokens"] for f in figures if f["way"] != "eager")  # float32: exact


def test_the_gpu_step_probe_profiles_the_engines_step_on_the_cpu_preset():
    """benchmarks/gpu_step.py is what a GPU machine runs to see where a step's time goes: its profile
    probe must run end to end (here on the tiny preset on the CPU, where it skips the kernel table)."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_step.py"), "profile", "--preset", "tiny",
                           "--rows", "2", "--prompt-len", "20"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    for mode in ("parallel", "seed"):
        assert f"{mode}: " in proc.stdout and "ms per step (2 rows" in proc.stdout
    assert "function calls" in proc.stdout  # the step thread's profile
