"""The command line end to end on tiny random models saved as local directories."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from seed_tot.cli import main

FIXTURES = "tests/fixtures"


def run(*args: str) -> str:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


def fails(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code != 0
    return result.output + (str(result.exception) if result.exception else "")


def test_generate_greedy_prints_the_same_tokens_in_ar_and_seed(tiny_model_dirs):
    target, draft = tiny_model_dirs
    outs = []
    for mode in ("ar", "seed", "mcsd"):
        tree = ["--k-config", "2,2,1"] if mode != "ar" else []  # ar drafts nothing: --k-config is refused
        out = run("generate", "Tom has 3 apples.", "--target", target, "--draft", draft, "--mode", mode,
                  *tree, "--max-new-tokens", "12", "-n", "2", "--json")
        outs.append([json.loads(line)["token_ids"] for line in out.splitlines()])
    assert outs[0] == outs[1] == outs[2] and len(outs[0]) == 2


def test_generate_prints_text_and_stats(tiny_model_dirs):
    target, draft = tiny_model_dirs
    out = run("generate", "Hi", "--target", target, "--draft", draft, "--mode", "sd", "--max-new-tokens", "6")
    assert "acceptance" in out and "tokens/target forward" in out and "mode=sd" in out


def test_modes_without_drafting_do_not_load_the_draft(tmp_path, tiny_model_dirs):
    target, _ = tiny_model_dirs
    missing = str(tmp_path / "no-such-draft")  # loading it would fail, so only a skipped load passes
    out = run("generate", "Hi", "--target", target, "--draft", missing, "--mode", "ar", "--max-new-tokens", "4")
    assert "draft=none" in out
    assert "no-such-draft" in fails("generate", "Hi", "--target", target, "--draft", missing, "--mode", "seed",
                                    "--max-new-tokens", "4")


def _solve(tmp_path, target, draft, mode, name, *extra):
    out_dir = tmp_path / name
    run("solve", "gsm8k", "--data", f"{FIXTURES}/gsm8k_small.jsonl", "--limit", "1", "--mode", mode,
        "--target", target, "--draft", draft, "--temperature", "0", "--max-new-tokens", "10",
        "--output", str(out_dir), *extra)
    return [json.loads(line) for line in (out_dir / "results.jsonl").read_text().splitlines()], out_dir


def test_greedy_tot_solve_gives_identical_trees_in_ar_and_seed(tmp_path, tiny_model_dirs):
    target, draft = tiny_model_dirs
    ar, _ = _solve(tmp_path, target, draft, "ar", "ar")
    seed, out_dir = _solve(tmp_path, target, draft, "seed", "seed")
    assert [r["prediction"] for r in ar] == [r["prediction"] for r in seed]
    assert [r["steps"] for r in ar] == [r["steps"] for r in seed]
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["n"] == 1 and "accuracy" in summary and summary["mode"] == "seed"


def test_resume_skips_finished_ids_and_drops_a_truncated_line(tmp_path, tiny_model_dirs):
    target, draft = tiny_model_dirs
    first, out_dir = _solve(tmp_path, target, draft, "ar", "run")
    results = out_dir / "results.jsonl"
    with results.open("a") as fh:
        fh.write('{"id": "1", "input": {"quest')  # a run killed mid-write
    run("solve", "gsm8k", "--data", f"{FIXTURES}/gsm8k_small.jsonl", "--limit", "2", "--mode", "ar",
        "--target", target, "--draft", draft, "--temperature", "0", "--max-new-tokens", "10",
        "--output", str(out_dir), "--resume")
    ids = [json.loads(line)["id"] for line in results.read_text().splitlines()]
    assert ids == [first[0]["id"], "1"]


def test_resume_with_another_mode_is_refused_before_any_model_loads(tmp_path, tiny_model_dirs):
    """--resume --mode seed over records made in ar would label them all seed in summary.json."""
    target, draft = tiny_model_dirs
    _, out_dir = _solve(tmp_path, target, draft, "ar", "ar-run")
    msg = fails("solve", "gsm8k", "--data", f"{FIXTURES}/gsm8k_small.jsonl", "--limit", "2", "--mode", "seed",
                "--target", str(tmp_path / "no-such-model"), "--temperature", "0", "--max-new-tokens", "10",
                "--output", str(out_dir), "--resume")
    assert "mode: 'ar' there, 'seed' now" in msg and "no-such-model" not in msg  # refused before loading
    assert len((out_dir / "results.jsonl").read_text().splitlines()) == 1


def test_a_resume_with_nothing_left_writes_the_summary_without_loading_a_model(tmp_path, tiny_model_dirs,
                                                                              monkeypatch):
    import seed_tot.cli as cli

    target, draft = tiny_model_dirs
    _, out_dir = _solve(tmp_path, target, draft, "ar", "finished")
    first = json.loads((out_dir / "summary.json").read_text())
    (out_dir / "summary.json").unlink()

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded for a run with nothing left to solve")

    monkeypatch.setattr(cli, "load_engine", no_model)
    out = run("solve", "gsm8k", "--data", f"{FIXTURES}/gsm8k_small.jsonl", "--limit", "1", "--mode", "ar",
              "--target", target, "--draft", draft, "--temperature", "0", "--max-new-tokens", "10",
              "--output", str(out_dir), "--resume")
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["n"] == 1 and "1 problem" in out
    assert summary["target"] == first["target"] and summary["accuracy"] == first["accuracy"]


def test_existing_results_without_resume_is_refused(tmp_path, tiny_model_dirs):
    target, draft = tiny_model_dirs
    _, out_dir = _solve(tmp_path, target, draft, "ar", "again")
    msg = fails("solve", "gsm8k", "--data", f"{FIXTURES}/gsm8k_small.jsonl", "--limit", "1", "--target", target,
                "--output", str(out_dir))
    assert "--resume" in msg


def test_unknown_task_is_a_usage_error():
    assert "unknown task 'chess'" in fails("score", "chess", "--predictions", f"{FIXTURES}/gsm8k_small.jsonl")


def test_missing_data_file_is_named(tmp_path):
    msg = fails("solve", "gsm8k", "--data", str(tmp_path / "nope.jsonl"), "--output", str(tmp_path / "o"))
    assert "nope.jsonl" in msg and "no such file" in msg


def test_malformed_data_line_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "#### 1"}\n{"question": "q2", \n')
    preds = tmp_path / "p.jsonl"
    preds.write_text('{"id": "0", "prediction": "1"}\n')
    msg = fails("score", "gsm8k", "--data", str(bad), "--predictions", str(preds))
    assert f"{bad}:2" in msg


def test_score_rescores_saved_predictions(tmp_path):
    preds = tmp_path / "p.jsonl"
    lines = [json.loads(line) for line in open(f"{FIXTURES}/gsm8k_small.jsonl")]
    golds = [line["answer"].split("####")[-1].strip() for line in lines]
    preds.write_text("\n".join(json.dumps({"id": str(i), "prediction": f"The answer is {g}"})
                               for i, g in enumerate(golds[:2])) + "\n" + json.dumps({"id": "2", "prediction": "-1"}))
    out = json.loads(run("score", "gsm8k", "--data", f"{FIXTURES}/gsm8k_small.jsonl", "--predictions", str(preds), "--json"))
    assert out == {"n": 3, "correct": 2, "accuracy": pytest.approx(2 / 3), "no_prediction": 0}


def test_score_blocksworld_plans_in_natural_language_and_pddl(tmp_path):
    gold = json.loads(open(f"{FIXTURES}/blocksworld_small.jsonl").readline())
    preds = tmp_path / "p.jsonl"
    preds.write_text(json.dumps({"id": gold["id"], "prediction": "\n".join(gold["gold_plan"])}) + "\n")
    out = json.loads(run("score", "blocksworld", "--data", f"{FIXTURES}/blocksworld_small.jsonl",
                         "--predictions", str(preds), "--json"))
    assert out["correct"] == 1


def test_generate_trace_has_worker_and_verifier_tracks(tmp_path, tiny_model_dirs):
    target, draft = tiny_model_dirs
    run("generate", "Hi", "--target", target, "--draft", draft, "--mode", "seed", "-n", "3",
        "--max-new-tokens", "8", "--trace", str(tmp_path / "trace"))
    trace = json.loads((tmp_path / "trace" / "trace.json").read_text())
    names = {e["args"]["name"] for e in trace["traceEvents"] if e.get("ph") == "M" and e.get("name") == "thread_name"}
    assert {"target verifier", "draft worker 0", "draft worker 2"} <= names
    assert (tmp_path / "trace" / "gpu.csv").exists()


def test_solve_trace_spans_every_engine_call(tmp_path, tiny_model_dirs):
    target, draft = tiny_model_dirs
    _solve(tmp_path, target, draft, "seed", "traced", "--trace", str(tmp_path / "trace"))
    trace = json.loads((tmp_path / "trace" / "trace.json").read_text())
    spans = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    assert len(spans) > 4


def test_generates_summary_names_the_draft_policy_that_ran(tiny_model_dirs):
    """The policy a drafting call runs depends on the draft model when none is named: the summary says
    which one ran (with specdec or a drafter, a bare k_config would suggest the fixed shapes ran)."""
    target, draft = tiny_model_dirs
    out = run("generate", "Tom has 3 apples.", "--target", target, "--draft", draft, "--mode", "sd",
              "--max-new-tokens", "4")
    assert "--- mode=sd policy=fixed k_config=1,1,1 " in out
    out = run("generate", "Tom has 3 apples.", "--target", target, "--draft", "lookup", "--mode", "sd",
              "--max-new-tokens", "4")
    assert "--- mode=sd policy=lookup " in out
    assert "policy=" not in run("generate", "Tom has 3 apples.", "--target", target, "--mode", "ar",
                                "--max-new-tokens", "4")


def test_a_prompt_file_saved_with_a_byte_order_mark_reads_as_its_text(tmp_path, tiny_model_dirs):
    target, _ = tiny_model_dirs
    marked = tmp_path / "prompt.txt"
    marked.write_bytes("\ufeffTom has 3 apples.".encode("utf-8"))  # as Windows editors save UTF-8
    args = ["--target", target, "--mode", "ar", "--max-new-tokens", "6", "--temperature", "0"]
    from_file = run("generate", "--prompt-file", str(marked), *args)
    given = run("generate", "Tom has 3 apples.", *args)
    assert from_file.splitlines()[:2] == given.splitlines()[:2]  # header and completion (the mark was a prompt token)


def test_solve_search_flags_set_the_config_keys_over_the_yaml(tmp_path, tiny_model_dirs):
    """--depth/--breadth/--n-generate are the YAML keys depth/breadth/n_generate; a flag wins over the file."""
    target, draft = tiny_model_dirs
    config = tmp_path / "run.yaml"
    config.write_text("depth: 3\nbreadth: 2\nn_generate: 2\n")
    _, out_dir = _solve(tmp_path, target, draft, "ar", "flags", "--config", str(config), "--depth", "1",
                        "--breadth", "1", "--n-generate", "1")
    search = json.loads((out_dir / "summary.json").read_text())["settings"]["search"]
    assert (search["depth"], search["breadth"], search["n_generate"]) == (1, 1, 1), search


@pytest.mark.parametrize("key,flag", [("depth", "--depth"), ("breadth", "--breadth"), ("n_generate", "--n-generate")])
def test_solve_search_flags_are_checked_as_the_yaml_keys_are(tmp_path, key, flag):
    """The same check and the same words as the key in a file, before any model loads."""
    config = tmp_path / "bad.yaml"
    config.write_text(f"{key}: 0\n")
    from_file = fails("solve", "gsm8k", "--data", f"{FIXTURES}/gsm8k_small.jsonl", "--config", str(config),
                      "--output", str(tmp_path / "a"))
    from_flag = fails("solve", "gsm8k", "--data", f"{FIXTURES}/gsm8k_small.jsonl", flag, "0",
                      "--target", str(tmp_path / "no-model"), "--output", str(tmp_path / "b"))
    why = f"key '{key}': expected a positive integer"
    assert why in from_file and why in from_flag and "command line" in from_flag, from_flag


def test_tasks_lists_every_built_in_task_with_what_it_is_and_its_default_data():
    from seed_tot.tasks import TASK_NAMES, get_task

    out = run("tasks")
    for name in TASK_NAMES:
        assert f"{name}\n" in out
    assert "default data: the Hub dataset openai/gsm8k (main, test split)" in out
    assert "Blocksworld planning" in out and "default data: none: pass --data PATH" in out
    blocksworld = get_task("blocksworld")  # the words are what load(None) does
    assert f"{len(blocksworld.load(None))} random {blocksworld.n_blocks}-block instances" in out
