"""benchmarks/gpu.sh --smoke: the GPU benchmark's steps, on the tiny preset on the CPU, without
`datasets` installed, report a row for every mode of every step as that mode finishes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEED_MODES = ["ar", "parallel", "seed", "sd", "seed@db1@vb1"]
REPLAY_MODES = ["parallel", "seed+choose", "seed+suffix", "seed"]
STEPS = {"thoughts": SPEED_MODES, "tot-step": SPEED_MODES,
         "tot-gsm8k": ["parallel", "seed", "parallel@c4", "seed@c4"],
         # the replay-* preset: the target replays a recorded real run, so text drafts see real text
         "replay-tot-step": REPLAY_MODES, "replay-tot-gsm8k": REPLAY_MODES}


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


def _workload(step: str) -> str:
    """The bench workload a gpu.sh step runs: a replay-* step runs its workload on the replay preset."""
    return step.removeprefix("replay-")


def test_the_gpu_step_probe_profiles_the_engines_step_on_the_cpu_preset():
    """benchmarks/gpu_step.py is what a GPU machine runs to see where a step's time goes: its profile
    probe must run end to end (here on the tiny preset on the CPU, where it skips the kernel table)."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_step.py"), "profile", "--preset", "tiny",
                           "--rows", "2", "--prompt-len", "20"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    for mode in ("parallel", "seed"):
        assert f"{mode}: " in proc.stdout and "ms per step (2 rows" in proc.stdout
    assert "function calls" in proc.stdout  # the step thread's profile
