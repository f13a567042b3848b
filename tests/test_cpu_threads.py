"""The engine's CPU thread choice (cpu_threads.py): which count for which cores, load and model, that
a pin wins, that the forward thread applies it, and that a run beside a busy process finishes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from click.testing import CliRunner

from seed_tot.cli import main
from seed_tot.engine import Engine
from seed_tot.engine import cpu_threads
from seed_tot.engine.cpu_threads import MIN_WORK_PER_THREAD, CpuLoad, CpuThreads, choose_threads, share

BIG = 135_000_000  # SmolLM2-135M's decode step, in multiply-adds


@pytest.mark.parametrize("cores, others, work, cap, threads", [
    (2, 0.0, BIG, None, 2),      # an idle machine: every core
    (2, 0.1, BIG, None, 2),      # background noise (a shell, a daemon) does not count
    (2, 1.0, BIG, None, 1),      # one busy neighbour on 2 cores: the free one only
    (2, 0.6, BIG, None, 1),      # a neighbour busy part of the time still parks a thread now and then
    (2, 3.5, BIG, None, 1),      # more busy than cores: never fewer than one
    (8, 3.0, BIG, None, 5),      # the cores left free
    (8, 0.0, 3 * MIN_WORK_PER_THREAD, None, 3),  # no more than the work can use
    (2, 0.0, 100_000, None, 1),  # a tiny model: a second thread does not pay
    (2, 0.0, None, None, 2),     # work not known yet (loading): the free cores
    (16, 0.0, BIG, 4, 4),        # $OMP_NUM_THREADS (Ray sets it per actor) caps the choice
])
def test_choose_threads_takes_the_free_cores_the_work_can_use(cores, others, work, cap, threads):
    assert choose_threads(cores, others, work, cap) == threads


def test_processes_on_one_machine_split_its_cores():
    assert share(2, 3) == 1 and share(16, 4) == 4 and share(16, 3) == 5 and share(1, 1) == 1


class FakeLoad:
    """Other processes' use, as the test says it is."""

    def __init__(self, cores: int, others: float):
        self.cores, self.others = cores, others

    def sample(self) -> float:
        return self.others


@pytest.fixture
def unpinned(monkeypatch):
    """Neither a pin nor a cap in the environment: the automatic choice."""
    monkeypatch.delenv("SEED_TOT_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)


def test_the_choice_follows_the_load_and_counts_its_changes(unpinned):
    load = FakeLoad(2, 0.0)
    threads, applied = CpuThreads(work=BIG, recheck_s=0.0, load=load), []
    threads.update(applied.append)
    load.others = 1.2  # a neighbour starts
    threads.update(applied.append)
    threads.update(applied.append)  # unchanged: not applied again
    load.others = 0.0  # it stops
    threads.update(applied.append)
    assert applied == [2, 1, 2]
    assert threads.report() == {"setting": "auto", "threads": 2, "min": 1, "max": 2, "changes": 2, "cores": 2}


def test_the_machine_is_looked_at_again_only_after_recheck_s(unpinned):
    load = FakeLoad(2, 0.0)
    threads, applied = CpuThreads(work=BIG, recheck_s=3600.0, load=load), []
    threads.update(applied.append)
    load.others = 2.0
    threads.update(applied.append)  # within recheck_s: the step loop pays one clock read, no look
    assert applied == [2]
    threads.recheck()
    threads.update(applied.append)
    assert applied == [2, 1]


@pytest.mark.parametrize("how", ["argument", "env"])
def test_a_pin_wins_over_the_load(monkeypatch, how):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("SEED_TOT_THREADS", raising=False)
    if how == "env":
        monkeypatch.setenv("SEED_TOT_THREADS", "3")
    threads, applied = CpuThreads(pinned=3 if how == "argument" else None, work=BIG, recheck_s=0.0,
                                  load=FakeLoad(2, 2.0)), []
    threads.update(applied.append)
    assert applied == [3] and threads.setting == "pinned 3"


def test_omp_num_threads_caps_the_automatic_choice(monkeypatch):
    monkeypatch.delenv("SEED_TOT_THREADS", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    threads, applied = CpuThreads(work=BIG, recheck_s=0.0, load=FakeLoad(8, 0.0)), []
    threads.update(applied.append)
    assert applied == [1] and "at most 1" in threads.setting


@pytest.mark.parametrize("value", ["two", "0", "-1"])
def test_a_bad_thread_setting_in_the_environment_names_the_variable(monkeypatch, value):
    monkeypatch.setenv("SEED_TOT_THREADS", value)
    with pytest.raises(ValueError, match=r"\$SEED_TOT_THREADS="):
        CpuThreads()


def test_other_processes_use_is_busy_time_less_this_process_own(tmp_path, monkeypatch):
    """/proc/stat's per-CPU busy ticks over the stretch, minus this process's CPU time, per second."""
    stat = tmp_path / "stat"
    monkeypatch.setattr(cpu_threads, "PROC_STAT", stat)
    monkeypatch.setattr(cpu_threads.os, "sysconf", lambda name: 100)
    clock, own = iter([10.0, 12.0, 12.01]), iter([1.0, 2.0, 2.0])  # 2 s of wall, 1 s of our own CPU
    monkeypatch.setattr(cpu_threads.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(cpu_threads, "_own_cpu_s", lambda: next(own))

    def write(busy0: int, busy1: int, cpu2: int) -> None:  # user ticks; idle 1000 each; cpu2 is not ours
        stat.write_text(f"cpu  {busy0 + busy1} 0 0 2000 0 0 0 0 0 0\n"
                        f"cpu0 {busy0} 0 0 1000 5 0 0 0 0 0\ncpu1 {busy1} 0 0 1000 0 0 0 0 0 0\n"
                        f"cpu2 {cpu2} 0 0 1000 0 0 0 0 0 0\nintr 1 2 3\n")

    load = CpuLoad(cpus=[0, 1])
    write(0, 0, 0)
    load.sample()
    write(200, 100, 500)  # 3 s busy on our 2 cores in 2 s, 1 of it ours: others 1 core
    assert load.sample() == pytest.approx(1.0)
    write(201, 100, 500)  # 10 ms later: too short a stretch for 10 ms ticks, the last figure stands
    assert load.sample() == pytest.approx(1.0)


def test_the_forward_thread_applies_the_choice_to_its_own_forwards(llama_pair, unpinned):
    engine = Engine(*llama_pair)
    try:
        engine.pin_threads(2)
        assert engine.forward_thread.call(torch.get_num_threads) == 2
        engine.pin_threads(None)  # automatic: the tests' tiny models gain nothing from a second thread
        assert engine.forward_thread.call(torch.get_num_threads) == 1
        assert engine.threads_report()["setting"] == "auto"
    finally:
        engine.forward_thread.call(torch.set_num_threads, 1)


def _generate(*args: str) -> str:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.mark.parametrize("how", ["flag", "env"])
def test_threads_flag_and_env_pin_what_generate_reports(tiny_model_dirs, monkeypatch, how):
    target, _ = tiny_model_dirs
    monkeypatch.delenv("SEED_TOT_THREADS", raising=False)  # restored after: the flag writes the environment
    if how == "env":
        monkeypatch.setenv("SEED_TOT_THREADS", "2")
    flag = ["--threads", "2"] if how == "flag" else []
    out = _generate("generate", "Hi", "--target", target, "--mode", "ar", "--max-new-tokens", "3", *flag)
    assert "threads 2 (pinned 2" in out
    line = _generate("generate", "Hi", "--target", target, "--mode", "ar", "--max-new-tokens", "3", "--json", *flag)
    assert json.loads(line.splitlines()[0])["threads"]["setting"] == "pinned 2"
    torch.set_num_threads(1)


def test_threads_flag_rejects_zero(tiny_model_dirs):
    result = CliRunner().invoke(main, ["generate", "Hi", "--target", tiny_model_dirs[0], "--threads", "0"])
    assert result.exit_code == 2 and "--threads" in result.output


NEIGHBOUR = textwrap.dedent("""
    import time, torch
    a = torch.randn(256, 256)
    end = time.monotonic() + {seconds}
    while time.monotonic() < end:
        a = torch.tanh(a @ a)
""")


def test_generate_finishes_beside_a_busy_pytorch_process(tiny_model_dirs, tmp_path):
    """Not its speed (a unit test times nothing): that a run beside a process keeping torch's default
    threads busy ends, with its automatic choice, and says what it chose."""
    target, draft = tiny_model_dirs
    env = {k: v for k, v in os.environ.items() if k not in ("SEED_TOT_THREADS", "OMP_NUM_THREADS")}
    neighbour = subprocess.Popen([sys.executable, "-c", NEIGHBOUR.format(seconds=60)], env=env)
    try:
        run = subprocess.run([sys.executable, "-m", "seed_tot.cli", "generate", "Hi", "--target", target, "--draft",
                              draft, "--mode", "seed", "--max-new-tokens", "8"],
                             env=env, capture_output=True, text=True, timeout=240)
    finally:
        neighbour.kill()
        neighbour.wait()
    assert run.returncode == 0, run.stderr
    assert "threads 1 (auto" in run.stdout  # a tiny model: one thread, whatever the load


def test_solve_records_the_thread_choice_in_its_summary(tiny_model_dirs, tmp_path, unpinned):
    target, draft = tiny_model_dirs
    _generate("solve", "gsm8k", "--data", "tests/fixtures/gsm8k_small.jsonl", "--limit", "1", "--mode", "ar",
              "--target", target, "--max-new-tokens", "6", "--output", str(tmp_path / "run"))
    threads = json.loads((tmp_path / "run" / "summary.json").read_text())["cpu_threads"]
    assert threads["setting"] == "auto" and threads["threads"] == 1  # a tiny model: one thread


def test_bench_shows_the_thread_choice(unpinned):
    result = CliRunner().invoke(main, ["bench", "--synthetic", "tiny", "--device", "cpu", "--modes", "ar",
                                       "--max-new-tokens", "2", "--repeats", "1", "--threads", "1"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "| threads 1 (pinned 1" in result.stdout
