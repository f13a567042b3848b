"""The replay oracle (seed_tot/replay.py): the replay-* synthetic presets' target follows the recorded
SmolLM2-135M ToT run shipped in benchmarks/replay/, text drafts find that text (and nothing on the
hash oracle's), and every drafting policy still outputs exactly the target's tokens."""
from __future__ import annotations

import gzip
import json

import pytest
import torch

from seed_tot.engine.params import SamplingParams
from seed_tot.replay import DEFAULT_RECORDING, FORMAT, Recording, ReplayError, ReplayTable, load_recording
from seed_tot.synthetic import build_synthetic_engine


@pytest.fixture(scope="module")
def recording():
    return load_recording()


@pytest.fixture(scope="module")
def replay_engine():
    return build_synthetic_engine("replay-tiny", alpha=0.6, device="cpu", dtype="float32")


def _greedy(n: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, temperature=0.0)


def _acceptance(results) -> float:
    depth = sum(r.stats.draft_depth for r in results)
    return sum(r.stats.accepted for r in results) / depth if depth else 0.0


def test_the_shipped_recording_is_small_and_holds_both_workloads(recording):
    assert recording.header["format"] == FORMAT and recording.vocab_size == 49152
    assert {c["workload"] for c in recording.calls} == {"tot-step", "tot-gsm8k"}
    assert {c["phase"] for c in recording.calls if c["workload"] == "tot-gsm8k"} >= {"thought", "value"}
    size = DEFAULT_RECORDING.stat().st_size + (DEFAULT_RECORDING.parent / recording.header["tokenizer"]).stat().st_size
    assert size < 600_000


def test_a_recorded_prompt_generates_the_recorded_output_under_ar(replay_engine, recording):
    """Every row the table replays without a drift (no earlier row holds another next token at one
    of its (token, position) keys), given its prompt ids, writes its recorded output token for token
    (the hash oracle would write other tokens); the rows that drift write recorded text too."""
    table = replay_engine.target.replay
    rows = list(recording.streams())
    exact = [row for row, ok in zip(rows, table.exact) if ok]
    assert table.exact[0] and len(exact) >= len(rows) // 3
    results = replay_engine.generate([p for p, _ in exact], _greedy(max(len(o) for _, o in exact)), mode="ar")
    for (_, output), result in zip(exact, results):
        assert result.token_ids[:len(output)] == output
    # and the same from the prompt's text: the shipped tokenizer encodes it to the recorded ids
    prompt, output = rows[0]
    text = replay_engine.tokenizer.decode(prompt, skip_special_tokens=False)
    assert replay_engine.generate([text], _greedy(len(output)), mode="ar")[0].token_ids == output


def test_the_table_keeps_the_first_stream_and_follows_the_nearest_occurrence_off_position():
    rec = Recording(DEFAULT_RECORDING, {"vocab_size": 100}, [
        {"rows": [{"prompt": [5, 6], "output": [7, 8, 9]}]},
        {"rows": [{"prompt": [1, 6], "output": [7, 3, 4]}]},  # (7 at 2) again: the first stream's 8 stays
    ])
    table = ReplayTable(rec)
    assert table.conflicts == 1
    tokens, positions = torch.tensor([[6, 7, 8, 3, 8, 42]]), torch.tensor([[1, 2, 3, 3, 10, 4]])
    got = table.lookup(tokens, positions, torch.full_like(tokens, -1))
    # recorded; recorded (first wins); recorded; recorded; off position: 8's occurrence at 3; never seen
    assert got.tolist() == [[7, 8, 9, 4, 9, -1]]


def test_text_drafts_accept_replayed_text_and_find_nothing_in_hash_text(replay_engine, recording):
    prompts = list(dict.fromkeys(replay_engine.tokenizer.decode(r["prompt"], skip_special_tokens=False)
                                 for r in recording.calls[0]["rows"]))
    hashed = build_synthetic_engine("tiny", alpha=0.6, device="cpu", dtype="float32")
    for policy in ("lookup", "suffix"):
        replayed = replay_engine.generate(prompts, _greedy(48), mode="seed", draft_policy=policy)
        assert _acceptance(replayed) > 0.2, policy
        assert _acceptance(hashed.generate(prompts, _greedy(48), mode="seed", draft_policy=policy)) < 0.05, policy


@pytest.mark.parametrize("policy", ["fixed", "lookup", "suffix", "choose"])
def test_greedy_output_under_replay_equals_the_target_alone(replay_engine, recording, policy):
    """seed with the draft model, prompt lookup, the suffix source and the choice: ar's tokens, on
    recorded prompts and on one the recording never saw (the oracle's fallbacks)."""
    prompts = [r["prompt"] for r in recording.calls[0]["rows"][::3]]  # tot-step's 3 thought prompts
    prompts += [r["prompt"] for r in recording.calls[-2]["rows"]]  # the last problem's last value call
    prompts.append(replay_engine.encode(["A prompt the recording never saw: 17 + 25 ="])[0])
    params = SamplingParams(max_new_tokens=40, temperature=0.0, search_key="replay-test", phase="thought")
    reference = [r.token_ids for r in replay_engine.generate(prompts, params, mode="ar")]
    assert [r.token_ids for r in replay_engine.generate(prompts, params, mode="seed", draft_policy=policy)] == reference


def test_a_bad_recording_is_refused_with_its_file_and_line(tmp_path):
    missing = tmp_path / "none.jsonl.gz"
    with pytest.raises(ReplayError, match="not found"):
        load_recording(missing)
    path = tmp_path / "bad.jsonl.gz"

    def write(*lines):
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write("\n".join(json.dumps(line) for line in lines) + "\n")

    write({"format": "something else"})
    with pytest.raises(ReplayError, match="line 1 must be the header"):
        load_recording(path)
    header = {"format": FORMAT, "vocab_size": 10, "tokenizer": "t.tar.xz"}
    write(header, {"rows": [{"prompt": [1], "output": [2]}]}, {"rows": [{"prompt": [1], "output": [10]}]})
    with pytest.raises(ReplayError, match=r"bad.jsonl.gz: line 3: .*outside \[0, 10\)"):
        load_recording(path)
    write(header, {"rows": [{"prompt": "1 2", "output": [2]}]})
    with pytest.raises(ReplayError, match="line 2: 'rows' must be a list"):
        load_recording(path)
