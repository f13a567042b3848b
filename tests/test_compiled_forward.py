"""Compiled fixed-shape forwards (compiled_forward.py): the bucketed forwards compiled by inductor give
the target alone's greedy tokens in every mode, and a model or bucket that cannot compile runs the stock
forward, logged once.

On the CPU the fixed shapes run only where asked: `CompileSettings(enabled=True)` turns both on, eagerly
(no CUDA graph), so the compiled kernels are what scores every bucketed forward. Inductor compiles C++
here (CI has gcc); the models are one-layer tiny ones and the settings keep the buckets few (decode
steps and the seed chains' verification, prefills uncompiled), because each bucket is one compile.
"""
from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch

from conftest import noisy_copy, reference_greedy, tiny_model
from seed_tot import Engine, SamplingParams
from seed_tot.engine import compiled_forward
from seed_tot.engine.compiled_forward import CompileSettings
from seed_tot.engine.graphed_forward import Shape
from seed_tot.engine.model_runtime import ModelRuntime
from test_attention_types import build

pytestmark = [pytest.mark.inductor,
              pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                                 reason="inductor compiles C++ on the CPU")]

PROMPT = [(7 * i) % 90 + 1 for i in range(10)]
NEW = 8
SETTINGS = CompileSettings(enabled=True, max_width=4)  # the prompt's prefill (16 entries) runs uncompiled


def _target(arch: str):
    return tiny_model("llama", seed=3, layers=1) if arch == "llama" else build(arch, n_layer=1)


# llama: decode steps and seed's chains (widths 1, 2, 4) compile; gpt2 (learned positions, no rotary,
# its own attention module): decode steps only, one bucket, to keep the compile time of the tests small
@pytest.mark.parametrize("arch,max_width", [("llama", 4), ("gpt2", 1)])
def test_compiled_forwards_give_the_target_alones_greedy_tokens_in_ar_parallel_and_seed(arch, max_width):
    settings = CompileSettings(enabled=True, max_width=max_width)
    target = _target(arch)
    ref = reference_greedy(target, PROMPT, NEW)
    engine = Engine(target, noisy_copy(target, 0.003), compile=settings)
    params = SamplingParams(max_new_tokens=NEW, temperature=0)
    for mode in ("ar", "parallel", "seed"):
        assert engine.generate([PROMPT], params, mode=mode)[0].token_ids == ref, mode
    for runtime in (engine.target_runtime, engine.draft_runtime):
        compiled = runtime.graphed.compiled
        # the compiled kernels really scored the steps: the decode bucket compiled, none fell back
        assert Shape(rows=1, width=1, tokens=1, keys=256) in compiled.compile_seconds
        assert compiled.failures == 0
        assert all(shape.width <= max_width for shape in compiled.compile_seconds)
        assert all(shape.width > max_width for shape in compiled.refused)  # wider ones ran uncompiled
    if max_width > 1:  # seed's verification of a chain ran compiled
        assert any(shape.width > 1 for shape in engine.target_runtime.graphed.compiled.compile_seconds)


def test_a_forward_that_fails_to_compile_runs_the_stock_forward_logged_once(monkeypatch, caplog):
    def failing_compile(function, **_kwargs):
        def run(*_args):
            raise RuntimeError("inductor could not lower an operator")
        return run

    monkeypatch.setattr(compiled_forward.torch, "compile", failing_compile)
    target = _target("llama")
    ref = reference_greedy(target, PROMPT, NEW)
    engine = Engine(target, noisy_copy(target, 0.003), compile=SETTINGS)
    params = SamplingParams(max_new_tokens=NEW, temperature=0)
    with caplog.at_level(logging.WARNING, logger=compiled_forward.__name__):
        for mode in ("ar", "seed"):
            assert engine.generate([PROMPT], params, mode=mode)[0].token_ids == ref, mode
    compiled = engine.target_runtime.graphed.compiled
    assert compiled.failures >= 2 and not compiled.compile_seconds  # several buckets fell back...
    warnings = [r for r in caplog.records if "run uncompiled where torch.compile fails" in r.getMessage()]
    assert [r.getMessage().split("'s")[0] for r in warnings] == ["LlamaForCausalLM"] * 2  # ...once per model


def test_compile_is_on_by_default_on_cuda_only_and_settings_are_checked():
    assert CompileSettings().on(torch.device("cuda")) and not CompileSettings().on(torch.device("cpu"))
    assert CompileSettings(enabled=True).on(torch.device("cpu"))
    assert not CompileSettings(enabled=False).on(torch.device("cuda"))
    with pytest.raises(ValueError, match="reduce-overhead"):  # inductor's own CUDA graphs: refused
        CompileSettings(mode="reduce-overhead")
    with pytest.raises(ValueError, match="max_width"):
        CompileSettings(max_width=-1)
    assert CompileSettings.of(True) == CompileSettings(enabled=True) and CompileSettings.of(None) == CompileSettings()
    with pytest.raises(TypeError, match="compile must be"):
        CompileSettings.of("yes")
    runtime = ModelRuntime(_target("llama"))
    assert runtime.graph_runner().compiled is None  # CPU default: no compile
    runtime.compile = SETTINGS
    assert runtime.graph_runner().compiled is not None  # the setting changed: a new runner


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (a GPU machine runs it)")
def test_on_cuda_the_captured_graphs_replay_compiled_kernels_and_give_the_target_alones_tokens():
    """On CUDA compiling is the default: the bucket's graph is captured around the compiled forward."""
    target = _target("llama")
    draft = noisy_copy(target, 0.003)
    ref = reference_greedy(target, PROMPT, NEW)  # on the CPU: the reference
    engine = Engine(target.cuda(), draft.cuda())
    params = SamplingParams(max_new_tokens=NEW, temperature=0)
    for mode in ("ar", "parallel", "seed"):
        assert engine.generate([PROMPT], params, mode=mode)[0].token_ids == ref, mode
    graphed = engine.target_runtime.graphed
    assert graphed.compiled is not None and graphed.compiled.compile_seconds and graphed.compiled.failures == 0
    assert graphed.refused is None and graphed.captures and graphed.replays > graphed.captures


def test_bench_compiles_when_asked_and_reports_what_each_model_compiled(monkeypatch, tmp_path):
    """`seed-tot bench --compile on` reaches both runtimes; its JSON and closing line say what compiled
    (here every compile fails, so the report must count failures and the rows still match `ar`)."""
    from click.testing import CliRunner

    from seed_tot.cli import main

    def failing_compile(function, **_kwargs):
        def run(*_args):
            raise RuntimeError("no compiler for this test")
        return run

    monkeypatch.setattr(compiled_forward.torch, "compile", failing_compile)
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(main, ["bench", "--synthetic", "tiny", "--device", "cpu", "--modes", "ar,seed",
                                       "--max-new-tokens", "3", "--repeats", "1", "--warmup", "0", "--compile", "on",
                                       "--json", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["compile"]["setting"] == "on"
    assert report["compile"]["target"]["failures"] >= 1 and report["compile"]["draft"]["failures"] >= 1
    assert report["compile"]["target"]["buckets"] == 0
    assert "compiled target forwards: 0 buckets" in result.stdout
    assert all(row["matches_ar"] for row in report["modes"])
