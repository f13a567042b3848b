"""Run settings from YAML configs and command-line overrides: values layer in order, and every bad
file or key is an error naming the file, line and key."""
from __future__ import annotations

from pathlib import Path

import pytest

from seed_tot.search import ConfigError, RunSettings, apply_overrides, load_settings
from seed_tot.search.protocol import SearchConfig

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", ["gsm8k", "creative_writing", "blocksworld"])
def test_shipped_configs_load(name: str):
    settings = load_settings(REPO / "configs" / f"{name}.yaml")
    assert settings.algorithm == "bfs" and settings.mode == "seed" and settings.k_config == (1, 1, 1)
    assert settings.search.n_generate == 3 and settings.search.breadth == 1
    assert settings.task == name


def test_config_values_override_the_task_and_cli_overrides_the_file(tmp_path: Path):
    file = tmp_path / "run.yaml"
    file.write_text("depth: 5\nk_config: [2, 2, 1]\nalgorithm: dfs\nextra: {value_max_new_tokens: 3}\n")
    base = SearchConfig(depth=4, extra={"keep": 1, "value_max_new_tokens": 8})
    settings = load_settings(file, base=base)
    assert settings.search.depth == 5 and settings.k_config == (2, 2, 1) and settings.algorithm == "dfs"
    assert settings.search.extra == {"keep": 1, "value_max_new_tokens": 3}
    assert base.depth == 4 and base.extra["value_max_new_tokens"] == 8  # the task's config is untouched

    overridden = apply_overrides(settings, {"depth": None, "temperature": 0.0, "k_config": "1,1"}, seed=3)
    assert overridden.search.depth == 5  # None is "not given"
    assert overridden.search.temperature == 0.0 and overridden.k_config == (1, 1) and overridden.seed == 3
    assert settings.search.temperature == 1.0  # a copy
    assert overridden.decoding().temperature == 0.0


@pytest.mark.parametrize("text, words", [
    ("depth: 3\nbredth: 2\n", ["bredth"]),
    ("depth: [1, 2\n", ["not valid YAML"]),
    ("depth: 0\n", ["'depth'", "positive integer"]),
    ("mode: turbo\n", ["'mode'", "seed"]),
    ("- depth\n", ["mapping"]),
])
def test_bad_config_names_the_file_and_the_key(tmp_path: Path, text: str, words: list[str]):
    file = tmp_path / "bad.yaml"
    file.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_settings(file)
    assert str(file) in str(err.value)
    for word in words:
        assert word in str(err.value)


@pytest.mark.parametrize("text, where, words", [
    ("depth: 3\nbreadth: [1, 2\n", ":3:1:", ["not valid YAML", "expected ',' or ']'"]),
    ("depth: 2\n  breadth: 3\n", ":2:10:", ["mapping values are not allowed here"]),
])
def test_a_yaml_syntax_error_names_the_file_line_and_column(tmp_path: Path, text: str, where: str, words: list[str]):
    file = tmp_path / "bad.yaml"
    file.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_settings(file)
    assert str(err.value).startswith(f"{file}{where} not valid YAML (")
    assert "<unicode string>" not in str(err.value)
    for word in words:
        assert word in str(err.value)


@pytest.mark.parametrize("text, where", [
    ("depth: 2\nbreadth: 1\ndepth: 6\n", ":3:1:"),
    ("extra: {value_max_new_tokens: 3, value_max_new_tokens: 5}\n", ":1:34:"),
])
def test_a_key_given_twice_is_refused_naming_both_lines(tmp_path: Path, text: str, where: str):
    file = tmp_path / "twice.yaml"
    file.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_settings(file, base=SearchConfig(extra={"value_max_new_tokens": 8}))
    key = "value_max_new_tokens" if "extra" in text else "depth"
    assert str(err.value).startswith(f"{file}{where} not valid YAML (key '{key}' on line 1; key '{key}' again")


def test_a_config_that_is_not_utf8_names_the_file_and_line(tmp_path: Path):
    file = tmp_path / "latin1.yaml"
    file.write_bytes("depth: 2\n# caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=rf"{file}:2: not UTF-8 text"):
        load_settings(file)


def test_unknown_override_is_an_error():
    with pytest.raises(ConfigError, match="command line.*'widht'"):
        apply_overrides(RunSettings(), widht=3)


@pytest.mark.parametrize("text, where, words", [
    ("depth: 3\nbredth: 2\n", ":2:", ["unknown key 'bredth'"]),  # a typo
    ("depth: 3\n\nbreadth: two\n", ":3:", ["key 'breadth'", "expected a positive integer, got 'two'"]),
    ("depth: 3\nbreadth: -1\n", ":2:", ["key 'breadth'", "positive integer, got -1"]),
    ("mode: ar\ndepth: -2\n", ":2:", ["key 'depth'", "positive integer, got -2"]),
    ("depth: 2\nk_config: [2, -1]\n", ":2:", ["key 'k_config'"]),
    ("depth: 2\nextra:\n  value_max: 10\n  value_max_new_tokns: 3\n", ":4:", ["'value_max_new_tokns'"]),
    ("depth: 2\ntask: blocksworld\n", ":2:", ["written for task 'blocksworld'"]),
])
def test_a_bad_key_or_value_names_the_line_it_is_on(tmp_path: Path, text: str, where: str, words: list[str]):
    # the syntax errors named the line, a parsed file's bad key or value only the file
    file = tmp_path / "bad.yaml"
    file.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_settings(file, base=SearchConfig(extra={"value_max": 10, "value_max_new_tokens": 8}), task_name="gsm8k")
    assert str(err.value).startswith(f"{file}{where} "), str(err.value)
    for word in words:
        assert word in str(err.value)
