"""benchmarks/contention.py on tiny settings: every part runs and its tables come out (figures not judged)."""
from __future__ import annotations

import json
import runpy
from pathlib import Path
from types import SimpleNamespace

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "contention.py"


@pytest.fixture(scope="module")
def contention():
    return SimpleNamespace(**runpy.run_path(str(SCRIPT)))  # a script, not a package: its globals


@pytest.mark.parametrize("column, modes", [("engine", {"ar", "seed", "threads"}), ("transformers", {"ar", "threads"})])
def test_a_measured_cell_times_each_mode(contention, tiny_model_dirs, column, modes):
    target, draft = tiny_model_dirs
    cell = contention.measure(column, target, draft, 3, 1, ["ar", "seed"])
    assert set(cell) == modes and cell["ar"]["wall_s"] > 0


def test_tables_name_every_neighbour_column_and_ratio(contention):
    cell = {"ar": {"wall_s": 2.0, "step_ms": 50.0}, "seed": {"wall_s": 1.0, "step_ms": 25.0},
            "threads": {"min": 1, "max": 2}}
    figures = {"new_tokens": 32, "repeats": 3, "cells": {f"{n}/{c}": cell for n in contention.NEIGHBOURS
                                                         for c in contention.COLUMNS},
               "solve": {"alone_s": 10.0, "together_s": [18.0, 19.0], "ratio": 1.9, "args": "gsm8k --limit 1"}}
    text = contention.format_tables(figures)
    assert "| a PyTorch process multiplying 256x256 matrices (default threads) | 2.00 s (16 tok/s, 1.0x alone, threads 1-2)" in text
    assert "| matmul | engine | seed | 25.0 | 1.00 |" in text
    assert "two `seed-tot solve gsm8k --limit 1` started together: 18.0, 19.0 s; one alone 10.0 s; 1.90x" in text


def test_the_script_runs_a_neighbour_a_measured_process_and_the_solves(contention, tiny_model_dirs, tmp_path, capsys):
    target, _ = tiny_model_dirs
    out = tmp_path / "contention.json"
    figures = contention.main([
        "--target", target, "--new-tokens", "3", "--repeats", "1", "--modes", "ar", "--neighbours", "model",
        "--columns", "omp1", "--solve-args", f"gsm8k --data tests/fixtures/gsm8k_small.jsonl --limit 1 --mode ar "
                                             f"--target {target} --max-new-tokens 8", "--json", str(out)])
    assert figures["cells"]["model/omp1"]["threads"]["max"] == 1  # OMP_NUM_THREADS=1 reached the engine
    assert len(figures["solve"]["together_s"]) == 2 and figures["solve"]["alone_s"] > 0
    assert "| a heavier PyTorch job (a 135M model's forwards) |" in capsys.readouterr().out
    assert json.loads(out.read_text())["cells"].keys() == figures["cells"].keys()
