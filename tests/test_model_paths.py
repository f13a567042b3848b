"""Model paths: a missing or empty local directory, and a draft whose vocabulary differs, are
one-line errors, the last one before the draft's weights load."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from seed_tot.cli import main


def fails(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    return result.output


@pytest.mark.parametrize("name", ["./no/such/model", "/no/such/model", "models/qwen/1.5b", "~/no-such-model/"])
def test_missing_local_directory_says_no_such_directory(name: str):
    assert f"model directory {name}: no such directory" in fails("generate", "Hi", "--target", name, "--mode", "ar")


def test_hub_id_shaped_name_is_left_to_the_hub(monkeypatch):
    from seed_tot import hub
    from seed_tot.engine import models

    monkeypatch.setattr(hub, "hub_unreachable", lambda endpoint: None)  # a machine that reaches the Hub
    assert models.model_source("Qwen/Qwen2-0.5B-Instruct") == ("Qwen/Qwen2-0.5B-Instruct", {})


def test_empty_directory_says_no_model_files(tmp_path: Path):
    out = fails("generate", "Hi", "--target", str(tmp_path), "--mode", "ar")
    assert f"no model files in {tmp_path}" in out


def test_directory_with_only_a_gguf_points_at_the_file(tmp_path: Path):
    (tmp_path / "m.gguf").write_bytes(b"")
    assert "pass the .gguf file itself" in fails("generate", "Hi", "--target", str(tmp_path), "--mode", "ar")


def test_different_vocabularies_fail_before_the_drafts_weights_load(tmp_path: Path, tiny_model_dirs):
    target, draft = tiny_model_dirs
    bad = tmp_path / "draft"
    shutil.copytree(draft, bad)
    tok = json.loads((bad / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    vocab["a"], vocab["b"] = vocab["b"], vocab["a"]  # same size, one pair of ids swapped
    (bad / "tokenizer.json").write_text(json.dumps(tok))
    for weights in bad.glob("*.safetensors"):  # loading these would fail with another error
        weights.write_bytes(b"not a safetensors file")
    out = fails("generate", "Hi", "--target", target, "--draft", str(bad), "--mode", "sd")
    assert "different vocabularies" in out and str(bad) in out
