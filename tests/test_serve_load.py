"""benchmarks/serve_load.py on a tiny model with two clients: it runs both modes over HTTP and in
process, prints one table row per mode and path, and writes the same rows to JSON (no timing judged)."""
from __future__ import annotations

import json
import math
import runpy
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("openai")
pytest.importorskip("fastapi")

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "serve_load.py"
SHORT_TASK = f"{Path(__file__).with_name('short_task.py')}:ShortTask"


@pytest.fixture(scope="module")
def serve_load():
    return SimpleNamespace(**runpy.run_path(str(SCRIPT)))  # a script, not a package: its globals


def test_serve_load_measures_both_modes_over_http_and_in_process(serve_load, tiny_model_dirs, tmp_path, capsys):
    target, draft = tiny_model_dirs
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"question": q, "answer": "1"}) + "\n" for q in ("apples", "pens")))
    out = tmp_path / "load.json"
    rows = serve_load.main(["--target", target, "--draft", draft, "--task", SHORT_TASK, "--data", str(data),
                            "--clients", "2", "--repeats", "1", "--max-new-tokens", "4", "--json", str(out)])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("|")]
    header, rule, *body = lines
    assert header.count("|") == rule.count("|") == body[0].count("|") == 9
    assert [(r["mode"], r["path"]) for r in rows] == [("parallel", "http"), ("parallel", "in process"),
                                                     ("seed", "http"), ("seed", "in process")]
    assert json.loads(out.read_text())["rows"] == json.loads(json.dumps(rows))
    for r in rows:
        # each client: 1 thought request (n=3) + 3 value requests; every figure measured
        assert r["rounds"][0]["requests"] == 2 * 4
        assert all(math.isfinite(r[k]) and r[k] > 0 for k in serve_load.FIGURES), r
    # the server's counters were read: the rows of the two clients' requests shared target forwards
    assert all(r["rows_per_target_forward"] >= 1 for r in rows)


def test_nearest_rank_quantiles(serve_load):
    values = [0.1, 0.2, 0.3, 0.4]
    assert serve_load.quantile(values, 0.5) == 0.2 and serve_load.quantile(values, 0.95) == 0.4
    assert serve_load.quantile([0.7], 0.95) == 0.7
    assert serve_load.quantile([1, 2, 3, 4, 5, 6], 0.5) == 3  # rank ceil(0.5 * 6) = 3
