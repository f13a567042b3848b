"""Task data and predictions files: duplicate ids, empty files, another task's file, bad windows."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from seed_tot.cli import main
from seed_tot.search import RunSettings, solve_dataset
from seed_tot.search.protocol import Example
from seed_tot.tasks import get_task
from seed_tot.tasks.loading import DataError

FIXTURES = Path(__file__).parent / "fixtures"
GSM8K_LINES = (FIXTURES / "gsm8k_small.jsonl").read_text().splitlines()


def fails(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    return result.output


def test_duplicate_id_in_data_names_the_file_both_lines_and_the_id(tmp_path: Path):
    data = tmp_path / "bw.jsonl"
    lines = (FIXTURES / "blocksworld_small.jsonl").read_text().splitlines()
    second = json.loads(lines[1])
    second["id"] = json.loads(lines[0])["id"]  # PlanBench reuses names across block counts
    data.write_text(lines[0] + "\n\n" + json.dumps(second) + "\n")
    with pytest.raises(DataError, match=rf"{data}:1 and {data}:3: both have id 'fixture-0'"):
        get_task("blocksworld").load(str(data))
    assert "bw.jsonl:1 and" in fails("solve", "blocksworld", "--data", str(data), "--output", str(tmp_path / "o"))


def test_solve_refuses_two_different_examples_sharing_an_id(tmp_path: Path):
    examples = [Example("a", {"question": "1"}), Example("a", {"question": "2"})]
    with pytest.raises(ValueError, match="example 0 and example 1: both have id 'a'"):
        solve_dataset(None, get_task("gsm8k"), examples, settings=RunSettings(), output_dir=tmp_path)


def _predictions(tmp_path: Path, rows: list[dict]) -> Path:
    file = tmp_path / "pred.jsonl"
    file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return file


def test_score_refuses_a_prediction_id_given_twice(tmp_path: Path):
    data = tmp_path / "gsm.jsonl"
    data.write_text("\n".join(GSM8K_LINES) + "\n")
    pred = _predictions(tmp_path, [{"id": "0", "prediction": "7"}, {"id": "1", "prediction": "1200"},
                                   {"id": "0", "prediction": "8"}])
    out = fails("score", "gsm8k", "--data", str(data), "--predictions", str(pred))
    assert f"{pred}:1 and {pred}:3: both have id '0'" in out


def test_score_reports_data_ids_without_a_prediction(tmp_path: Path):
    data = tmp_path / "gsm.jsonl"
    data.write_text("\n".join(GSM8K_LINES) + "\n")
    pred = _predictions(tmp_path, [{"id": "0", "prediction": "The answer is 7"}])
    result = CliRunner().invoke(main, ["score", "gsm8k", "--data", str(data), "--predictions", str(pred), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["n"] == 1 and out["correct"] == 1 and out["no_prediction"] == len(GSM8K_LINES) - 1


@pytest.mark.parametrize("task,suffix", [("gsm8k", ".jsonl"), ("creative_writing", ".txt"),
                                         ("blocksworld", ".jsonl")])
@pytest.mark.parametrize("content", ["", "  \n\n\t\n"], ids=["empty", "whitespace"])
def test_empty_data_file_is_one_line_naming_the_file(tmp_path: Path, task: str, suffix: str, content: str):
    data = tmp_path / f"data{suffix}"
    data.write_text(content)
    with pytest.raises(DataError, match=rf"{data}: no records \(the file is empty or blank\); expected"):
        get_task(task).load(str(data))
    out = fails("solve", task, "--data", str(data), "--output", str(tmp_path / "o"))
    assert f"{data}: no records" in out


def test_another_tasks_jsonl_given_to_a_text_task_is_refused(tmp_path: Path):
    with pytest.raises(DataError, match=r"gsm8k_small.jsonl:1: found a JSON object, expected plain text"):
        get_task("creative_writing").load(str(FIXTURES / "gsm8k_small.jsonl"))


@pytest.mark.parametrize("content", ["", '{"sentences": "a. b. c. d."}\n'], ids=["empty", "json"])
def test_a_text_tasks_data_error_reads_as_english_whatever_the_field_is_called(tmp_path: Path, content: str):
    data = tmp_path / "cw.txt"
    data.write_text(content)
    with pytest.raises(DataError) as err:
        get_task("creative_writing").load(str(data))
    assert "one sentences" not in str(err.value)
    assert "plain text with one record per line, each line read as its 'sentences'" in str(err.value)


@pytest.mark.parametrize("command", [["solve", "gsm8k", "--output", "o"],
                                     ["score", "gsm8k", "--predictions", str(FIXTURES / "gsm8k_small.jsonl")],
                                     ["bench", "--workload", "tot-gsm8k"], ["bench"]])
def test_data_naming_a_directory_says_it_is_a_directory_not_that_it_is_missing(tmp_path: Path, command: list[str]):
    result = CliRunner().invoke(main, [*command, "--data", str(tmp_path)])
    assert result.exit_code == 2, result.output  # a usage error, before any model loads
    assert f"{tmp_path} is a directory; pass the data file itself" in result.output
    assert "no such file" not in result.output


def test_a_text_file_given_to_a_jsonl_task_is_refused():
    with pytest.raises(DataError, match=r"creative_writing_small.txt:1: expected one JSON object per line"):
        get_task("gsm8k").load(str(FIXTURES / "creative_writing_small.txt"))


@pytest.mark.parametrize("args,words", [(["--limit", "-1"], "--limit must be at least 1, got -1"),
                                        (["--limit", "0"], "--limit must be at least 1, got 0"),
                                        (["--offset", "-2"], "--offset must be at least 0, got -2"),
                                        (["--offset", "99"], "--offset 99 is past the end")])
def test_bad_limit_or_offset_is_an_error(tmp_path: Path, args: list[str], words: str):
    out = fails("solve", "gsm8k", "--data", str(FIXTURES / "gsm8k_small.jsonl"), *args,
                "--output", str(tmp_path / "o"))
    assert words in out


def test_offset_past_generated_instances_is_an_error(tmp_path: Path):
    out = fails("solve", "blocksworld", "--offset", "10", "--output", str(tmp_path / "o"))
    assert "no problems to solve" in out and "--offset 10" in out


def test_a_data_file_that_is_not_utf8_names_the_file_and_line(tmp_path: Path):
    bad = tmp_path / "latin1.jsonl"
    bad.write_bytes((GSM8K_LINES[0] + "\n" + '{"question": "caf\xe9", "answer": "#### 1"}\n').encode("latin-1"))
    with pytest.raises(DataError, match=rf"{bad}:2: not UTF-8 text \(byte 0xe9 at column 18\)"):
        get_task("gsm8k").load(str(bad))
    assert f"{bad}:2: not UTF-8 text" in fails("solve", "gsm8k", "--data", str(bad), "--output", str(tmp_path / "o"))


def test_a_predictions_file_that_is_not_utf8_names_the_file_and_line(tmp_path: Path):
    data = tmp_path / "data.jsonl"
    data.write_text(GSM8K_LINES[0] + "\n")
    bad = tmp_path / "preds.jsonl"
    bad.write_bytes('{"id": "0", "prediction": "12\xa0"}\n'.encode("latin-1"))
    assert f"{bad}:1: not UTF-8 text" in fails("score", "gsm8k", "--data", str(data), "--predictions", str(bad))


def test_a_data_file_saved_with_a_utf8_bom_loads_as_without_one(tmp_path: Path):
    # editors on Windows save UTF-8 with a byte-order mark: JSONL was refused ("Unexpected UTF-8 BOM
    # (decode using utf-8-sig)"), and a text task kept it in its first sentence, so that a passage
    # ending in that sentence scored 0.75
    jsonl = tmp_path / "gsm.jsonl"
    jsonl.write_text("\ufeff" + "\r\n".join(GSM8K_LINES) + "\r\n", encoding="utf-8")
    plain = tmp_path / "gsm-plain.jsonl"
    plain.write_text("\n".join(GSM8K_LINES) + "\n", encoding="utf-8")
    assert get_task("gsm8k").load(str(jsonl)) == get_task("gsm8k").load(str(plain))

    task = get_task("creative_writing")
    lines = (FIXTURES / "creative_writing_small.txt").read_text(encoding="utf-8").splitlines()
    text = tmp_path / "cw.txt"
    text.write_text("\ufeff" + "\n".join(lines) + "\n", encoding="utf-8")
    example = task.load(str(text))[0]
    assert example == task.load(str(FIXTURES / "creative_writing_small.txt"))[0]
    passage = "\n\n".join(f"Some words first. {s}" for s in task.endings(example))
    assert task.score(example, passage)["ends_match"]


@pytest.mark.parametrize("indent", [None, 2], ids=["one-line", "pretty"])
def test_a_json_array_file_is_refused_saying_it_is_an_array_not_jsonl(tmp_path: Path, indent):
    # the pretty-printed array said "line 1: expected one JSON object per line (Expecting value)" of its "["
    data = tmp_path / "gsm.json"
    data.write_text(json.dumps([json.loads(line) for line in GSM8K_LINES], indent=indent))
    with pytest.raises(DataError, match=rf"{data}:1: found a JSON array; expected JSONL, one JSON object per line"):
        get_task("gsm8k").load(str(data))
