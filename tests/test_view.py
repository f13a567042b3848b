"""The tree page's data and files (no browser): node work recorded during a solve, the flattened
trees, differences between runs, missing fields, and the `view` / `solve --view` commands."""
from __future__ import annotations

import dataclasses
import json
import re

import pytest
from click.testing import CliRunner
from scripted_engine import ScriptedEngine
from short_task import ShortTask
from view_runs import BREADTH, DEPTH, N_GENERATE, QUESTIONS, records, respond, rewrite, solve_run

from seed_tot.cli import main
from seed_tot.search import DecodingSettings, LLMCaller, load_settings, shipped_config, solve_dataset
from seed_tot.search.bfs import bfs
from seed_tot.search.protocol import Example, State
from seed_tot.tasks import get_task
from seed_tot.search.node_work import CallLog, node_work
from seed_tot.view.page import embed_json, write_page
from seed_tot.view.page_data import build_page_data, load_run, problem_entry, tree_nodes

FIXTURES = "tests/fixtures"


def run_cli(*args: str) -> str:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def page_data(html: str) -> dict:
    found = re.search(r'<script type="application/json" id="run-data">(.*?)</script>', html, re.S)
    return json.loads(found.group(1))


def test_solve_records_each_nodes_evaluator_reply_and_engine_counters(tmp_path):
    record = records(solve_run(tmp_path / "run"))[0]
    assert len(record["node_work"]) == len(record["steps"]) == DEPTH
    for step, work in zip(record["steps"], record["node_work"]):
        n = len(step["thoughts"])
        assert len(work["thought_work"]) == len(work["value_work"]) == len(work["value_replies"]) == n
        for thought, counters in zip(step["thoughts"], work["thought_work"]):
            # the scripted engine reports 2 tokens per word of the text it returns
            assert counters["new_tokens"] == 2 * len(thought.split())
        for state, reply, value in zip(step["new_states"], work["value_replies"], step["values"]):
            user = f"rate {QUESTIONS[int(record['id'])]}:{'/'.join(state)}"
            assert reply == respond(user, 0) and value == float(sum(c in "aeiou" for c in reply))
        assert work["call_work"]["thought"]["new_tokens"] == sum(w["new_tokens"] for w in work["thought_work"])


def test_greedy_steps_stay_free_of_engine_counters(tmp_path):
    """Counters differ between modes; the tree log must not, so greedy ar and seed trees compare equal."""
    step = records(solve_run(tmp_path / "run"))[0]["steps"][0]
    assert set(step) == {"step", "frontier", "thoughts", "parents", "new_states", "values", "kept"}


class PriorTask(ShortTask):
    """Settles states whose last thought has "idea 1" without the model; draws states in capitals."""

    def prior_value(self, example: Example, state: State):
        return 9.0 if "idea 1" in state.thoughts[-1] else None

    def show_state(self, example: Example, state: State) -> str:
        return " | ".join(state.thoughts).upper()


def test_states_valued_without_the_model_have_no_reply_and_others_keep_theirs(tmp_path):
    task = PriorTask()
    example = Example("0", {"question": "apples", "answer": "yes"})
    calls = CallLog(ScriptedEngine(respond))
    result = bfs(LLMCaller(calls, DecodingSettings()), task, example, task.config)
    work = node_work(calls, task, example, result.steps)
    for step, step_work in zip(result.steps, work):
        for thought, reply, counters in zip(step["thoughts"], step_work["value_replies"], step_work["value_work"]):
            asked = "idea 1" not in thought
            assert (reply is not None) == asked and (counters is not None) == asked


def test_custom_task_show_state_draws_each_node(tmp_path):
    run = solve_run(tmp_path / "run")
    record = records(run)[0]
    nodes, _ = tree_nodes(record, PriorTask().show_state)
    last = record["steps"][-1]
    shown = [n["x"] for n in nodes if n["s"] == len(record["steps"]) - 1]
    assert shown == [" | ".join(s).upper() for s in last["new_states"]]


def test_tree_nodes_link_parents_and_count_kept_and_pruned(tmp_path):
    record = records(solve_run(tmp_path / "run"))[0]
    nodes, steps = tree_nodes(record)
    assert len(steps) == DEPTH
    first = [n for n in nodes if n["s"] == 0]
    second = [n for n in nodes if n["s"] == 1]
    assert len(first) == N_GENERATE and len(second) == BREADTH * N_GENERATE
    assert sum(n["k"] is not None for n in first) == sum(n["k"] is not None for n in second) == BREADTH
    assert all(n["p"] == -1 for n in first)
    assert all(nodes[n["p"]]["s"] == 0 and nodes[n["p"]]["k"] is not None for n in second)
    chosen = [n for n in nodes if n.get("c")]
    assert [n["s"] for n in chosen] == [0, 1] and chosen[1]["p"] == nodes.index(chosen[0])


def test_dfs_expansions_hang_under_the_state_they_expanded(tmp_path):
    record = records(solve_run(tmp_path / "dfs", algorithm="dfs"))[0]
    assert len(record["steps"]) > DEPTH  # it backtracked, so some expansion's parent is not the last one
    nodes, _ = tree_nodes(record)
    for node in nodes:
        step = record["steps"][node["s"]]
        parent = nodes[node["p"]] if node["p"] >= 0 else None
        parent_state = record["steps"][parent["s"]]["new_states"][parent["i"]] if parent else []
        assert parent_state == step["frontier"][0] and (parent is None or parent["k"] is not None)


def test_planted_difference_is_marked_on_both_runs_and_only_there(tmp_path):
    base, other = solve_run(tmp_path / "a"), solve_run(tmp_path / "b")
    rewrite(other, lambda rows: rows[1]["steps"][1]["thoughts"].__setitem__(4, "a planted thought"))
    data = build_page_data([load_run(base), load_run(other)])
    diffs = [p["diff"] for p in data["problems"]]
    assert diffs[0] is None and diffs[2] is None and diffs[1]["first_step"] == 1
    for entry in data["problems"][1]["runs"]:
        assert [(n["s"], n["i"]) for n in entry["nodes"] if n.get("d")] == [(1, 4)]
    assert data["greedy"] is True


def test_missing_fields_are_named_and_the_rest_still_builds(tmp_path):
    run = solve_run(tmp_path / "run")

    def drop(rows):
        del rows[0]["node_work"], rows[0]["stats"]
        del rows[1]["steps"][0]["values"]
        rows[2] = {"id": rows[2]["id"], "error": "worker died"}

    rewrite(run, drop)
    (run / "summary.json").unlink()
    loaded = load_run(run)
    entries = [problem_entry(r) for r in loaded.records]
    assert "stats" in entries[0]["missing"] and any(m.startswith("node_work") for m in entries[0]["missing"])
    assert "steps[0].values" in entries[1]["missing"] and entries[1]["nodes"]
    assert entries[2]["error"] == "worker died" and "steps" in entries[2]["missing"]
    assert any("summary.json missing" in note for note in loaded.notes)


@pytest.mark.parametrize("name, data, question", [
    ("gsm8k", "gsm8k_small.jsonl", "Tom has 3 apples"), ("blocksworld", "blocksworld_small.jsonl", "problem_pddl"),
    ("creative_writing", "creative_writing_small.txt", "lighthouse keeper")])
def test_every_builtin_task_solves_into_a_page_with_its_question_and_tree(tmp_path, name, data, question):
    task = get_task(name)
    settings = load_settings(shipped_config(task.name), base=task.config, task_name=task.name)
    settings = dataclasses.replace(settings, search=dataclasses.replace(settings.search, depth=2))
    reply = "Step: 3 + 4 = 7. The answer is 7. sure 8 (pick-up a) good"
    solve_dataset(ScriptedEngine(lambda user, copy: reply), task, task.load(f"{FIXTURES}/{data}", limit=1),
                  settings=settings, output_dir=tmp_path / name)
    problem = build_page_data([load_run(tmp_path / name)], getattr(task, "show_state", None))["problems"][0]
    entry = problem["runs"][0]
    assert question in problem["q"] and entry["missing"] == []
    assert len(entry["nodes"]) == sum(len(s["thoughts"]) for s in records(tmp_path / name)[0]["steps"]) > 0


def test_embedded_json_cannot_close_its_script_element():
    text = embed_json({"t": "</script><script>alert(1)</script>"})
    assert "</" not in text and json.loads(text)["t"].startswith("</script>")


def test_view_command_writes_one_self_contained_page(tmp_path):
    run = solve_run(tmp_path / "run")
    out = run_cli("view", str(run), str(solve_run(tmp_path / "run2")), "--output", str(tmp_path / "page.html"))
    html = (tmp_path / "page.html").read_text()
    assert "wrote" in out and "default-src 'none'" in html
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)  # nothing fetched from anywhere
    data = page_data(html)
    assert [r["label"] for r in data["runs"]] == ["run", "run2"] and len(data["problems"]) == len(QUESTIONS)


@pytest.mark.parametrize("name", ["__DATA__", "__SCRIPT__"])
def test_a_run_named_like_a_placeholder_is_only_its_name_on_the_page(tmp_path, name):
    # placeholders were replaced one after another, so a title holding one got the data or the script
    html = write_page([solve_run(tmp_path / name)], tmp_path / "p.html").read_text()
    assert re.search(r"<title>(.*?)</title>", html).group(1) == f"seed-tot: {name}"
    assert html.count('id="run-data"') == 1 and html.count("JSON.parse(") == 1
    assert page_data(html)["runs"][0]["label"] == name


def test_write_page_labels_runs_with_the_same_name_by_their_parent(tmp_path):
    a, b = solve_run(tmp_path / "x" / "run"), solve_run(tmp_path / "y" / "run")
    data = page_data(write_page([a, b], tmp_path / "p.html").read_text())
    assert [r["label"] for r in data["runs"]] == ["x/run", "y/run"]


def _solve(tmp_path, models, mode, name, *extra):
    target, draft = models
    out = tmp_path / name
    run_cli("solve", "gsm8k", "--data", f"{FIXTURES}/gsm8k_small.jsonl", "--mode", mode, "--target", target,
            "--draft", draft, "--temperature", "0", "--max-new-tokens", "8", "--output", str(out), "--view", *extra)
    return out


def test_solve_view_writes_tree_html_and_greedy_ar_and_seed_pages_match(tmp_path, tiny_model_dirs):
    ar = _solve(tmp_path, tiny_model_dirs, "ar", "ar", "--limit", "1")
    seed = _solve(tmp_path, tiny_model_dirs, "seed", "seed", "--limit", "1")
    data = page_data((seed / "tree.html").read_text())
    assert data["runs"][0]["mode"] == "seed" and data["runs"][0]["target"] == tiny_model_dirs[0]
    assert data["problems"][0]["runs"][0]["missing"] == []
    both = build_page_data([load_run(ar), load_run(seed)])
    assert both["greedy"] and [p["diff"] for p in both["problems"]] == [None]
    # a resumed run rewrites the page with every problem, the earlier ones included
    _solve(tmp_path, tiny_model_dirs, "ar", "ar", "--limit", "2", "--resume")
    assert len(page_data((ar / "tree.html").read_text())["problems"]) == 2
