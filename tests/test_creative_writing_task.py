"""Creative Writing task: sentence splitting, prompts, scoring, value parsing, loading (no models)."""
from __future__ import annotations

from pathlib import Path

import pytest

from seed_tot.search.protocol import Example, State, Task
from seed_tot.tasks.creative_writing import CreativeWriting, split_sentences
from seed_tot.tasks.loading import DataError

FIXTURE = Path(__file__).parent / "fixtures" / "creative_writing_small.txt"
SENTENCES = [
    "The lighthouse keeper hadn’t seen a ship in years.",
    "Nobody expected the cat to learn chess!",
    "She said “the tide is turning.”",
    "He ate the last pancake without asking.",
]
PASSAGE = """Every night the lamp turned over an empty sea. \
The lighthouse keeper hadn’t seen a ship in years.

To pass the time he taught his cat the moves of the pieces. Nobody expected the cat to learn chess!

His sister came by with the weather report. She said “the tide is turning.”

In the morning the two of them argued over breakfast. He ate the last pancake without asking."""


@pytest.fixture
def task() -> CreativeWriting:
    return CreativeWriting()


@pytest.fixture
def example() -> Example:
    return Example(id="0", data={"sentences": " ".join(SENTENCES)})


def test_split_sentences_handles_curly_quotes_and_exclamations():
    assert split_sentences(" ".join(SENTENCES)) == SENTENCES


def test_split_sentences_keeps_abbreviations_inside_a_sentence():
    text = "Mr. Smith went home. It rained. We stayed in. Dr. Jones called."
    assert split_sentences(text) == ["Mr. Smith went home.", "It rained.", "We stayed in.",
                                     "Dr. Jones called."]


def test_split_sentences_breaks_an_unpunctuated_fragment_before_a_sentence_opener():
    # The ToT data holds fragments like this; a name ("with Grandpa Joe") must not be split off.
    text = ("Instead of a party You sat with Grandpa Joe all day. The river ran. "
            "It was the best mistake I ever made")
    assert split_sentences(text) == ["Instead of a party", "You sat with Grandpa Joe all day.",
                                     "The river ran.", "It was the best mistake I ever made"]


def test_creative_writing_satisfies_task_protocol(task):
    assert isinstance(task, Task)
    assert (task.config.depth, task.config.n_generate) == (2, 3)


def test_plan_prompt_lists_the_sentences_and_stops_before_the_passage(task, example):
    prompt = task.thought_prompt(example, State())
    for i, sentence in enumerate(SENTENCES, 1):
        assert f"{i}. {sentence}" in prompt.user
    assert prompt.assistant_prefix.startswith("Plan:")
    assert "\nPassage:" in prompt.stop


def test_passage_prompt_continues_after_the_plan(task, example):
    state = task.extend(State(), "Plan:\nA keeper, a cat, a sister, a pancake.\nPassage:\nextra")
    assert state.thoughts == ("A keeper, a cat, a sister, a pancake.",)
    prompt = task.thought_prompt(example, state)
    assert SENTENCES[0] in prompt.user
    assert prompt.assistant_prefix.startswith("Plan:\nA keeper, a cat, a sister, a pancake.")
    assert prompt.assistant_prefix.rstrip().endswith("Passage:")
    assert prompt == task.answer_prompt(example, state)


def test_value_prompts_rate_the_plan_then_the_passage(task, example):
    plan_state = State(("A keeper, a cat.",))
    plan_prompt = task.value_prompt(example, plan_state)
    assert "A keeper, a cat." in plan_prompt.user and SENTENCES[2] in plan_prompt.user
    assert "coherency score is s" in plan_prompt.user
    passage_state = task.extend(plan_state, PASSAGE)
    assert task.is_final(example, passage_state) and not task.is_final(example, plan_state)
    assert task.value_prompt(example, passage_state) == task.judge_prompt(example, PASSAGE)
    assert PASSAGE in task.judge_prompt(example, PASSAGE).user


@pytest.mark.parametrize("reply, expected", [
    ("Flows well.\nThus the coherency score is 8", 8.0),
    ("Thus the coherency score is **7**.", 7.0),
    ("Thus the coherency score is 12", 10.0),
    ("Paragraph 2 is weak; I would say 6", 6.0),
    ("no verdict", 1.0),
])
def test_parse_value_reads_coherency_score_with_fallbacks(task, reply, expected):
    assert task.parse_value(reply) == expected


@pytest.mark.parametrize("reply", ["Coherent overall. Score: 8/10", "I would rate it 8 out of 10.",
                                   "Rating: 8 / 10 (paragraph 3 is abrupt)"])
def test_a_score_written_as_a_fraction_of_ten_reads_as_its_numerator(task, reply):
    """The fallback took the last number in 1-10, so "8/10" and "8 out of 10" (the way a model
    that skips "Thus the coherency score is" writes a score) all read as a perfect 10."""
    assert task.parse_value(reply) == 8.0


def test_score_all_four_endings_match(task, example):
    assert task.score(example, PASSAGE) == {"score": 1.0, "ends_match": True}


def test_score_counts_one_mismatched_ending(task, example):
    wrong = PASSAGE.replace("He ate the last pancake without asking.", "He ate the pancake.")
    assert task.score(example, wrong) == {"score": 0.75, "ends_match": False}


def test_score_tolerates_straight_quotes_and_missing_blank_lines(task, example):
    retyped = PASSAGE.replace("’", "'").replace("“", '"').replace("”", '"').replace("\n\n", "\n")
    assert task.score(example, retyped)["ends_match"]


def test_prediction_is_the_passage_of_a_finished_state(task, example):
    state = State(("plan", PASSAGE))
    assert task.prediction(example, state, "ignored") == PASSAGE
    assert task.prediction(example, State(("plan",)), "Passage:\n" + PASSAGE) == PASSAGE


def test_finished_state_needs_one_answer_token(task, example):
    assert task.answer_prompt(example, State(("plan", PASSAGE))).max_new_tokens == 1
    assert task.answer_prompt(example, State(("plan",))).max_new_tokens == 512


def test_load_fixture_splits_each_line_into_four_sentences(task):
    examples = task.load(str(FIXTURE))
    assert [e.id for e in examples] == ["0", "1"]
    assert task.endings(examples[0]) == SENTENCES
    assert task.endings(examples[1])[0] == "Instead of a birthday party"
    assert len(task.endings(examples[1])) == 4


def test_load_limit_and_offset_select_a_window(task):
    assert [e.id for e in task.load(str(FIXTURE), limit=1, offset=1)] == ["1"]


def test_a_line_that_is_not_four_sentences_is_refused_naming_file_and_line(task, tmp_path):
    """The prompts ask for 4 paragraphs; a line of 3 sentences was only a logged warning, and its
    passages were then scored on 3 endings, so a 3-paragraph passage scored a full 1.0."""
    file = tmp_path / "cw.txt"
    file.write_text(FIXTURE.read_text(encoding="utf-8").splitlines()[0] + "\n\nOne. Two. Three.\n", encoding="utf-8")
    with pytest.raises(DataError, match=rf"{file}:3 \(id 1\): found 3 sentences, expected 4"):
        task.load(str(file))
    assert len(task.load(str(file), limit=1)) == 1


def test_load_without_path_asks_for_data(task):
    with pytest.raises(DataError, match="--data"):
        task.load(None)
