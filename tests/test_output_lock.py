"""One run at a time per output folder (results_file.lock_output), and examples handed to the API
checked as the CLI checks a task's load (expansion.check_examples)."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from seed_tot.search import ResultsFileError, load_settings, solve_dataset
from seed_tot.search.protocol import Example
from seed_tot.search.results_file import check_output_free, lock_output
from seed_tot.search.solve import ResultsRecorder
from short_task import ShortTask

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="flock is POSIX")


def recorder(out, resume: bool = False) -> ResultsRecorder:
    task = ShortTask()
    examples = [Example(id="0", data={"question": "ab"})]
    return ResultsRecorder(task, examples, settings=load_settings(None, task.config), algorithm="bfs", output_dir=out,
                           resume=resume)


def test_a_second_run_on_one_output_folder_is_refused_naming_the_first(tmp_path):
    with recorder(tmp_path):
        with pytest.raises(ResultsFileError, match=r"another run is writing to this folder \(pid \d+"):
            recorder(tmp_path, resume=True)
        with pytest.raises(ResultsFileError, match="another run"):
            check_output_free(tmp_path)
    with recorder(tmp_path, resume=True):  # released when the first run's recorder closes
        pass


def test_a_refused_recorder_or_a_failed_one_leaves_the_folder_free(tmp_path):
    (tmp_path / "results.jsonl").write_text('{"id": "0"}\n', encoding="utf-8")
    with pytest.raises(ResultsFileError, match="already holds"):  # no --resume: refused after locking
        recorder(tmp_path)
    check_output_free(tmp_path)
    lock = lock_output(tmp_path)
    lock.close()


def test_the_lock_holds_across_processes_and_dies_with_its_holder(tmp_path):
    script = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from seed_tot.search.results_file import lock_output
        lock = lock_output(Path({str(tmp_path)!r}))
        print("locked", flush=True)
        sys.stdin.readline()
    """)
    holder = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(ResultsFileError, match=f"pid {holder.pid}"):
            check_output_free(tmp_path)
    finally:
        holder.kill()  # killed, not closed: the operating system drops its lock
        holder.wait()
    check_output_free(tmp_path)


class _NoEngine:
    def generate(self, *args, **kwargs):
        raise AssertionError("bad examples must be refused before any call")


@pytest.mark.parametrize("examples,expected", [
    ({"0": {"question": "ab"}}, "solve_dataset was given {'0'"),
    ([{"id": "0", "question": "ab"}], "solve_dataset was given a dict at position 0"),
    ([Example(id=0, data={"question": "ab"})], "an Example with id 0 (int) at position 0"),
])
def test_solve_dataset_refuses_examples_that_are_not_a_list_of_examples(tmp_path, examples, expected):
    task = ShortTask()
    with pytest.raises(TypeError) as err:
        solve_dataset(_NoEngine(), task, examples, settings=load_settings(None, task.config), output_dir=tmp_path)
    assert expected in str(err.value)
    assert not (tmp_path / "results.jsonl").exists()


def test_the_cli_refuses_a_folder_another_run_holds_before_loading_models(tmp_path):
    from click.testing import CliRunner

    from seed_tot.cli import main

    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    out.mkdir()
    lock = lock_output(out)
    try:
        result = CliRunner().invoke(main, ["solve", "gsm8k", "--data", str(data), "--output", str(out),
                                           "--target", str(tmp_path / "no-such-model")])
    finally:
        lock.close()
    assert result.exit_code != 0
    assert "another run is writing to this folder" in result.output
