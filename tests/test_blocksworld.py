"""Blocksworld simulator and task: fast checks with small fixtures written here (no models)."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from seed_tot.prompts import load_prompts
from seed_tot.search.protocol import Example, State, Task
from seed_tot.tasks.blocksworld import UNPARSED, VALUE_BAD, VALUE_GOOD, VALUE_ILLEGAL, VALUE_UNSURE, Blocksworld
from seed_tot.tasks.blocksworld_sim import (Action, ActionParseError, IllegalAction, PddlError, apply,
                                   describe_goal, describe_state, find_action, optimal_plan,
                                   parse_action, parse_problem, random_instance, validate_plan)
from seed_tot.tasks.loading import DataError

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "blocksworld" / "step_6.jsonl"

# A 4-block instance in the benchmark's format: red on table, blue on red, yellow on blue;
# orange on table. Goal: red on orange, orange on yellow. Optimal plan: 8 actions.
FIXTURE_PDDL = """
(define (problem BW-rand-4)
(:domain blocksworld-4ops)
(:objects a b c d )
(:init
(handempty)
(ontable a)
(on b a)
(ontable c)
(on d b)
(clear c)
(clear d)
)
(:goal
(and
(on a c)
(on c d))
)
)
"""
FIXTURE_GOLD = ["(unstack d b)", "(put-down d)", "(pick-up c)", "(stack c d)", "(unstack b a)", "(put-down b)",
                "(pick-up a)", "(stack a c)"]
FIXTURE_GOLD_NL = [
    "unstack the yellow block from on top of the blue block",
    "put down the yellow block",
    "pick up the orange block",
    "stack the orange block on top of the yellow block",
    "unstack the blue block from on top of the red block",
    "put down the blue block",
    "pick up the red block",
    "stack the red block on top of the orange block",
]


@pytest.fixture
def problem():
    return parse_problem(FIXTURE_PDDL)


def example(pddl: str = FIXTURE_PDDL) -> Example:
    return Example(id="fixture", data={"id": "fixture", "problem_pddl": pddl})


# --- simulator ------------------------------------------------------------------------------

def test_parse_problem_reads_objects_init_and_goal(problem):
    s = problem.init
    assert s.blocks == ("a", "b", "c", "d")
    assert s.on == {("b", "a"), ("d", "b")} and s.on_table == {"a", "c"}
    assert s.clear == {"c", "d"} and s.arm_empty and s.holding is None
    assert problem.goal == {("on", "a", "c"), ("on", "c", "d")}


def test_english_rendering_follows_planbench_colours(problem):
    assert describe_state(problem.init) == (
        "the orange block is clear, the yellow block is clear, the hand is empty, the blue block is on top "
        "of the red block, the yellow block is on top of the blue block, the red block is on the table and "
        "the orange block is on the table")
    assert describe_goal(problem.goal) == ("the red block is on top of the orange block and "
                                           "the orange block is on top of the yellow block")


@pytest.mark.parametrize("text, expected", [
    ("(unstack b a)", Action("unstack", ("b", "a"))),
    ("(PICK-UP c)", Action("pick-up", ("c",))),
    ("(stack a b)", Action("stack", ("a", "b"))),
    ("(put-down d)", Action("put-down", ("d",))),
    ("unstack the blue block from on top of the red block", Action("unstack", ("b", "a"))),
    ("Unstack the blue block from on top the red block.", Action("unstack", ("b", "a"))),
    ("stack the orange block on top of the yellow block", Action("stack", ("c", "d"))),
    ("Stack orange block on top of yellow block.", Action("stack", ("c", "d"))),
    ("pick up the red block", Action("pick-up", ("a",))),
    ("put down the blue block", Action("put-down", ("b",))),
    ("2. pick up the gold block", Action("pick-up", ("l",))),
])
def test_parse_action_accepts_pddl_and_planbench_english(text, expected):
    assert parse_action(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("put down a blue block", Action("put-down", ("b",))),
    ("stack a blue block on top of a red block", Action("stack", ("b", "a"))),
    ("stack the red block on an orange block", Action("stack", ("a", "c"))),
    ("pick up the a block", Action("pick-up", ("a",))),
])
def test_the_article_a_before_a_colour_is_not_block_a(text, expected):
    """A bare letter names a block (PDDL's objects a, b, ...), so "a blue block" was read as block
    a, the red one: "stack a blue block on top of a red block" became (stack a b)."""
    assert parse_action(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("pick up block c", Action("pick-up", ("c",))),
    ("unstack block b from on top of block a", Action("unstack", ("b", "a"))),
    ("stack the block d on block a", Action("stack", ("d", "a"))),
])
def test_block_before_a_letter_names_that_block(text, expected):
    """"pick up block c" was no action at all: a block's letter was read only before "block"."""
    assert parse_action(text) == expected


def test_canonical_english_round_trips_through_the_parser():
    for name, args in [("pick-up", ("a",)), ("put-down", ("e",)), ("stack", ("c", "d")), ("unstack", ("b", "a"))]:
        action = Action(name, args)
        assert parse_action(action.to_text()) == action
        assert parse_action(action.to_pddl()) == action


def test_text_without_an_action_does_not_parse():
    for text in ("move the red block", "(stack a)", "unstack the blue block", ""):
        with pytest.raises(ActionParseError):
            parse_action(text)
    assert find_action("I am not sure what to do.") is None


def test_find_action_takes_the_first_action_in_chatty_text():
    assert find_action("Next, I will pick up the red block and then stack it on the blue block.") == \
        Action("pick-up", ("a",))


def test_a_legal_action_changes_the_state_as_the_domain_says(problem):
    s = apply(problem.init, "unstack the yellow block from on top of the blue block")
    assert s.holding == "d" and not s.arm_empty
    assert ("d", "b") not in s.on and s.clear == {"b", "c"}


def test_an_illegal_action_raises_with_the_broken_precondition(problem):
    with pytest.raises(IllegalAction, match="red block is not clear"):
        apply(problem.init, "(pick-up a)")
    with pytest.raises(IllegalAction, match="hand is not holding"):
        apply(problem.init, "stack the orange block on top of the yellow block")
    held = apply(problem.init, "(pick-up c)")
    with pytest.raises(IllegalAction, match="hand is not empty"):
        apply(held, "(unstack d b)")


def test_gold_fixture_plan_is_valid_and_reaches_goal_in_both_syntaxes(problem):
    for plan in (FIXTURE_GOLD, FIXTURE_GOLD_NL):
        check = validate_plan(problem, plan)
        assert check.valid and check.reaches_goal and check.first_illegal is None
    assert len(optimal_plan(problem)) == len(FIXTURE_GOLD)


def test_removing_any_action_from_the_optimal_plan_breaks_it(problem):
    for i in range(len(FIXTURE_GOLD)):
        check = validate_plan(problem, FIXTURE_GOLD[:i] + FIXTURE_GOLD[i + 1:])
        assert not (check.valid and check.reaches_goal)
    check = validate_plan(problem, FIXTURE_GOLD[1:])
    assert not check.valid and check.first_illegal == 0 and "not holding" in check.reason


def test_malformed_or_inconsistent_pddl_is_refused():
    bad = [
        "(define (problem p) (:objects a b) (:init (handempty) (ontable a)",  # unbalanced
        FIXTURE_PDDL.replace("(:objects a b c d )", "(:objects a b c )"),  # unknown object d
        FIXTURE_PDDL.replace("(clear d)", ""),  # d has nothing on it yet is not clear
        FIXTURE_PDDL.replace("(ontable a)", "(ontable a)\n(on a c)"),  # a in two places
        FIXTURE_PDDL.replace("(on a c)", "(above a c)"),  # unknown predicate
    ]
    for text in bad:
        with pytest.raises(PddlError):
            parse_problem(text)


@pytest.mark.parametrize("n_blocks, length", [(3, 4), (4, 6), (5, 6)])
def test_generator_instances_have_the_requested_bfs_optimal_length(n_blocks, length):
    rng = random.Random(7)
    for _ in range(3):
        pddl, plan = random_instance(n_blocks, length, rng)
        problem = parse_problem(pddl)
        assert len(problem.init.blocks) == n_blocks
        assert len(optimal_plan(problem)) == length == len(plan)
        check = validate_plan(problem, plan)
        assert check.valid and check.reaches_goal


# --- task -----------------------------------------------------------------------------------

def test_blocksworld_implements_the_task_protocol_with_six_action_plans():
    task = Blocksworld()
    assert isinstance(task, Task)
    assert task.config.depth == 6 and task.config.n_generate == 3


def test_score_accepts_english_and_pddl_plans_and_ignores_blank_lines_and_plan_end():
    task = Blocksworld()
    for plan in (FIXTURE_GOLD, FIXTURE_GOLD_NL):
        prediction = "\n" + "\n\n".join(plan) + "\n[PLAN END]\n"
        assert task.score(example(), prediction) == {"correct": True, "valid": True, "reaches_goal": True}
    short = task.score(example(), "\n".join(FIXTURE_GOLD_NL[:-1]))
    assert short == {"correct": False, "valid": True, "reaches_goal": False}
    assert task.score(example(), "pick up the red block")["valid"] is False


def test_extend_canonicalises_actions_and_marks_unparsable_thoughts():
    task, ex = Blocksworld(), example()
    state = task.extend(State(), " (unstack d b)\nput down the yellow block")
    assert state.thoughts == ("unstack the yellow block from on top of the blue block",)
    assert task.prior_value(ex, state) is None and not task.is_final(ex, state)
    junk = task.extend(state, "I think the plan is finished.")
    assert junk.depth == 2 and junk.thoughts[-1].startswith(UNPARSED)
    assert task.prior_value(ex, junk) == VALUE_ILLEGAL and not task.is_final(ex, junk)
    illegal = task.extend(State(), "pick up the red block")
    assert task.prior_value(ex, illegal) == VALUE_ILLEGAL


def test_is_final_when_the_goal_is_reached_or_the_plan_is_full():
    task = Blocksworld()
    two_step = example(FIXTURE_PDDL.replace("(on a c)\n", ""))  # goal: orange on yellow only
    assert not task.is_final(two_step, State(("pick up the orange block",)))
    solved = State(("pick up the orange block", "stack the orange block on top of the yellow block"))
    assert task.is_final(two_step, solved)
    full = State(("pick up the orange block", "put down the orange block") * 3)  # 6 legal actions, no goal
    assert not task.is_final(example(), State(full.thoughts[:5])) and task.is_final(example(), full)


def test_parse_value_maps_good_high_bad_low_and_anything_else_between():
    task = Blocksworld()
    assert task.parse_value(" good") == VALUE_GOOD
    assert task.parse_value("Bad.") == VALUE_BAD
    assert task.parse_value("not good") == VALUE_BAD
    assert task.parse_value("Not bad: it clears block c.") == VALUE_GOOD  # was read as "bad"
    assert task.parse_value("maybe") == VALUE_UNSURE
    assert VALUE_BAD < task.config.value_threshold <= VALUE_UNSURE < VALUE_GOOD


def test_prompts_show_the_problem_and_the_plan_so_far():
    task, ex = Blocksworld(), example()
    state = State(("unstack the yellow block from on top of the blue block",))
    thought = task.thought_prompt(ex, state)
    assert "As initial conditions I have that, the orange block is clear" in thought.user
    assert "My goal is to have that the red block is on top of the orange block" in thought.user
    assert thought.assistant_prefix.endswith("unstack the yellow block from on top of the blue block\n")
    value = task.value_prompt(ex, state)
    assert value.user.rstrip().endswith("unstack the yellow block from on top of the blue block")
    assert task.parse_value(value.assistant_prefix + " good") == VALUE_GOOD
    assert task.answer_prompt(ex, state).assistant_prefix == thought.assistant_prefix


def test_prediction_is_the_plan_then_the_answers_actions_up_to_six():
    task, ex = Blocksworld(), example()
    state = State(tuple(FIXTURE_GOLD_NL[:2]))
    answer = ("(pick-up c)\nstack the orange block on top of the yellow block\n(unstack b a)\n"
              "put down the blue block\npick up the red block\n[PLAN END]")
    lines = task.prediction(ex, state, answer).splitlines()
    assert lines == FIXTURE_GOLD_NL[:6]


def test_prompt_demonstrations_agree_with_the_simulator():
    prompts = load_prompts("blocksworld")
    demo = parse_problem(prompts["demonstration"]["problem_pddl"])
    check = validate_plan(demo, prompts["demonstration"]["plan"])
    assert check.valid and check.reaches_goal
    assert len(prompts["demonstration"]["plan"]) == len(optimal_plan(demo))
    for case in prompts["value_demonstrations"]:
        p = parse_problem(case["problem_pddl"])
        before = validate_plan(p, case["steps"])
        assert before.valid
        # good = legal and one step closer to the goal (the optimal plan gets one shorter)
        legal = validate_plan(p, case["steps"] + [case["last"]]).valid
        closer = legal and len(optimal_plan(_from(p, case["steps"] + [case["last"]]))) == \
            len(optimal_plan(_from(p, case["steps"]))) - 1
        assert case["verdict"] == ("good" if closer else "bad")


def _from(problem, steps):
    """The problem restarted from the state that `steps` reach."""
    return type(problem)(problem.name, validate_plan(problem, steps).final_state, problem.goal)


# --- data -----------------------------------------------------------------------------------

def test_load_without_a_path_generates_reproducible_six_step_instances():
    first, again = Blocksworld().load(None, limit=3), Blocksworld().load(None, limit=3)
    assert [e.data["problem_pddl"] for e in first] == [e.data["problem_pddl"] for e in again]
    for ex in first:
        assert len(optimal_plan(parse_problem(ex.data["problem_pddl"]))) == 6
        assert Blocksworld().score(ex, "\n".join(ex.data["gold_plan"]))["correct"]


def test_malformed_problem_line_raises_data_error_naming_file_and_line(tmp_path):
    file = tmp_path / "bw.jsonl"
    good = json.dumps({"id": "ok", "problem_pddl": FIXTURE_PDDL})
    bad = json.dumps({"id": "broken", "problem_pddl": "(define (problem p) (:objects a)"})
    file.write_text(f"{good}\n\n{bad}\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"bw\.jsonl:3 \(id broken\)"):
        Blocksworld().load(str(file))
    assert [e.id for e in Blocksworld().load(str(file), limit=1)] == ["ok"]


@pytest.mark.skipif(not SHARED.is_file(), reason="../shared/data/blocksworld/step_6.jsonl is absent")
def test_all_145_shared_gold_plans_are_valid_and_reach_the_goal():
    task = Blocksworld()
    examples = task.load(str(SHARED))
    assert len(examples) == 145
    for ex in examples:
        assert task.score(ex, "\n".join(ex.data["gold_plan"]))["correct"], ex.id
