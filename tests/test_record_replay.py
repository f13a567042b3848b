"""benchmarks/record_replay.py: a recording of another task holds that task's whole greedy solves
(every call its workload's, each row the target's own greedy tokens), text_draft_replay.py replays
it, and the embedded GSM8K recording the GPU presets read is never overwritten by another task's."""
from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from conftest import reference_greedy, save_char_tokenizer, tiny_model
from seed_tot.replay import DEFAULT_RECORDING, load_recording

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory) -> Path:
    """A tiny target with a real (char-level) tokenizer whose positions reach a Blocksworld prompt."""
    root = tmp_path_factory.mktemp("record-target")
    vocab = save_char_tokenizer(root)
    model = tiny_model("llama", seed=7, vocab=vocab, eos=vocab - 1)
    model.config.max_position_embeddings = 8192  # rotary: the length bound is the config's only
    model.save_pretrained(root)
    return root


def test_a_blocksworld_recording_holds_the_targets_greedy_solves_and_replays(target_dir, tmp_path):
    out = tmp_path / "blocksworld-tiny.jsonl.gz"
    runpy.run_path(str(BENCHMARKS / "record_replay.py"))["main"](
        ["--workload", "tot-blocksworld", "--limit", "1", "--max-new-tokens", "6", "--target", str(target_dir),
         "--output", str(out)])
    recording = load_recording(out)
    assert recording.header["workload"] == "tot-blocksworld" and recording.header["data"] == "blocksworld_small.jsonl"
    assert recording.calls and {c["workload"] for c in recording.calls} == {"tot-blocksworld"}  # no tot-step
    assert {c["phase"] for c in recording.calls} >= {"thought"}
    model = tiny_model("llama", seed=7, vocab=recording.vocab_size, eos=recording.vocab_size - 1)
    first = recording.calls[0]["rows"][0]
    expected = reference_greedy(model, first["prompt"], len(first["output"]))  # a stop string may end a row early
    assert first["output"] and first["output"] == expected[:len(first["output"])]
    assert (out.parent / recording.header["tokenizer"]).is_file()

    lines = runpy.run_path(str(BENCHMARKS / "text_draft_replay.py"))["main"](
        ["--recording", str(out), "--workload", "tot-blocksworld", "--drafters", "lookup"])
    rows = sum(line["rows"] for line in lines)
    assert rows == sum(len(c["rows"]) for c in recording.calls)
    assert sum(line["tokens"] for line in lines) == sum(len(r["output"]) for c in recording.calls for r in c["rows"])


def test_another_tasks_recording_needs_its_own_output(capsys):
    record = runpy.run_path(str(BENCHMARKS / "record_replay.py"))["main"]
    with pytest.raises(SystemExit):
        record(["--workload", "tot-creative-writing", "--output", str(DEFAULT_RECORDING)])
    assert "give --output too" in capsys.readouterr().err
