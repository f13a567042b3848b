"""A flag the chosen mode (or bench workload) does not read is an error naming the flag and the modes
that read it; a config's setting that the mode ignores gets one warning line."""
from __future__ import annotations

import logging
from pathlib import Path

from click.testing import CliRunner

from seed_tot.cli import main

FIXTURES = Path(__file__).parent / "fixtures"


def _fails(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 2, result.output  # a usage error, raised before any model loads
    return result.output


def test_generate_names_each_flag_its_mode_does_not_read_and_the_modes_that_do():
    out = _fails("generate", "--mode", "ar", "--k-config", "2,2,1", "--n-workers", "3", "--verify-batch", "2")
    assert "mode ar does not use --k-config (read by sd, mcsd, seed, stpp), --n-workers (read by seed), " \
           "--verify-batch (read by seed)" in out


def test_generate_refuses_seed_and_pipeline_settings_in_other_modes():
    assert "--draft-batch (read by seed)" in _fails("generate", "--mode", "sd", "--draft-batch", "2")
    assert "--policy-option (read by sd, mcsd, seed)" in _fails("generate", "--mode", "parallel",
                                                                "--policy-option", "lookup=0")
    assert "--width (read by pipedec)" in _fails("generate", "--mode", "stpp", "--width", "3")
    assert "--stages (read by pipedec, pp, stpp)" in _fails("generate", "--mode", "seed", "--stages", "2")
    assert "--trace (read by ar, parallel, sd, mcsd, seed)" in _fails("generate", "--mode", "pp", "--trace", "t")


def test_solve_refuses_a_seed_flag_with_mode_ar(tmp_path):
    out = _fails("solve", "gsm8k", "--data", str(FIXTURES / "gsm8k_small.jsonl"), "--mode", "ar",
                 "--n-workers", "2", "--output", str(tmp_path / "o"))
    assert "mode ar does not use --n-workers (read by seed)" in out


def test_solve_checks_against_the_configs_mode_when_no_mode_is_given(tmp_path):
    config = tmp_path / "ar.yaml"
    config.write_text("mode: ar\n")
    out = _fails("solve", "gsm8k", "--data", str(FIXTURES / "gsm8k_small.jsonl"), "--config", str(config),
                 "--k-config", "2,2", "--output", str(tmp_path / "o"))
    assert "mode ar does not use --k-config" in out


def test_solve_warns_once_about_a_configs_seed_settings_under_mode_ar(tmp_path, caplog):
    config = tmp_path / "seed.yaml"
    config.write_text("mode: seed\nk_config: [2, 2, 1]\nverify_batch: 2\n")
    out_dir = tmp_path / "o"
    out_dir.mkdir()
    (out_dir / "results.jsonl").write_text('{"id": "0"}\n')  # stops the run before it loads a model
    with caplog.at_level(logging.WARNING, logger="seed_tot"):
        _fails("solve", "gsm8k", "--data", str(FIXTURES / "gsm8k_small.jsonl"), "--config", str(config),
               "--mode", "ar", "--output", str(out_dir))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "mode ar does not use k_config=(2, 2, 1), verify_batch=2" in warnings[0]


def test_solve_with_a_shipped_config_and_mode_ar_warns_about_nothing(tmp_path, caplog):
    out_dir = tmp_path / "o"
    out_dir.mkdir()
    (out_dir / "results.jsonl").write_text('{"id": "0"}\n')
    with caplog.at_level(logging.WARNING, logger="seed_tot"):
        _fails("solve", "gsm8k", "--data", str(FIXTURES / "gsm8k_small.jsonl"), "--mode", "ar",
               "--output", str(out_dir))
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_bench_refuses_flags_no_listed_mode_or_the_workload_reads():
    assert "modes ar, parallel do not use --k-config (read by sd, mcsd, seed)" in _fails(
        "bench", "--modes", "ar,parallel", "--k-config", "2,2")
    assert "workload thoughts does not use --limit" in _fails("bench", "--workload", "thoughts", "--limit", "2")
    assert "--alpha" in _fails("bench", "--alpha", "0.3")


def test_flags_that_a_mode_reads_pass_the_check():
    # sd reads --k-config: the run goes on to load its models, here a missing directory
    result = CliRunner().invoke(main, ["generate", "--mode", "sd", "--k-config", "2", "--target", "/no/such/model"])
    assert "does not use" not in result.output and "/no/such/model" in result.output
