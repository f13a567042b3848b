"""GSM8K task: answer extraction and comparison, value parsing, prompts, loading (no models)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from seed_tot.prompts import load_prompts
from seed_tot.search.protocol import Example, Prompt, State, Task
from seed_tot.tasks.gsm8k import GSM8K, answers_match, extract_answer
from seed_tot.tasks.loading import DataError

FIXTURE = Path(__file__).parent / "fixtures" / "gsm8k_small.jsonl"
QUESTION = "Tom has 3 apples and buys 4 more. How many apples does he have?"


@pytest.fixture
def task() -> GSM8K:
    return GSM8K()


@pytest.fixture
def example() -> Example:
    return Example(id="0", data={"question": QUESTION, "answer": "3 + 4 = 7\n#### 7"})


@pytest.mark.parametrize("text, expected", [
    ("He has 3 + 4 = 7 apples.\n#### 7", "7"),
    ("cost 1200 dollars\n#### 1,200", "1200"),
    ("So the total is 1,234. The answer is 1,234.", "1234"),
    ("The answer is $5.00", "5"),
    ("The answer is **18**.", "18"),
    ("I think 3 then 4, so 12 in the end", "12"),
    ("the temperature falls to -3", "-3"),
    ("The answer is 2.5", "2.5"),
    ("The answer is .5", "0.5"),  # a decimal without its integer part was read as 5
    ("Each costs $.50 so", "0.5"),
    ("It rose by -.25 degrees", "-0.25"),
])
def test_extract_answer_prefers_gold_marker_then_answer_phrase_then_last_number(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("The answer is 2 * 4 = 8", "8"),
    ("Sub-answer 4: The answer is 5 + 3 = 8 eggs.", "8"),
    ("The answer is $1,200 - $200 = $1,000.", "1000"),
    ("The answer is 8 - 3 apples", "8"),  # no "=": the number said is the answer
])
def test_an_answer_phrase_followed_by_its_computation_reads_the_result(text, expected):
    """"The answer is 2 * 4 = 8" read as 2: the phrase's first number, an operand."""
    assert extract_answer(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("The answer is 3/4.", "0.75"),
    ("The answer is 10 / 4 cups", "2.5"),
    ("The answer is 3/4 = 0.75", "0.75"),  # the computation's result, as before
    ("The answer is 7/0", "7"),  # no value: the number said
    ("The answer is 9/1.5", "6"),  # the whole denominator, not its leading digits
    ("The answer is 3,000/1,000", "3"),
])
def test_an_answer_given_as_a_fraction_reads_as_its_value_not_its_numerator(text, expected):
    """"The answer is 3/4" read as 3, which scores right against a gold 3."""
    assert extract_answer(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("The answer is 1,5", "1"),  # not a thousands group: read 15 before
    ("The answer is 1,234,567.", "1234567"),
    ("We have 12,34 left", "34"),
    ("The answer is 2,500/1,000", "2.5"),
])
def test_a_comma_joins_digits_only_between_groups_of_three(text, expected):
    assert extract_answer(text) == expected


def test_extract_answer_returns_none_when_text_has_no_number():
    assert extract_answer("I cannot solve this.") is None


def test_extract_answer_takes_the_last_answer_phrase():
    assert extract_answer("The answer is 4. Wait, recheck: The answer is 6.") == "6"


def test_extract_answer_prefers_marker_over_later_numbers():
    assert extract_answer("#### 42\nchecked with 3 other methods") == "42"


@pytest.mark.parametrize("a, b", [
    ("1,234", "1234"), ("$5.00", "5"), ("7.", "7"), ("18.0", "18"), ("0.50", ".5"), ("-3", "-3.0"),
])
def test_answers_match_ignores_commas_dollars_and_trailing_zeros(a, b):
    assert answers_match(a, b)


@pytest.mark.parametrize("a, b", [("7", "8"), ("12", "1.2"), (None, "7"), ("7", None), (None, None)])
def test_answers_match_rejects_different_or_missing_answers(a, b):
    assert not answers_match(a, b)


@pytest.mark.parametrize("reply, expected", [
    (" 7", 7.0), (" 8/10 - the steps are right", 8.0), (" I'd rate it 6 out of 10", 6.0),
    (" 15", 10.0), (" 0", 1.0), (" 9.5", 9.5),
])
def test_parse_value_reads_first_rating_and_clamps_to_1_10(task, reply, expected):
    assert task.parse_value(reply) == expected


def test_parse_value_is_neutral_when_reply_has_no_number(task):
    assert task.parse_value("looks fine") == 5.0


def test_gsm8k_satisfies_task_protocol(task):
    assert isinstance(task, Task)
    assert (task.config.depth, task.config.n_generate, task.config.breadth) == (4, 3, 1)
    assert task.config.temperature == 1.0


def test_thought_prompts_continue_the_steps_so_far_at_each_depth(task, example):
    state = State()
    for depth in range(task.config.depth):
        prompt = task.thought_prompt(example, state)
        assert isinstance(prompt, Prompt)
        assert QUESTION in prompt.user
        assert "\nSub-question" in prompt.stop
        for thought in state.thoughts:  # the reply so far holds every step taken
            assert thought in prompt.assistant_prefix
        assert prompt.assistant_prefix.rstrip().endswith(":")
        state = task.extend(state, f" step {depth + 1}?\nSub-answer {depth + 1}: 1 + 1 = 2.")
    assert state.depth == task.config.depth


def test_last_level_thought_asks_the_original_question(task, example):
    state = State(("Sub-question 1: a?\nSub-answer 1: 1.",) * 3)
    prompt = task.thought_prompt(example, state)
    assert prompt.assistant_prefix.endswith(
        "Sub-question 4: What is the answer to the original question?\nSub-answer 4:")
    assert "The answer is N" in prompt.user
    assert prompt == task.answer_prompt(example, state)


def test_extend_adds_step_header_and_drops_text_past_the_stop(task):
    state = task.extend(State(), " How many?\nSub-answer 1: 3 + 4 = 7.\nSub-question 2: more")
    assert state.thoughts == ("Sub-question 1: How many?\nSub-answer 1: 3 + 4 = 7.",)


def test_value_prompt_shows_question_and_steps(task, example):
    state = State(("Sub-question 1: How many?\nSub-answer 1: 7.",))
    prompt = task.value_prompt(example, state)
    assert QUESTION in prompt.user and state.thoughts[0] in prompt.user
    assert "between 1 and 10" in prompt.user


def test_state_stating_its_answer_is_final_before_full_depth(task, example):
    assert not task.is_final(example, State(("Sub-question 1: a?\nSub-answer 1: 7.",)))
    assert task.is_final(example, State(("Sub-question 1: a?\nSub-answer 1: The answer is 7.",)))
    assert task.is_final(example, State(("x",) * 4))


def test_prediction_with_answer_step_scores_correct(task, example):
    state = State(("Sub-question 1: How many?\nSub-answer 1: 3 + 4 = 7.",))
    prediction = task.prediction(example, state, " 3 + 4 = 7 apples. The answer is 7.")
    assert task.score(example, prediction) == {"correct": True, "answer": "7", "gold": "7"}
    assert task.score(example, "The answer is 8.")["correct"] is False


def test_answered_state_keeps_its_answer_and_needs_one_answer_token(task, example):
    state = State(("Sub-question 1: How many?\nSub-answer 1: 3 + 4 = 7. The answer is 7.",))
    assert task.answer_prompt(example, state).max_new_tokens == 1
    prediction = task.prediction(example, state, " The answer is 9.")
    assert task.score(example, prediction)["answer"] == "7"


def test_chain_of_thought_writes_every_step_in_one_call_and_reads_its_last_answer(task, example):
    prompt = task.cot_prompt(example)
    assert prompt.stop == ("\nQuestion:",)  # not "\nSub-question": the chain goes on past its first step
    assert prompt.assistant_prefix == "Sub-question 1:" and QUESTION in prompt.user
    assert prompt.max_new_tokens == 384 and task.config.max_new_tokens == 384  # the run's cap is the chain's
    chain = (" How many apples did he buy?\nSub-answer 1: He bought 4.\nSub-question 2: What is the answer to the "
             "original question?\nSub-answer 2: 3 + 4 = 7. The answer is 7.\nQuestion: Ann has 2 pens")
    prediction = task.cot_prediction(example, chain)
    assert prediction.startswith("Sub-question 1: How many") and "Ann" not in prediction
    assert task.score(example, prediction)["correct"]
    # the answer prompt's reading keeps one step: the chain's answer would be lost
    assert not task.score(example, task.prediction(example, State(), chain))["correct"]


def test_tree_steps_keep_their_own_budget_under_the_chains_cap(task, example):
    assert task.thought_prompt(example, State()).max_new_tokens == 128
    assert task.answer_prompt(example, State(("Sub-question 1: x",))).max_new_tokens == 128
    assert task.value_prompt(example, State()).max_new_tokens == 8


def test_load_fixture_gives_examples_with_line_index_ids(task):
    examples = task.load(str(FIXTURE))
    assert [e.id for e in examples] == ["0", "1", "2"]
    assert examples[1].data["question"].startswith("A shop sells pens")
    assert task.score(examples[1], "The answer is $1,200.")["correct"]


def test_load_limit_and_offset_select_a_window(task):
    assert [e.id for e in task.load(str(FIXTURE), limit=1, offset=1)] == ["1"]
    assert [e.id for e in task.load(str(FIXTURE), offset=2)] == ["2"]


def test_malformed_jsonl_line_error_names_file_and_line(task, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "#### 1"}\n{"question": "q", "answer": \n', encoding="utf-8")
    with pytest.raises(DataError, match=rf"{bad}:2"):
        task.load(str(bad))


def test_missing_answer_field_error_names_the_field(task, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q"}\n', encoding="utf-8")
    with pytest.raises(DataError, match=r":1: missing field\(s\) answer"):
        task.load(str(bad))


@pytest.mark.parametrize("record, words", [
    ({"question": None, "answer": "#### 1"}, "question must be text, got null"),
    ({"question": "q", "answer": ["#### 1"]}, "answer must be text or a number, got list"),
    ({"question": "q", "answer": "forty-two"}, "answer holds no number"),
])
def test_a_record_the_search_or_the_scorer_cannot_read_names_file_line_and_field(task, tmp_path, record, words):
    """A null question failed as an AttributeError in the first prompt, after the model had loaded,
    and a gold answer without a number scored every prediction wrong without a word."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "#### 1"}\n\n' + json.dumps(record) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=rf"{bad}:3 \(id 1\): {words}"):
        task.load(str(bad))


def test_a_gold_answer_given_as_a_bare_number_scores(task, tmp_path):
    file = tmp_path / "numbers.jsonl"
    file.write_text('{"question": "q", "answer": 72}\n{"question": "q", "answer": "1,200"}\n', encoding="utf-8")
    first, second = task.load(str(file))
    assert task.score(first, "The answer is 72.")["correct"] and task.score(second, "The answer is 1200")["correct"]


def test_unknown_prompt_set_is_a_clear_error():
    with pytest.raises(ValueError, match="no prompt templates named 'nope'"):
        load_prompts("nope")


def test_prompt_set_missing_a_template_is_rejected():
    prompts = dict(load_prompts("gsm8k"))
    del prompts["value_user"]
    with pytest.raises(ValueError, match="value_user"):
        GSM8K(prompts=prompts)
