"""A Hub id or a Hub dataset on a machine that cannot reach the Hub fails at once in one line (or
loads the cached copy), instead of huggingface_hub's retries."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from seed_tot import hub
from seed_tot.cli import main
from seed_tot.engine import models

REPO = "someone/some-model"


@pytest.fixture
def unreachable(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr("huggingface_hub.constants.is_offline_mode", lambda: False)
    monkeypatch.setattr(hub, "hub_unreachable", lambda endpoint: "Name or service not known")


def _cached(monkeypatch, cached: bool):
    path = "/cache/models--someone--some-model/snapshots/0/config.json" if cached else None
    monkeypatch.setattr("huggingface_hub.try_to_load_from_cache", lambda repo, name: path)


def test_an_uncached_hub_id_without_the_hub_is_one_line_naming_the_ways_out(unreachable, monkeypatch):
    _cached(monkeypatch, False)
    with pytest.raises(ConnectionError) as err:
        models.model_source(REPO)
    message = str(err.value)
    assert "\n" not in message and REPO in message and "unreachable" in message
    assert "local model directory or .gguf file" in message and "HF_HUB_OFFLINE=1" in message


def test_a_name_that_could_be_a_folder_not_made_yet_is_said_to_be_no_local_directory_too(unreachable, monkeypatch,
                                                                                         tmp_path, tiny_model_dirs):
    """`--draft drafter-k4` before `train-drafter --out drafter-k4` ran: not only a Hub problem."""
    _cached(monkeypatch, False)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["generate", "Hi", "--target", tiny_model_dirs[0], "--draft", "drafter-k4",
                                         "--mode", "sd", "--device", "cpu"])
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and f"there is no local directory drafter-k4 in {tmp_path}" in lines[0], result.output
    assert "unreachable" in lines[0]


def test_a_cached_hub_id_without_the_hub_loads_from_the_cache_only(unreachable, monkeypatch):
    _cached(monkeypatch, True)
    assert models.model_source(REPO) == (REPO, {"local_files_only": True})


def test_offline_mode_needs_no_probe_and_says_when_the_model_is_not_cached(monkeypatch):
    monkeypatch.setattr("huggingface_hub.constants.is_offline_mode", lambda: True)
    monkeypatch.setattr(hub, "hub_unreachable", lambda endpoint: pytest.fail("probed the Hub while offline"))
    _cached(monkeypatch, False)
    with pytest.raises(ConnectionError, match="HF_HUB_OFFLINE is set and someone/some-model is not in the Hub cache"):
        models.model_source(REPO)


def test_the_probe_reports_why_an_endpoint_cannot_be_reached():
    hub.hub_unreachable.cache_clear()
    try:
        # port 9 of the loopback address: nothing listens there, the connection is refused at once
        assert hub.hub_unreachable("http://127.0.0.1:9") is not None
    finally:
        hub.hub_unreachable.cache_clear()


def test_generate_with_an_unreachable_hub_ends_in_one_error_line(unreachable, monkeypatch):
    _cached(monkeypatch, False)
    result = CliRunner().invoke(main, ["generate", "Hi", "--target", REPO, "--mode", "ar"])
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"Error: cannot load {REPO}")


@pytest.fixture
def datasets_never_asked(monkeypatch):
    """datasets.load_dataset fails the test: without the Hub it would retry for half a minute."""
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: pytest.fail("asked datasets to reach the Hub"))


def _one_error_line(args: list[str]) -> str:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    return lines[0]


def test_scoring_gsm8k_without_data_or_the_hub_is_one_line_that_asks_for_a_local_file(unreachable, datasets_never_asked,
                                                                                      tmp_path):
    predictions = tmp_path / "p.jsonl"
    predictions.write_text('{"id": "0", "prediction": "7"}\n')
    line = _one_error_line(["score", "gsm8k", "--predictions", str(predictions)])
    assert line.startswith("Error: cannot load the Hub dataset openai/gsm8k (main, test): the Hugging Face Hub")
    assert "unreachable (Name or service not known)" in line
    assert "pass a local file with --data PATH (JSONL: one object per line with question, answer)" in line
    assert "HF_HUB_OFFLINE=1" in line


def test_solving_gsm8k_without_data_or_the_hub_fails_before_any_model_loads(unreachable, datasets_never_asked,
                                                                           tmp_path):
    line = _one_error_line(["solve", "gsm8k", "--output", str(tmp_path / "o"), "--target", REPO])
    assert "cannot load the Hub dataset openai/gsm8k" in line and "--data PATH" in line


def test_offline_mode_loads_a_hub_dataset_from_the_datasets_cache_without_a_probe(monkeypatch):
    datasets = pytest.importorskip("datasets")
    from seed_tot.tasks.loading import load_records

    monkeypatch.setattr("huggingface_hub.constants.is_offline_mode", lambda: True)
    monkeypatch.setattr(hub, "hub_unreachable", lambda endpoint: pytest.fail("probed the Hub while offline"))
    monkeypatch.setattr(datasets, "load_dataset", lambda name, config, split: [{"question": "q", "answer": "a"}])
    assert load_records(None, hub=("openai/gsm8k", "main", "test")) == [{"question": "q", "answer": "a", "id": "0"}]
