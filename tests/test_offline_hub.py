"""A Hub id on a machine that cannot reach the Hub fails at once in one line (or loads the cached
copy), instead of huggingface_hub's retries."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from seed_tot.cli import main
from seed_tot.engine import models

REPO = "someone/some-model"


@pytest.fixture
def unreachable(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr("huggingface_hub.constants.is_offline_mode", lambda: False)
    monkeypatch.setattr(models, "_hub_unreachable", lambda endpoint: "Name or service not known")


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


def test_a_cached_hub_id_without_the_hub_loads_from_the_cache_only(unreachable, monkeypatch):
    _cached(monkeypatch, True)
    assert models.model_source(REPO) == (REPO, {"local_files_only": True})


def test_offline_mode_needs_no_probe_and_says_when_the_model_is_not_cached(monkeypatch):
    monkeypatch.setattr("huggingface_hub.constants.is_offline_mode", lambda: True)
    monkeypatch.setattr(models, "_hub_unreachable", lambda endpoint: pytest.fail("probed the Hub while offline"))
    _cached(monkeypatch, False)
    with pytest.raises(ConnectionError, match="HF_HUB_OFFLINE is set and someone/some-model is not in the Hub cache"):
        models.model_source(REPO)


def test_the_probe_reports_why_an_endpoint_cannot_be_reached():
    models._hub_unreachable.cache_clear()
    try:
        # port 9 of the loopback address: nothing listens there, the connection is refused at once
        assert models._hub_unreachable("http://127.0.0.1:9") is not None
    finally:
        models._hub_unreachable.cache_clear()


def test_generate_with_an_unreachable_hub_ends_in_one_error_line(unreachable, monkeypatch):
    _cached(monkeypatch, False)
    result = CliRunner().invoke(main, ["generate", "Hi", "--target", REPO, "--mode", "ar"])
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"Error: cannot load {REPO}")
