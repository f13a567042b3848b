"""`seed-tot generate --mode pipedec|pp|stpp` end to end on tiny saved models."""
from __future__ import annotations

import json
import multiprocessing

from click.testing import CliRunner

from seed_tot.cli import main


def _tokens(*args: str) -> list[list[int]]:
    result = CliRunner().invoke(main, ["generate", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    # progress bars of the model loader may share a line with the JSON
    return [json.loads(line[line.index('{"index"'):])["token_ids"] for line in result.output.splitlines()
            if '{"index"' in line]


def test_generate_pipeline_modes_print_the_target_alones_greedy_tokens(tiny_model_dirs):
    target, draft = tiny_model_dirs
    common = ["2+2=", "--target", target, "--draft", draft, "--raw", "--max-new-tokens", "6", "--json"]
    ar = _tokens(*common, "--mode", "ar")
    assert _tokens(*common, "--mode", "pipedec", "--stages", "2", "--width", "3", "--children", "2") == ar
    assert _tokens(*common, "--mode", "stpp", "--stages", "2", "--k-config", "2,1", "--simulate") == ar
    assert _tokens(*common, "--mode", "pp", "--stages", "1") == ar
    assert multiprocessing.active_children() == []


def test_generate_with_more_stages_than_layers_is_a_one_line_error(tiny_model_dirs):
    target, draft = tiny_model_dirs
    result = CliRunner().invoke(main, ["generate", "x", "--target", target, "--draft", draft, "--mode", "pipedec",
                                       "--stages", "3"])
    assert result.exit_code != 0
    assert "cannot split a target with 2 decoder layers into 3 stages" in result.output
    assert "Traceback" not in result.output
