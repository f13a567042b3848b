"""CoT, CoT-SC and MCTS on the scripted fake engine: the exact trees, votes and calls they make."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from scripted_engine import ScriptedEngine
from test_search import EXAMPLE, EXAMPLES, ToyTask, caller_for, read_lines, script

from seed_tot.search import ConfigError, ResultsFileError, apply_overrides, load_settings, solve_dataset
from seed_tot.search.accounting import wilson
from seed_tot.search.cot import majority, self_consistency
from seed_tot.search.mcts import MCTSConfig, mcts
from seed_tot.search.protocol import Example, Prompt, SearchConfig, State


class RangedToy(ToyTask):
    value_range = (0.0, 10.0)  # rewards are value / 10


TREE = script(thoughts={"": ["a", "b"], "a": ["a1", "a2"], "b": ["b1", "b2"]},
              values={"a": 3, "b": 7, "a/a1": 8, "a/a2": 1, "b/b1": 2, "b/b2": 9})


def toy(values_a: float = 3) -> tuple[RangedToy, ScriptedEngine]:
    respond = script(thoughts={"": ["a", "b"], "a": ["a1", "a2"], "b": ["b1", "b2"]},
                     values={"a": values_a, "b": 7, "a/a1": 8, "a/a2": 1, "b/b1": 2, "b/b2": 9})
    return RangedToy(SearchConfig(depth=2, n_generate=2, max_new_tokens=16)), ScriptedEngine(respond)


def users(engine: ScriptedEngine, call: int) -> list[str]:
    return [engine.user_of(p) for p in engine.calls[call].prompts]


# ---------------------------------------------------------------------------- CoT / CoT-SC
def chains(replies: list[str]):
    def respond(user: str, copy: int) -> str:
        assert user == "answer e1 ", user  # the root's answer prompt, the same for every chain
        return replies[copy]
    return respond


def test_cot_sc_votes_over_k_chains_of_one_call_and_ties_go_to_the_first():
    engine = ScriptedEngine(chains(["y", "x", "x", "y", "z"]))
    result = self_consistency(caller_for(engine), ToyTask(), EXAMPLE, samples=5)
    assert len(engine.calls) == 1 and len(engine.calls[0].prompts) == 5  # k chains share one call
    assert result.prediction == "y"  # y and x both have 2 votes: y came first
    step = result.steps[0]
    assert step["votes"] == {"y": 2, "x": 2, "z": 1} and step["kept"] == [0, 3]
    assert step["values"] == [2.0, 2.0, 2.0, 2.0, 1.0] and step["predictions"] == ["y", "x", "x", "y", "z"]


def test_cot_sc_majority_beats_the_first_chain():
    result = self_consistency(caller_for(ScriptedEngine(chains(["z", "x", "x"]))), ToyTask(), EXAMPLE, samples=3)
    assert result.prediction == "x" and result.answer == "x" and result.value == 2.0
    assert majority(["a", "b", "b", "a", "a"]) == ("a", {"a": 3, "b": 2})


def test_cot_is_one_chain():
    engine = ScriptedEngine(chains(["q"]))
    result = self_consistency(caller_for(engine), ToyTask(), EXAMPLE, samples=1)
    assert result.prediction == "q" and len(engine.calls) == 1 and len(engine.calls[0].prompts) == 1


class ChainToy(ToyTask):
    """A task with its own chain-of-thought prompt and reading of a chain."""

    def cot_prompt(self, example: Example) -> Prompt:
        return Prompt(user=f"chain {example.id}", stop=("\nQ:",), max_new_tokens=12)

    def cot_prediction(self, example: Example, chain: str) -> str:
        return chain.split("so ")[-1].strip()


def test_cot_uses_the_tasks_own_chain_prompt_and_reading_where_it_has_them():
    engine = ScriptedEngine(lambda user, copy: {"chain e1": ["a then b so x", "so y", "c so x"][copy]}[user])
    result = self_consistency(caller_for(engine), ChainToy(SearchConfig(max_new_tokens=64)), EXAMPLE, samples=3)
    (call,) = engine.calls
    assert users(engine, 0) == ["chain e1"] * 3
    assert call.params.stop == ("\nQ:",) and call.params.max_new_tokens == 12  # the chain prompt's own stop and budget
    assert result.steps[0]["predictions"] == ["x", "y", "x"] and result.prediction == "x"


def test_a_chain_reading_that_is_not_text_names_the_method():
    class BadChainToy(ChainToy):
        def cot_prediction(self, example: Example, chain: str):
            return 7

    with pytest.raises(TypeError, match="cot_prediction returned 7"):
        self_consistency(caller_for(ScriptedEngine(lambda user, copy: "so x")), BadChainToy(), EXAMPLE, samples=1)


# ---------------------------------------------------------------------------- MCTS
def test_mcts_uct_exploits_then_stops_at_a_final_leaf():
    """c = 1, 3 iterations. 0: the root's children a (0.3) and b (0.7). 1: ln 1 = 0, so the
    higher reward, b, is expanded: b1 (0.2), b2 (0.9). 2: UCT(a) = 0.3 + sqrt(ln 2 / 1) = 1.13,
    UCT(b) = 0.9 + sqrt(ln 2 / 2) = 1.49: b again, then b2 (final at depth 2) backs up 0.9."""
    task, engine = toy()
    result = mcts(caller_for(engine), task, EXAMPLE, task.config, MCTSConfig(iterations=3, exploration=1.0))
    assert [users(engine, i) for i in (0, 2)] == [["think e1 "] * 2, ["think e1 b"] * 2]
    assert len(engine.calls) == 5  # 2 expansions x (thoughts, values) + the answer
    assert [s["frontier"] for s in result.steps] == [[[]], [["b"]]]
    assert result.steps[0]["visits"] == [0, 2] and result.steps[0]["kept"] == [1, 0]  # ranked by visits
    assert result.steps[1]["visits"] == [0, 1] and result.steps[1]["mean_values"] == [0.2, 0.9]
    assert result.steps[0]["mean_values"] == [0.3, 0.9]
    assert result.state == State(("b", "b2")) and result.prediction == "b/b2" and result.value == 9


def test_mcts_exploration_constant_sends_it_to_the_lower_valued_child():
    """a = 0.5, c = 2: at iteration 2 UCT(a) = 0.5 + 2 sqrt(ln 2) = 2.17 > UCT(b) = 0.9 + 2 sqrt(ln 2 / 2)
    = 2.08, so a is expanded (a1 0.8, a2 0.1); the answer by visits ties 1-1 and goes to b's mean
    0.9."""
    task, engine = toy(values_a=5)
    result = mcts(caller_for(engine), task, EXAMPLE, task.config, MCTSConfig(iterations=3, exploration=2.0))
    assert [s["frontier"] for s in result.steps] == [[[]], [["b"]], [["a"]]]
    assert result.steps[0]["visits"] == [1, 1] and result.state == State(("b", "b2"))


def test_mcts_without_exploration_follows_the_best_mean_and_both_answer_rules_agree():
    """c = 0. Iteration 0 values a 0.95, b 0.7; 1 expands a, whose best child is 0.2 (a's mean now
    0.2); 2 expands b (0.7 > 0.2): b2 0.9; 3 takes b (0.9) again and ends at b2, final."""
    respond = script(thoughts={"": ["a", "b"], "a": ["a1", "a2"], "b": ["b1", "b2"]},
                     values={"a": 9.5, "b": 7, "a/a1": 1, "a/a2": 2, "b/b1": 2, "b/b2": 9})
    task = RangedToy(SearchConfig(depth=2, n_generate=2, max_new_tokens=16))
    by = {}
    for answer in ("visits", "value"):
        by[answer] = mcts(caller_for(ScriptedEngine(respond)), task, EXAMPLE, task.config,
                          MCTSConfig(iterations=4, exploration=0.0, answer=answer))
    assert [s["frontier"] for s in by["visits"].steps] == [[[]], [["a"]], [["b"]]]
    assert by["visits"].steps[0]["visits"] == [1, 2] and by["visits"].steps[0]["mean_values"] == [0.2, 0.9]
    assert by["visits"].state == by["value"].state == State(("b", "b2"))


def test_mcts_parallel_leaves_batch_m_leaves_under_virtual_loss_into_each_call():
    """m = 2. Iteration 0: only the root is open (a second descent reaches it again). Iteration 1:
    the first descent takes b (0.7); its virtual loss makes b's Q 0/1, so the second takes a:
    one thought call with b's and a's rows, one value call with their 4 children."""
    task, engine = toy()
    result = mcts(caller_for(engine), task, EXAMPLE, task.config,
                  MCTSConfig(iterations=2, exploration=1.0, parallel_leaves=2))
    assert users(engine, 0) == ["think e1 "] * 2
    assert users(engine, 2) == ["think e1 b"] * 2 + ["think e1 a"] * 2
    assert users(engine, 3) == ["value e1 b/b1", "value e1 b/b2", "value e1 a/a1", "value e1 a/a2"]
    assert len(engine.calls) == 5
    assert [s["iteration"] for s in result.steps] == [0, 1, 1]
    assert result.steps[0]["visits"] == [1, 1]


def test_mcts_is_deterministic_for_a_seed():
    task, _ = toy()
    runs = []
    for _ in range(2):
        engine = ScriptedEngine(TREE)
        result = mcts(caller_for(engine, seed=3), task, EXAMPLE, task.config,
                      MCTSConfig(iterations=4, exploration=1.4, parallel_leaves=3))
        runs.append((json.dumps(result.to_dict()), [(c.prompts, c.params.seed) for c in engine.calls]))
    assert runs[0] == runs[1]


def test_mcts_settings_are_checked():
    with pytest.raises(ValueError, match="answer must be one of"):
        MCTSConfig(answer="best")
    with pytest.raises(ValueError, match="at least 1"):
        MCTSConfig(parallel_leaves=0)


# ---------------------------------------------------------------------------- through solve_dataset
ALL = ("bfs", "dfs", "cot", "cot-sc", "mcts")


def solve(tmp_path: Path, algorithm: str, task=None, resume: bool = False, examples=EXAMPLES, concurrency: int = 1,
          **options) -> dict:
    task = task or RangedToy()
    settings = load_settings(None, base=task.config)
    settings = apply_overrides(settings, algorithm=algorithm, **options)

    def respond(user: str, copy: int) -> str:
        kind, _, path = user.split(" ", 2)
        if kind == "think":
            return f"{path.replace('/', '')}{'abc'[copy]}"
        if kind == "value":
            return str(len(path) % 10)
        return path or "b/b2"

    return solve_dataset(ScriptedEngine(respond), task, examples, settings=settings, output_dir=tmp_path,
                         resume=resume, concurrency=concurrency)


@pytest.mark.parametrize("algorithm", ALL)
def test_every_algorithm_records_its_cost_and_tree(tmp_path: Path, algorithm: str):
    summary = solve(tmp_path, algorithm, samples=3, iterations=3, parallel_leaves=2)
    records = read_lines(tmp_path)
    assert summary["algorithm"] == algorithm and len(records) == 3
    for record in records:
        cost = record["cost"]
        assert cost["new_tokens"] == sum(s["new_tokens"] for s in record["stats"].values()) > 0
        assert cost["engine_calls"] >= 1 and cost["wall_s"] == record["wall_s"] and record["steps"]
    assert summary["mean_new_tokens"] == sum(r["cost"]["new_tokens"] for r in records) / 3
    assert summary["mean_engine_calls"] == sum(r["cost"]["engine_calls"] for r in records) / 3
    assert summary["mean_wall_s"] > 0


def test_cot_sc_through_solve_dataset_makes_one_call_per_problem(tmp_path: Path):
    solve(tmp_path, "cot-sc", samples=4)
    assert {r["cost"]["engine_calls"] for r in read_lines(tmp_path)} == {1}
    assert json.loads((tmp_path / "summary.json").read_text())["settings"]["samples"] == 4


class InterruptedMidMCTS(RangedToy):
    """Ctrl-C in the middle of the second problem's search (its second expansion)."""

    def thought_prompt(self, example: Example, state: State) -> Prompt:
        if example.id == "e2" and state.depth == 1:
            raise KeyboardInterrupt
        return super().thought_prompt(example, state)


def test_resume_mid_mcts_loses_only_the_problem_in_flight(tmp_path: Path):
    whole = tmp_path / "whole"
    solve(whole, "mcts", iterations=3)
    cut = tmp_path / "cut"
    with pytest.raises(KeyboardInterrupt):
        solve(cut, "mcts", task=InterruptedMidMCTS(), iterations=3)
    assert [r["id"] for r in read_lines(cut)] == ["e1"]
    solve(cut, "mcts", resume=True, iterations=3)

    def tree(path: Path) -> dict:
        return {r["id"]: (r["prediction"], r["steps"]) for r in read_lines(path)}

    assert tree(cut) == tree(whole)


def test_a_resume_with_another_mcts_setting_is_refused_and_other_algorithms_options_do_not_count(tmp_path: Path):
    solve(tmp_path, "mcts", iterations=2)
    with pytest.raises(ResultsFileError, match="iterations"):
        solve(tmp_path, "mcts", resume=True, iterations=3)
    solve(tmp_path, "mcts", resume=True, iterations=2, samples=9)  # cot-sc's k: not read by mcts


def test_the_yaml_keys_of_the_new_algorithms_are_read_and_typos_refused(tmp_path: Path):
    good = tmp_path / "good.yaml"
    good.write_text("algorithm: mcts\niterations: 7\nexploration: 0.5\nparallel_leaves: 3\nmcts_answer: value\n"
                    "samples: 9\n")
    settings = load_settings(good)
    assert (settings.algorithm, settings.iterations, settings.exploration, settings.parallel_leaves,
            settings.mcts_answer, settings.samples) == ("mcts", 7, 0.5, 3, "value", 9)
    bad = tmp_path / "bad.yaml"
    bad.write_text("algorithm: mcts\niteration: 7\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:2: unknown key 'iteration'"):
        load_settings(bad)
    bad.write_text("mcts_answer: best\n")
    with pytest.raises(ConfigError, match="mcts_answer"):
        load_settings(bad)


def test_wilson_interval():
    low, high = wilson(0, 15)
    assert low == 0.0 and high == pytest.approx(0.2039, abs=1e-4)
    low, high = wilson(15, 30)
    assert low == pytest.approx(0.3315, abs=1e-4) and high == pytest.approx(0.6685, abs=1e-4)


# ---------------------------------------------------------------------------- the tree page and compare
def test_the_tree_page_draws_mcts_visits_means_and_expansion_order(tmp_path: Path):
    from seed_tot.view.page_data import build_page_data, load_run
    solve(tmp_path, "mcts", iterations=3, parallel_leaves=2)
    record = read_lines(tmp_path)[0]
    nodes = build_page_data([load_run(tmp_path)])["problems"][0]["runs"][0]["nodes"]
    first = [n for n in nodes if n["s"] == 0]
    assert [n["n"] for n in first] == record["steps"][0]["visits"]
    assert [n["q"] for n in first] == record["steps"][0]["mean_values"]
    expanded = [n for n in nodes if "o" in n]
    # every expansion but the root's is drawn on the node it expanded, in the order of the steps
    assert sorted(n["o"] for n in expanded) == list(range(1, len(record["steps"])))
    for n in expanded:
        assert record["steps"][n["o"]]["frontier"] == [record["steps"][n["s"]]["new_states"][n["i"]]]
    assert all(n["p"] == -1 for n in first) and any(n["p"] >= 0 for n in nodes)
    # each expansion's rows were found in the batched calls: every thought and value has its counters
    assert all(w is not None for step in record["node_work"] for w in step["thought_work"] + step["value_work"])


def test_the_tree_page_draws_the_chains_and_the_vote_of_cot_sc(tmp_path: Path):
    from seed_tot.view.page_data import build_page_data, load_run
    solve(tmp_path, "cot-sc", samples=3)
    entry = build_page_data([load_run(tmp_path)])["problems"][0]["runs"][0]
    assert entry["votes"] == {"b/b2": 3} and [n["pr"] for n in entry["nodes"]] == ["b/b2"] * 3
    assert [n["k"] for n in entry["nodes"]] == [0, 1, 2] and "n" not in entry["nodes"][0]


def test_compare_prints_accuracy_interval_tokens_and_problems_per_hour(tmp_path: Path):
    from click.testing import CliRunner

    from seed_tot.cli import main
    solve(tmp_path / "cot", "cot")
    solve(tmp_path / "mcts", "mcts", iterations=2, parallel_leaves=2)
    result = CliRunner().invoke(main, ["compare", str(tmp_path / "cot"), str(tmp_path / "mcts")])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    cot_row, mcts_row = lines[2], lines[3]
    mean_new = json.loads((tmp_path / "cot" / "summary.json").read_text())["mean_new_tokens"]
    assert "| cot " in cot_row and "mcts it=2 m=2" in mcts_row
    # 2 of the 3 problems' gold is b/b2, which the scripted answer writes: 0.667, Wilson 0.208-0.939
    assert "0.667 (2/3)" in cot_row and "0.208-0.939" in cot_row and f"{mean_new:.1f}" in cot_row
    rows = [json.loads(line) for line in CliRunner().invoke(main, ["compare", "--json", str(tmp_path / "cot")]).output.splitlines()]
    assert rows[0]["n"] == 3 and rows[0]["problems_per_h"] > 0
    missing = CliRunner().invoke(main, ["compare", str(tmp_path / "nothing")])
    assert missing.exit_code == 2 and "no results.jsonl" in missing.output


def test_problems_per_hour_counts_every_sitting_and_what_a_concurrent_one_did_at_once(tmp_path: Path):
    from seed_tot.search.compare import run_row
    first = solve(tmp_path, "cot", examples=EXAMPLES[:2], concurrency=2)
    assert [(s["solved"], s["concurrency"]) for s in first["sittings"]] == [(2, 2)]
    summary = solve(tmp_path, "cot", resume=True)
    sittings = summary["sittings"]
    assert [(s["solved"], s["concurrency"]) for s in sittings] == [(2, 2), (1, 1)]
    assert sittings[0] == first["sittings"][0] and all(s["wall_s"] > 0 for s in sittings)
    assert run_row(tmp_path)["problems_per_h"] == pytest.approx(3600 * 3 / sum(s["wall_s"] for s in sittings))
    # summarised again with nothing left to solve: no sitting added
    assert solve(tmp_path, "cot", resume=True)["sittings"] == sittings
    # a fresh run in a folder whose results were removed does not inherit the old summary's sittings
    (tmp_path / "results.jsonl").unlink()
    assert [s["solved"] for s in solve(tmp_path, "cot")["sittings"]] == [3]


def test_cot_sc_chains_carry_their_engine_work_on_the_page(tmp_path: Path):
    solve(tmp_path, "cot-sc", samples=3)
    record = read_lines(tmp_path)[0]
    work = record["node_work"][0]
    # the scripted engine counts 2 tokens per word; each chain is one word
    assert [w["new_tokens"] for w in work["thought_work"]] == [2, 2, 2]
    assert work["call_work"]["thought"]["new_tokens"] == 6 and work["value_work"] == [None] * 3
