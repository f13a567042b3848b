"""--resume never mixes datasets: run.json records where the problems came from (a data file's path
and digest, or the task's generator and seed), and a resume from another source is refused before
any model loads, naming both, with nothing in the run directory changed."""
from __future__ import annotations

import json
import shutil

from click.testing import CliRunner

from seed_tot.cli import main
from seed_tot.search.data_source import data_source, same_source
from seed_tot.tasks.blocksworld import Blocksworld

FIXTURES = "tests/fixtures"


def _solve(*args: str):
    return CliRunner().invoke(main, ["solve", *args, "--mode", "ar", "--temperature", "0", "--max-new-tokens", "6"])


def _snapshot(directory) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def _first_run(tmp_path, target, task="blocksworld", data=f"{FIXTURES}/blocksworld_small.jsonl"):
    out = tmp_path / "run"
    result = _solve(task, "--data", data, "--limit", "1", "--target", target, "--output", str(out))
    assert result.exit_code == 0, result.output
    return out


def test_run_json_records_the_data_file_and_its_digest(tmp_path, tiny_model_dirs):
    out = _first_run(tmp_path, tiny_model_dirs[0])
    recorded = json.loads((out / "run.json").read_text())["data"]
    assert recorded == data_source(None, f"{FIXTURES}/blocksworld_small.jsonl")
    assert len(recorded["sha256"]) == 64 and recorded["file"].endswith("blocksworld_small.jsonl")


def test_a_resume_without_data_after_a_file_run_is_refused_naming_both_and_changing_nothing(tmp_path,
                                                                                        tiny_model_dirs):
    """The reported case: a file run resumed without --data appended generated random-N instances."""
    out = _first_run(tmp_path, tiny_model_dirs[0])
    before = _snapshot(out)
    missing = str(tmp_path / "no-such-model")  # loading it would fail: the refusal must come first
    result = _solve("blocksworld", "--limit", "3", "--target", missing, "--output", str(out), "--resume")
    message = result.output + str(result.exception or "")
    assert result.exit_code != 0
    assert "blocksworld_small.jsonl" in message and "generator" in message and "seed 0" in message
    assert "no-such-model" not in message
    assert _snapshot(out) == before


def test_a_resume_from_an_edited_file_is_refused_and_a_copied_file_resumes(tmp_path, tiny_model_dirs):
    target = tiny_model_dirs[0]
    out = _first_run(tmp_path, target, "gsm8k", f"{FIXTURES}/gsm8k_small.jsonl")
    edited = tmp_path / "edited.jsonl"
    lines = open(f"{FIXTURES}/gsm8k_small.jsonl").read().splitlines()
    edited.write_text("\n".join(lines + [lines[-1].replace('"id"', '"id_"')]) + "\n")  # one more problem
    before = _snapshot(out)
    result = _solve("gsm8k", "--data", str(edited), "--limit", "2", "--target", target, "--output", str(out),
                    "--resume")
    assert result.exit_code != 0 and "edited.jsonl" in result.output and "gsm8k_small.jsonl" in result.output
    assert _snapshot(out) == before
    copy = tmp_path / "copy.jsonl"
    shutil.copy(f"{FIXTURES}/gsm8k_small.jsonl", copy)  # the same records elsewhere: the same source
    result = _solve("gsm8k", "--data", str(copy), "--limit", "2", "--target", target, "--output", str(out),
                    "--resume")
    assert result.exit_code == 0, result.output
    assert len((out / "results.jsonl").read_text().splitlines()) == 2


def test_a_run_json_without_a_source_resumes_and_records_it_unless_no_record_was_requested(tmp_path,
                                                                                           tiny_model_dirs):
    """Directories written before the source was recorded: a resume over the same problems goes on
    and records its source; one whose requested problems include none of the records is refused."""
    target = tiny_model_dirs[0]
    out = _first_run(tmp_path, target)
    identity = json.loads((out / "run.json").read_text())
    del identity["data"]
    (out / "run.json").write_text(json.dumps(identity))
    before = _snapshot(out)
    result = _solve("blocksworld", "--limit", "2", "--target", target, "--output", str(out), "--resume")
    assert result.exit_code != 0 and "does not record the data" in (result.output + str(result.exception))
    assert _snapshot(out) == before
    result = _solve("blocksworld", "--data", f"{FIXTURES}/blocksworld_small.jsonl", "--limit", "2",
                    "--target", target, "--output", str(out), "--resume")
    assert result.exit_code == 0, result.output
    assert json.loads((out / "run.json").read_text())["data"]["file"].endswith("blocksworld_small.jsonl")


def test_generated_sources_differ_by_seed_and_files_by_content(tmp_path):
    assert same_source(data_source(Blocksworld(seed=0), None), data_source(Blocksworld(seed=0), None))
    assert not same_source(data_source(Blocksworld(seed=0), None), data_source(Blocksworld(seed=1), None))
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text('{"x": 1}\n')
    b.write_text('{"x": 2}\n')
    assert not same_source(data_source(None, a), data_source(None, b))
