"""Model loading: the layer-truncated default draft and the embedded default target."""
from __future__ import annotations

import importlib.metadata

import torch
from transformers import LlamaForCausalLM

from conftest import tiny_model
from seed_tot import Engine, SamplingParams
from seed_tot.engine import models


def test_truncated_draft_shares_the_targets_weights_and_runs_its_first_layers():
    target = tiny_model("llama", seed=8, layers=4)
    draft = models.truncated_draft(target, 2)
    assert len(draft.model.layers) == 2 and len(target.model.layers) == 4  # the target is untouched
    target_params = {p.data_ptr() for p in target.parameters()}
    assert all(p.data_ptr() in target_params for p in draft.parameters())  # no copy
    # the same computation as a 2-layer model loaded with the target's first layers
    config = target.config.__class__(**{**target.config.to_dict(), "num_hidden_layers": 2})
    reference = LlamaForCausalLM(config).eval()
    reference.load_state_dict({k: v for k, v in target.state_dict().items()
                               if not k.startswith("model.layers.") or int(k.split(".")[2]) < 2})
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    with torch.no_grad():
        torch.testing.assert_close(draft(ids).logits, reference(ids).logits)


def test_truncated_draft_is_lossless_in_the_engine():
    target = tiny_model("qwen2", seed=9, layers=4)
    engine = Engine(target, models.truncated_draft(target, 1))
    greedy = SamplingParams(max_new_tokens=12, temperature=0)
    assert engine.generate([[2, 7]], greedy, mode="sd")[0].token_ids == engine.generate([[2, 7]], greedy, mode="ar")[0].token_ids


def test_default_target_falls_back_to_the_hub_id_without_the_wheel(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "files", missing)
    assert models.default_target() == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_missing_gguf_file_is_named(tmp_path):
    import pytest
    with pytest.raises(FileNotFoundError, match="nope.gguf"):
        models.load_model_and_tokenizer(str(tmp_path / "nope.gguf"), torch.device("cpu"), None)
