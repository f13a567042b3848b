"""benchmarks/text_draft_replay.py: a recording's greedy rows replayed through the text draft sources,
with no model. The replay takes exactly the drafted prefix the greedy target would take, its scopes
see what the engine's would (a search's earlier text, the run's, not a sibling's text of the same
round), and it refuses a drafter it does not know by name."""
from __future__ import annotations

import json
import random
import runpy
from pathlib import Path

import pytest

from seed_tot.engine.decode_spec import DecodeSpec
from seed_tot.engine.suffix_index import DraftNode
from seed_tot.replay import FORMAT, Recording, load_recording

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "text_draft_replay.py"


@pytest.fixture(scope="module")
def tdr():
    return runpy.run_path(str(SCRIPT))


def _recording(calls: list[dict]) -> Recording:
    return Recording(Path("in-memory"), {"format": FORMAT, "vocab_size": 1000, "eos_token_ids": [0]}, calls)


def _call(key: str, rows: list[tuple[list[int], list[int]]], phase: str = "thought") -> dict:
    return {"workload": "tot-gsm8k", "search_key": key, "phase": phase, "max_new_tokens": 64,
            "rows": [{"prompt": p, "output": o} for p, o in rows]}


def _distinct(n: int, seed: int, prompt: bool = False) -> list[int]:
    """n tokens none of which repeats (no text source can find a continuation inside them); prompts
    and outputs from disjoint ranges, so an output never continues a prompt's token."""
    return random.Random(seed).sample(range(500, 1000) if prompt else range(1, 500), n)


def test_the_verification_takes_the_longest_drafted_path_that_equals_the_output(tdr):
    accepted_path = tdr["accepted_path"]
    chain = [DraftNode(-1, 5, 1.0), DraftNode(0, 6, 1.0), DraftNode(1, 9, 1.0)]
    assert accepted_path(chain, [5, 6, 7, 8]) == [0, 1]
    assert accepted_path(chain, [4, 6, 9]) == []
    tree = [DraftNode(-1, 5, 0.5), DraftNode(-1, 7, 0.5), DraftNode(1, 8, 1.0), DraftNode(0, 3, 1.0)]
    assert accepted_path(tree, [7, 8, 1]) == [1, 2]  # the second branch, then its child
    assert accepted_path(tree, [5, 3]) == [0, 3]


def test_a_search_drafts_its_earlier_text_and_the_run_drafts_other_searches(tdr):
    """A thought repeated by a later call of the same search is drafted whole from the search scope;
    by another search, from the run scope; with the scopes off, nothing is found in distinct tokens."""
    Drafter, replay = tdr["Drafter"], tdr["replay"]
    text = _distinct(40, 1) + [0]  # ends with EOS, as a recorded row does
    first = _call("a", [(_distinct(12, 2, prompt=True), text)])
    for key in ("a", "b"):
        calls = [first, _call(key, [(_distinct(12, 3, prompt=True), text)], phase="value")]
        shared = replay(_recording(calls), Drafter("suffix"))
        alone = replay(_recording(calls), Drafter("suffix:share=off:run_tokens=0"))
        assert shared["thought"].accepted == alone["thought"].accepted == 0  # the first sight of the text
        assert alone["value"].accepted == 0 and alone["value"].verifications == len(text)
        # from the second round on the text is found; the draft grows with the match (factor 1.0) to depth 8
        assert shared["value"].accepted >= len(text) - 12
        assert shared["value"].figures()["tokens_per_verification"] >= 4.0
    assert replay(_recording(calls), Drafter("lookup"))["value"].accepted == 0  # not in the row's own text


def test_siblings_of_one_call_do_not_see_each_others_tokens_of_the_same_round(tdr):
    """Two rows writing the same text in lockstep: neither can draft the other's round-r token before
    the verification has written it, so both write one token a verification (nothing repeats)."""
    Drafter, replay = tdr["Drafter"], tdr["replay"]
    text = _distinct(30, 4) + [0]
    tally = replay(_recording([_call("a", [(_distinct(8, 5, prompt=True), text), (_distinct(8, 6, prompt=True), text)])]),
                   Drafter("suffix:unigram=0"))["thought"]
    assert tally.rows == 2 and tally.tokens == 2 * len(text)
    assert tally.accepted == 0 and tally.verifications == 2 * len(text)


def test_the_shipped_recording_replays_and_its_counts_add_up(tdr, tmp_path):
    out = tmp_path / "replay.jsonl"
    lines = tdr["main"](["--drafters", "lookup,suffix", "--workload", "tot-gsm8k", "--json", str(out)])
    assert [json.loads(line) for line in out.read_text().splitlines()] == lines
    recording = load_recording()
    outputs = {}
    for call in recording.calls:
        if call["workload"] == "tot-gsm8k":
            outputs.setdefault(call["phase"], []).extend(len(r["output"]) for r in call["rows"])
    for line in lines:
        lengths = outputs[line["phase"]]
        assert line["rows"] == len(lengths) and line["tokens"] == sum(lengths)
        # a verification writes what it accepted and one token more, but a row's last may end at its draft
        written = line["verifications"] + line["accepted"]
        assert written - line["rows"] <= line["tokens"] <= written
        assert line["accepted"] <= line["drafted"]
    by = {(line["drafter"], line["phase"]): line for line in lines}
    # SmolLM2's greedy thoughts copy the question's numbers and repeat the search's earlier lines
    assert by[("suffix", "thought")]["tokens_per_verification"] > 1.2
    assert by[("lookup", "thought")]["tokens_per_verification"] > 1.0


@pytest.mark.parametrize("label, says", [("eagle", "'lookup' and 'suffix'"), ("suffix:depth=0", "depth"),
                                         ("lookup:ngram=x", "ngram"), ("lookup:width=2", "takes ngram, depth")])
def test_an_unknown_drafter_or_option_is_refused_by_name(tdr, label, says, capsys):
    with pytest.raises(SystemExit):
        tdr["main"](["--drafters", label])
    err = capsys.readouterr().err
    assert "--drafters" in err and says in err


def test_lookup_drafts_the_engines_default_depth_unless_given(tdr):
    assert tdr["Drafter"]("lookup").depth == len(DecodeSpec().k_config)
    assert tdr["Drafter"]("lookup:depth=8").depth == 8
    assert tdr["Drafter"]("lookup:ngram=2").ngram == 2
