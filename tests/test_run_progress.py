"""bench shows each run as it goes (mode, run k of n, time so far, about how long is left) and
warns under its table when fewer than 3 timed runs make its ratios load-sensitive."""
from __future__ import annotations

import io

from click.testing import CliRunner

from seed_tot.cli import main
from seed_tot.run_progress import RunProgress, bench_plan


def test_the_plan_is_bench_modes_order_with_warm_ups_before_each_modes_first_run():
    assert bench_plan(["ar", "seed"], repeats=2, warmup=1) == [
        ("ar", "warm-up 1 of 1"), ("ar", "run 1 of 2"), ("seed", "warm-up 1 of 1"), ("seed", "run 1 of 2"),
        ("ar", "run 2 of 2"), ("seed", "run 2 of 2")]


def test_the_estimate_prices_each_run_left_at_its_modes_mean_else_every_runs_mean():
    progress = RunProgress(bench_plan(["ar", "seed"], repeats=2, warmup=0), stream=io.StringIO())
    assert progress.left_s() is None  # nothing finished: no estimate rather than a made-up one
    progress.durations = {"ar": [4.0]}
    progress.done = 1  # left: seed run 1 (no seed run yet: every run's mean, 4), ar run 2 (4), seed run 2 (4)
    assert progress.left_s() == 12.0
    progress.durations = {"ar": [4.0], "seed": [1.0]}
    progress.done = 2  # left: ar run 2 at 4, seed run 2 at 1
    assert progress.left_s() == 5.0


def test_bench_off_a_terminal_says_one_line_per_run_and_warns_under_the_table_about_few_repeats():
    result = CliRunner().invoke(main, ["bench", "--synthetic", "tiny", "--device", "cpu", "--modes", "ar,sd",
                                       "--max-new-tokens", "2", "--repeats", "2", "--warmup", "1"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("bench: ")]
    assert [line.split(":")[1].strip() for line in lines] == [
        "ar warm-up 1 of 1", "ar run 1 of 2", "sd warm-up 1 of 1", "sd run 1 of 2", "ar run 2 of 2", "sd run 2 of 2"]
    assert "(1 of 6 runs, 0:" in lines[0] and "left)" in lines[0] and "left" not in lines[-1]
    assert "2 timed runs per mode" in result.stderr and "--repeats 3" in result.stderr


def test_three_repeats_need_no_warning():
    result = CliRunner().invoke(main, ["bench", "--synthetic", "tiny", "--device", "cpu", "--modes", "ar",
                                       "--max-new-tokens", "2", "--repeats", "3", "--warmup", "0"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "timed runs per mode" not in result.stderr and "run 3 of 3" in result.stderr
