"""benchmarks/pipedec_model.py runs end to end on the tiny preset (it broke once when stages.tree_mask
changed its signature and nothing called it)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_latency_model_measures_the_tiny_preset_and_predicts_each_stage_count():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "pipedec_model.py"), "--measure", "tiny",
                          "--width", "4", "--prefix", "16", "--repeats", "1", "--comm-s", "0.001",
                          "--hit-rate", "0.6", "--stpp-tokens", "2.4", "--stages", "1,2,4", "--json"],
                         capture_output=True, text=True, timeout=300, check=True)
    report = json.loads(out.stdout)
    rows = report["rows"] if isinstance(report, dict) else report
    assert [r["stages"] for r in rows] == [1, 2]  # the tiny target has 2 layers: 4 stages are skipped
    for r in rows:
        assert r["pp_s_per_token"] > 0 and r["pipedec_s_per_token"] > 0 and r["stpp_s_per_token"] > 0
        assert abs(r["pipedec_over_pp"] - r["pp_s_per_token"] / r["pipedec_s_per_token"]) < 1e-9
