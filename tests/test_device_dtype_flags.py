"""--device and --dtype are checked when the command starts: a typo or a GPU this machine lacks is a
usage error naming the flag, not a torch traceback after the tokenizer has loaded."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from seed_tot.cli import main

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def no_model_loads(monkeypatch):
    """A refusal that comes after a model load is the defect: loading fails the test outright."""
    def load(*args, **kwargs):
        raise AssertionError("a model was loaded before the flag was checked")
    monkeypatch.setattr("seed_tot.cli.load_engine", load)
    monkeypatch.setattr("seed_tot.Engine.from_pretrained", load)


def _usage_error(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 2, result.output  # click's usage error, no traceback
    return result.output


def _solve(tmp_path, *flags: str) -> list[str]:
    return ["solve", "gsm8k", "--data", str(FIXTURES / "gsm8k_small.jsonl"), "--limit", "1",
            "--output", str(tmp_path / "out"), *flags]


@pytest.mark.parametrize("dtype", ["foo", "float64x", "fp32"])
def test_an_unknown_dtype_is_a_usage_error_listing_the_accepted_ones(tmp_path, no_model_loads, dtype):
    out = _usage_error(*_solve(tmp_path, "--dtype", dtype))
    assert "--dtype" in out and f"'{dtype}' is not one of float32, bfloat16, float16" in out


@pytest.mark.parametrize("device", ["tpu", "gpu", "cuda:x"])
def test_an_unknown_device_is_a_usage_error_naming_the_forms_accepted(tmp_path, no_model_loads, device):
    out = _usage_error(*_solve(tmp_path, "--device", device))
    assert "--device" in out and "expected cpu, cuda, cuda:N or auto" in out


def test_cuda_without_a_gpu_is_a_usage_error_pointing_to_cpu(tmp_path, no_model_loads, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = _usage_error("generate", "--device", "cuda", "--max-new-tokens", "2")
    assert "no CUDA GPU" in out and "pass cpu or auto" in out


def test_a_gpu_index_past_the_last_gpu_names_the_ones_there(tmp_path, no_model_loads, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    out = _usage_error(*_solve(tmp_path, "--device", "cuda:3"))
    assert "cuda:0 to cuda:1" in out


def test_train_drafter_checks_its_device_and_dtype_too(tmp_path, no_model_loads):
    common = ["train-drafter", "--data", str(FIXTURES / "gsm8k_small.jsonl"), "--out", str(tmp_path / "d")]
    assert "'half' is not one of" in _usage_error(*common, "--dtype", "half")
    assert "expected cpu, cuda" in _usage_error(*common, "--device", "tpu")


def test_the_documented_values_pass_the_check(tmp_path, monkeypatch):
    """The check refuses nothing the help text offers: the command goes on to load the engine."""
    loaded = []

    def load(*args, **kwargs):
        loaded.append(args)
        raise SystemExit(0)
    monkeypatch.setattr("seed_tot.cli.load_engine", load)
    for device in ("cpu", "auto"):
        for dtype in ("float32", "bfloat16", "float16"):
            result = CliRunner().invoke(main, _solve(tmp_path, "--device", device, "--dtype", dtype))
            assert result.exit_code == 0, result.output
    assert len(loaded) == 6
