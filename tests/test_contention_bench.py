"""benchmarks/contention.py on tiny settings: every part runs and its tables come out (figures not judged)."""
from __future__ import annotations

import json
import runpy
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "contention.py"


def test_contention_bench_runs_each_neighbour_column_and_the_solves(tiny_model_dirs, tmp_path, capsys):
    target, draft = tiny_model_dirs
    out = tmp_path / "contention.json"
    figures = runpy.run_path(str(SCRIPT))["main"]([
        "--target", target, "--draft", draft, "--new-tokens", "3", "--repeats", "1", "--neighbours", "none,matmul,model",
        "--solve-args", f"gsm8k --data tests/fixtures/gsm8k_small.jsonl --limit 1 --mode ar --target {target} "
                        f"--max-new-tokens 8", "--work-dir", str(tmp_path / "runs"), "--json", str(out)])
    assert set(figures["cells"]) == {f"{n}/{c}" for n in ("none", "matmul", "model")
                                     for c in ("engine", "omp1", "transformers")}
    assert set(figures["cells"]["matmul/engine"]) == {"ar", "seed", "threads"}
    assert figures["cells"]["none/omp1"]["threads"]["max"] == 1  # OMP_NUM_THREADS=1 reached the engine
    assert len(figures["solve"]["together_s"]) == 2 and figures["solve"]["alone_s"] > 0
    printed = capsys.readouterr().out
    assert "| a PyTorch process multiplying 256x256 matrices (default threads) |" in printed
    assert "two `seed-tot solve" in printed
    assert json.loads(out.read_text())["cells"].keys() == figures["cells"].keys()
