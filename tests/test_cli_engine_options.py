"""--attention and --compile (and the YAML keys attention, compile) reach the engine from every
command, change no greedy token, and a bad value is refused before any model loads, naming the option."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from seed_tot.cli import main
from test_cli import run

FIXTURES = "tests/fixtures"


@pytest.fixture
def no_model_loads(monkeypatch):
    """A refusal that comes after a model load is the defect: loading fails the test outright."""
    def load(*args, **kwargs):
        raise AssertionError("a model was loaded before the setting was checked")
    monkeypatch.setattr("seed_tot.engine.engine.load_model", load)
    monkeypatch.setattr("seed_tot.engine.engine.load_tokenizer", load)
    monkeypatch.setattr("seed_tot.synthetic.build_model", load)


def test_generate_with_pool_attention_gives_the_targets_greedy_tokens(tiny_model_dirs):
    """seed over the pool read in place == seed over the gather == ar (the target alone), and the
    summary line says which path ran."""
    target, draft = tiny_model_dirs
    common = ("generate", "Tom has 3 apples.", "--target", target, "--draft", draft, "--max-new-tokens", "12", "-n", "2")
    tokens = {}
    for mode, attention in (("ar", "gather"), ("seed", "gather"), ("seed", "pool"), ("ar", "pool")):
        tree = ["--k-config", "2,2,1"] if mode != "ar" else []
        out = run(*common, "--mode", mode, *tree, "--attention", attention, "--json")
        tokens[mode, attention] = [json.loads(line)["token_ids"] for line in out.splitlines()]
    assert len(tokens["ar", "gather"]) == 2 and all(len(t) > 0 for t in tokens["ar", "gather"])
    assert tokens["seed", "pool"] == tokens["seed", "gather"] == tokens["ar", "gather"] == tokens["ar", "pool"]
    out = run(*common, "--mode", "seed", "--attention", "pool", "--compile", "off")
    assert "attention=pool compile=off" in out, out


def test_generate_attention_reaches_the_engines_runtimes(tiny_model_dirs, monkeypatch):
    """The flag is not only printed: both models' runtimes read the pool in place."""
    import seed_tot.cli as cli

    seen = {}
    real = cli.load_engine

    def spy(*args, **kwargs):
        seen["engine"] = engine = real(*args, **kwargs)
        return engine

    monkeypatch.setattr(cli, "load_engine", spy)
    target, draft = tiny_model_dirs
    run("generate", "Hi", "--target", target, "--draft", draft, "--mode", "sd", "--max-new-tokens", "2",
        "--attention", "pool", "--compile", "off")
    engine = seen["engine"]
    assert engine.target_runtime.attention == engine.draft_runtime.attention == "pool"
    assert engine.target_runtime.compile.enabled is False and engine.draft_runtime.compile.enabled is False


def _solve(tmp_path, target, draft, name, *extra):
    out_dir = tmp_path / name
    run("solve", "gsm8k", "--data", f"{FIXTURES}/gsm8k_small.jsonl", "--limit", "1", "--mode", "seed",
        "--target", target, "--draft", draft, "--temperature", "0", "--max-new-tokens", "10",
        "--output", str(out_dir), *extra)
    records = [json.loads(line) for line in (out_dir / "results.jsonl").read_text().splitlines()]
    return records, json.loads((out_dir / "summary.json").read_text())


def test_solve_with_yaml_pool_attention_gives_the_same_predictions_as_gather(tmp_path, tiny_model_dirs, monkeypatch):
    """`attention: pool` in the config: the engine reads the pool in place, the trees are the
    gather's, and summary.json records the settings."""
    import seed_tot.cli as cli

    paths, real = [], cli.load_engine

    def spy(*args, **kwargs):
        engine = real(*args, **kwargs)
        paths.append((engine.target_runtime.attention, engine.target_runtime.compile.enabled))
        return engine

    monkeypatch.setattr(cli, "load_engine", spy)
    target, draft = tiny_model_dirs
    config = tmp_path / "pool.yaml"
    config.write_text("depth: 1\nbreadth: 1\nn_generate: 2\nattention: pool\ncompile: off\n")
    gather, gather_summary = _solve(tmp_path, target, draft, "gather", "--depth", "1", "--breadth", "1",
                                    "--n-generate", "2")
    pool, pool_summary = _solve(tmp_path, target, draft, "pool", "--config", str(config))
    from seed_tot.search.solve import describe_summary
    assert "attention pool, compile off" in describe_summary(pool_summary, tmp_path / "pool")
    assert "attention" not in describe_summary(gather_summary, tmp_path / "gather")
    assert paths == [("gather", None), ("pool", False)]
    assert [r["prediction"] for r in pool] == [r["prediction"] for r in gather]
    assert [r["steps"] for r in pool] == [r["steps"] for r in gather]
    assert (pool_summary["settings"]["attention"], pool_summary["settings"]["compile"]) == ("pool", "off")
    recorded = json.loads((tmp_path / "pool" / "run.json").read_text())["settings"]
    assert (recorded["attention"], recorded["compile"]) == ("pool", "off")
    assert (gather_summary["settings"]["attention"], gather_summary["settings"]["compile"]) == ("gather", "auto")


def test_a_flag_wins_over_the_config_and_a_resume_may_change_the_path(tmp_path, tiny_model_dirs):
    """--attention over `attention:` in the file; the path changes no record, so a resume with the
    other path is not refused as other settings."""
    from seed_tot.search import apply_overrides, load_settings
    from seed_tot.search.run_identity import _comparable, run_identity

    config = tmp_path / "pool.yaml"
    config.write_text("attention: pool\n")
    settings = apply_overrides(load_settings(config), attention="gather", compile="on")
    assert (settings.attention, settings.compile) == ("gather", "on")
    pool, gather = load_settings(config), load_settings(None)
    assert _comparable(run_identity("gsm8k", pool.to_dict(), "bfs")) == \
        _comparable(run_identity("gsm8k", gather.to_dict(), "bfs"))


@pytest.mark.parametrize("command", [("generate", "Hi"), ("solve", "gsm8k", "--output", "OUT"), ("bench", "thoughts"),
                                     ("serve",)])
def test_a_bad_attention_flag_is_refused_naming_the_option(command, tmp_path, no_model_loads):
    args = [a.replace("OUT", str(tmp_path / "out")) for a in command]
    for flag, value in (("--attention", "paged"), ("--compile", "maybe")):
        result = CliRunner().invoke(main, [*args, flag, value])
        assert result.exit_code == 2, result.output  # click's usage error, no traceback
        assert flag in result.output and repr(value) in result.output, result.output
    assert "'gather', 'pool'" in CliRunner().invoke(main, [*args, "--attention", "paged"]).output


@pytest.mark.parametrize("key,value,accepted", [("compile", "maybe", "auto, on, off"),
                                                ("attention", "paged", "gather, pool")])
def test_a_bad_yaml_engine_key_is_refused_before_any_model_loads(tmp_path, key, value, accepted, no_model_loads):
    config = tmp_path / "bad.yaml"
    config.write_text(f"depth: 1\n{key}: {value}\n")
    result = CliRunner().invoke(main, ["solve", "gsm8k", "--data", f"{FIXTURES}/gsm8k_small.jsonl", "--config",
                                       str(config), "--output", str(tmp_path / "out")])
    assert result.exit_code != 0
    assert f"{config}:2: key '{key}': expected one of {accepted}, got '{value}'" in result.output, result.output


@pytest.mark.parametrize("mode", ["pipedec", "pp", "stpp"])
def test_pipeline_modes_refuse_engine_paths_they_do_not_run(mode, no_model_loads):
    """The pipeline's stages run their own eager forwards: --attention pool or --compile on would
    change nothing, so they are refused, not ignored."""
    for flag, value in (("--attention", "pool"), ("--compile", "on")):
        result = CliRunner().invoke(main, ["generate", "Hi", "--mode", mode, flag, value])
        assert result.exit_code == 2 and f"{flag} {value}: --mode {mode} runs" in result.output, result.output


def test_an_api_base_run_warns_of_the_configs_engine_keys(tmp_path, caplog):
    """From a config the run goes on (the other keys still apply), with a warning naming the keys."""
    config = tmp_path / "pool.yaml"
    config.write_text("depth: 1\nattention: pool\n")
    with caplog.at_level("WARNING", logger="seed_tot"):
        result = CliRunner().invoke(main, ["solve", "gsm8k", "--data", f"{FIXTURES}/gsm8k_small.jsonl", "--config",
                                           str(config), "--output", str(tmp_path / "out"),
                                           "--api-base", "http://127.0.0.1:1/v1"])
    assert result.exit_code != 0  # nothing listens there
    assert any("attention=pool apply to an engine in this process" in r.getMessage() for r in caplog.records)


def test_the_python_entries_refuse_a_bad_setting_before_any_model_loads(no_model_loads):
    from seed_tot import Engine
    from seed_tot.synthetic import build_synthetic_engine

    with pytest.raises(ValueError, match=r"attention='paged': expected one of gather, pool"):
        Engine.from_pretrained(target="unused", attention="paged")
    with pytest.raises(TypeError, match="compile must be"):
        Engine.from_pretrained(target="unused", compile="maybe")
    with pytest.raises(ValueError, match=r"attention='paged'"):
        build_synthetic_engine("tiny", 0.5, device="cpu", attention="paged")


def test_the_synthetic_engine_takes_both_settings():
    from seed_tot.synthetic import build_synthetic_engine

    engine = build_synthetic_engine("tiny", 0.5, device="cpu", attention="pool", compile=False)
    assert engine.target_runtime.attention == engine.draft_runtime.attention == "pool"
    assert engine.target_runtime.compile.enabled is False
