"""benchmarks/host_cost.py on tiny sizes: the table it prints and the op counts it reports."""
from __future__ import annotations

import json
import math
import runpy
from pathlib import Path
from types import SimpleNamespace

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "host_cost.py"


@pytest.fixture(scope="module")
def host_cost():
    return SimpleNamespace(**runpy.run_path(str(SCRIPT)))  # a script, not a package: its globals


def test_host_cost_prints_one_table_row_per_row_count_and_writes_them_to_json(host_cost, tmp_path, capsys):
    out = tmp_path / "host.json"
    results = host_cost.main(["--rows", "1,3", "--repeats", "1", "--prompt-len", "12", "--new-tokens", "3",
                              "--vocab", "256", "--modes", "parallel,seed", "--json", str(out)])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("|")]
    header, rule, *body = lines
    assert header.count("|") == rule.count("|") == body[0].count("|") == 7
    assert [line.split("|")[1].strip() for line in body] == ["1", "3"]
    assert [r["rows"] for r in json.loads(out.read_text())["rows"]] == [1, 3]
    for r in results:
        # timings, not asserted: (wall(3) - wall(1)) / 2 of one repeat can be any sign; each side reported one
        assert all(math.isfinite(r[k]) for k in ("transformers_ms", "parallel_ms", "seed_ms"))
        # both sides' decode forwards were found and counted (a missed forward reads None)
        assert r["engine_ops"] > 0 and r["transformers_ops"] > 0


def test_op_counter_counts_only_the_decode_forward_of_the_whole_batch(host_cost):
    model = host_cost.tiny_llama(1, 64, seed=0)
    with host_cost.ForwardOps(model) as counted:
        host_cost._hf_generate(model, [[1, 2, 3], [4, 5, 6]], 3)
    # one prompt forward (6 tokens) and two decode forwards (one token per row)
    assert [tokens for tokens, _ in counted.forwards] == [6, 2, 2]
    assert counted.decode_ops(2) == counted.forwards[-1][1]
    assert counted.decode_ops(5) is None


def test_host_cost_samples_on_both_sides_at_a_temperature(host_cost, capsys, monkeypatch):
    seen = []
    real = host_cost._hf_generate.__globals__["SamplingParams"]

    def recording(*args, **kwargs):
        params = real(*args, **kwargs)
        seen.append(params.temperature)
        return params
    monkeypatch.setitem(host_cost._engine_generate.__globals__, "SamplingParams", recording)
    sampled = []
    real_generate = host_cost.LlamaForCausalLM.generate

    def generate(self, *args, **kwargs):
        sampled.append((kwargs.get("do_sample"), kwargs.get("temperature")))
        return real_generate(self, *args, **kwargs)
    monkeypatch.setattr(host_cost.LlamaForCausalLM, "generate", generate)
    results = host_cost.main(["--rows", "2", "--repeats", "1", "--prompt-len", "12", "--new-tokens", "3",
                              "--vocab", "256", "--modes", "seed", "--temperature", "1.0"])
    assert "temperature 1" in capsys.readouterr().out.splitlines()[0]
    assert seen and set(seen) == {1.0}  # every engine call sampled
    assert sampled and set(sampled) == {(True, 1.0)}  # and every transformers call
    # a row of figures for both sides (their values are timings, asserted by no test: a sampled run's
    # wall(3) - wall(1) can come out negative at one repeat)
    assert {"transformers_ms", "seed_ms"} <= set(results[0])
