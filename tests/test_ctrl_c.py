"""Ctrl-C (a SIGINT to the process, as a terminal sends it) stops every command: the engine's threads
stop at their next step, the process exits 130 with one line for a person, never aborts in C++, and a
second Ctrl-C ends it at once. Real subprocesses of the CLI on tiny models.

The time bounds are bounds on hanging (a command that ignored Ctrl-C ran on for minutes), generous
for a loaded 2-core CI machine, not speed tests."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

STOP_BOUND_S = 60.0  # from the SIGINT to the exit
START_BOUND_S = 180.0  # from the start to the point the test interrupts (torch import, model load)


@pytest.fixture(autouse=True)
def children_hear_ctrl_c():
    """The subprocesses take SIGINT as a terminal's process does. A test run started in the background
    by a non-interactive shell (`cmd &`, nohup) inherits SIGINT ignored, exec keeps an ignored signal
    ignored, and Python then installs no handler of its own, as it should for a user's `nohup seed-tot
    ...`: so this process handles it while the tests run (a handled signal resets to default at exec)."""
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    if ignored:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


class Command:
    """A `seed-tot` subprocess whose stderr is read as it comes."""

    def __init__(self, *args: str, cwd=None):
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen([sys.executable, "-m", "seed_tot.cli", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=env, cwd=cwd)
        self.err = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for chunk in iter(lambda: self.proc.stderr.read1(4096), b""):
            self.err += chunk.decode(errors="replace")

    def wait_for(self, text: str) -> None:
        deadline = time.monotonic() + START_BOUND_S
        while text not in self.err:
            assert self.proc.poll() is None, f"ended before {text!r}:\n{self.err}"
            assert time.monotonic() < deadline, f"no {text!r} after {START_BOUND_S} s:\n{self.err}"
            time.sleep(0.1)

    def interrupt(self) -> float:
        """SIGINT, then the seconds until the process ended."""
        start = time.monotonic()
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(STOP_BOUND_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            pytest.fail(f"still running {STOP_BOUND_S} s after Ctrl-C:\n{self.err}")
        self._reader.join(10)
        return time.monotonic() - start

    def lines(self) -> list[str]:
        """stderr's lines, a progress bar's redraws (\\r) each its own."""
        return [part for line in self.err.splitlines() for part in line.split("\r") if part.strip()]


def assert_one_line_for_a_person(cmd: Command, *words: str) -> str:
    assert cmd.proc.returncode == 130, cmd.err
    assert "terminate called" not in cmd.err and "Traceback" not in cmd.err and "Aborted!" not in cmd.err, cmd.err
    said = [line for line in cmd.lines() if "interrupted" in line]
    assert len(said) == 1 and said[0].startswith("seed-tot: interrupted"), cmd.err  # no log record, no repeat
    assert said[0] == cmd.lines()[-1], cmd.err  # the last word
    for word in words:
        assert word in said[0], said[0]
    return said[0]


def test_ctrl_c_stops_train_drafter_while_it_generates(tmp_path, tiny_model_dirs):
    """The forward thread ran on for minutes after Ctrl-C: it now stops at its next step."""
    target, _ = tiny_model_dirs
    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(json.dumps({"question": f"Tom has {i} apples. How many has he?"})
                              for i in range(200)) + "\n")
    cmd = Command("train-drafter", "--target", target, "--data", str(data), "--k", "2", "--steps", "5",
                  "--out", str(tmp_path / "drafter"), "--tasks", "gsm8k", "--heldout", "1", "--max-examples", "199",
                  "--max-new-tokens", "400", "--gen-batch", "4", "--context", "32", "--device", "cpu")
    cmd.wait_for("target responses")
    time.sleep(1.0)
    cmd.interrupt()
    assert_one_line_for_a_person(cmd, "no data or checkpoint was saved yet")
    assert not (tmp_path / "drafter" / "data.safetensors").exists()  # generation stopped, did not run on to the end


@pytest.mark.parametrize("concurrency", ["1", "2"])
def test_ctrl_c_stops_a_solve_and_says_what_resume_finishes(tmp_path, tiny_model_dirs, concurrency):
    target, draft = tiny_model_dirs
    out = tmp_path / "run"
    args = ["solve", "gsm8k", "--data", "tests/fixtures/gsm8k_small.jsonl", "--mode", "seed", "--draft-policy", "fixed",
            "--target", target, "--draft", draft, "--temperature", "0", "--max-new-tokens", "200",
            "--concurrency", concurrency, "--output", str(out)]
    cmd = Command(*args)
    cmd.wait_for("gsm8k:")  # the progress bar: models loaded, searches started
    time.sleep(1.0)
    cmd.interrupt()
    line = assert_one_line_for_a_person(cmd, str(out / "results.jsonl"), "--resume")
    kept = (out / "results.jsonl").read_text().splitlines() if (out / "results.jsonl").exists() else []
    assert f"{len(kept)} of " in line
    assert all(json.loads(record)["id"] for record in kept)  # every line whole


def test_ctrl_c_while_models_load_exits_within_the_bound(tmp_path, tiny_model_dirs):
    """Interrupted before anything ran (here: while torch imports or the models load)."""
    target, draft = tiny_model_dirs
    cmd = Command("generate", "Hi", "--target", target, "--draft", draft, "--max-new-tokens", "300", "-n", "4",
                  "--mode", "parallel")
    time.sleep(2.0)
    cmd.interrupt()
    assert_one_line_for_a_person(cmd)


def test_a_second_ctrl_c_ends_the_process_at_once():
    """A first Ctrl-C whose stop hangs (here: swallowed, then a long sleep, as a stuck load would) must
    not need a kill: the second ends the process at once, with 130 and no C++ abort."""
    script = ("import time\n"
              "from seed_tot.interrupt import CtrlC\n"
              "CtrlC().install()\n"
              "try:\n"
              "    print('ready', flush=True); time.sleep(120)\n"
              "except KeyboardInterrupt:\n"
              "    print('stopping', flush=True); time.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGINT)
    assert proc.stdout.readline() == "stopping\n"  # the first one only raised KeyboardInterrupt
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(STOP_BOUND_S)  # the script would sleep 120 s more
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("a second Ctrl-C did not end the process")
    err = proc.stderr.read()
    assert proc.returncode == 130 and err == "seed-tot: interrupted again; stopped at once\n", err
