"""BFS / DFS / config / solve_dataset on a scripted fake engine (no models)."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from scripted_engine import ScriptedEngine

from seed_tot.engine.decode_spec import DecodeSpec
from seed_tot.search import (DecodingSettings, LLMCaller, ResultsFileError, RunSettings, apply_overrides,
                             bfs, dfs, load_settings, solve_dataset)
from seed_tot.search.protocol import Example, Prompt, SearchConfig, State, Task


class ToyTask:
    """Thoughts are words; a path is written "a/b"; a thought ending in "!" is final."""

    name = "toy"

    def __init__(self, config: SearchConfig | None = None):
        self.config = config or SearchConfig(depth=2, n_generate=3, breadth=1, max_new_tokens=16)

    def load(self, path: str | None = None, limit: int | None = None, offset: int = 0) -> list[Example]:
        return []

    @staticmethod
    def path(state: State) -> str:
        return "/".join(state.thoughts)

    def thought_prompt(self, example: Example, state: State) -> Prompt:
        return Prompt(user=f"think {example.id} {self.path(state)}", stop=("\n",))

    def extend(self, state: State, thought: str) -> State:
        return State(state.thoughts + (thought.strip(),))

    def value_prompt(self, example: Example, state: State) -> Prompt:
        return Prompt(user=f"value {example.id} {self.path(state)}", max_new_tokens=4)

    def parse_value(self, text: str) -> float:
        return float(text)

    def is_final(self, example: Example, state: State) -> bool:
        return bool(state.thoughts) and state.thoughts[-1].endswith("!")

    def answer_prompt(self, example: Example, state: State) -> Prompt:
        return Prompt(user=f"answer {example.id} {self.path(state)}", stop=("\n",))

    def prediction(self, example: Example, state: State, answer: str) -> str:
        return answer.strip()

    def score(self, example: Example, prediction: str) -> dict[str, Any]:
        return {"correct": prediction == example.data.get("gold")}


def script(thoughts: dict[str, list[str]], values: dict[str, float]):
    """A responder: thoughts by path (one reply per sample), values by path, answers echo the path."""
    def respond(user: str, copy: int) -> str:
        kind, _, path = user.split(" ", 2)
        if kind == "think":
            return thoughts[path][copy]
        if kind == "value":
            return str(values[path])
        if kind == "answer":
            return path
        if kind == "judge":
            return "7"
        raise AssertionError(f"unexpected prompt {user!r}")
    return respond


def caller_for(engine: ScriptedEngine, seed: int = 0) -> LLMCaller:
    return LLMCaller(engine, DecodingSettings(DecodeSpec(mode="seed", k_config=(1, 1, 1)), max_new_tokens=16, seed=seed))


EXAMPLE = Example(id="e1", data={"question": "q", "gold": "b/b2"})
TWO_STEP = script(
    thoughts={"": ["a", "b", "c"], "b": ["b1", "b2", "b3"], "c": ["c1", "c2", "c3"], "a": ["a1", "a2", "a3"]},
    values={"a": 3, "b": 7, "c": 7, "b/b1": 1, "b/b2": 9, "b/b3": 2, "c/c1": 5, "c/c2": 5, "c/c3": 5,
            "a/a1": 0, "a/a2": 0, "a/a3": 0},
)


# ---------------------------------------------------------------------------- BFS
def test_bfs_makes_one_thought_and_one_value_call_per_step():
    engine = ScriptedEngine(TWO_STEP)
    result = bfs(caller_for(engine), ToyTask(), EXAMPLE, ToyTask().config)

    assert len(engine.calls) == 2 * 2 + 1  # 2 steps x (thoughts, values), then the answer
    for step in range(2):
        thought_call, value_call = engine.calls[2 * step], engine.calls[2 * step + 1]
        assert len(thought_call.prompts) == 3 and len(set(thought_call.prompts)) == 1  # n copies
        assert len(value_call.prompts) == 3 and len(set(value_call.prompts)) == 3  # distinct states
        assert thought_call.params.stop == ("\n",) and value_call.params.max_new_tokens == 4
    # b and c tie at 7: the earlier (b) is kept, and the answer comes from the best final state
    assert result.state == State(("b", "b2"))
    assert result.prediction == "b/b2" and result.value == 9
    assert engine.user_of(engine.calls[-1].prompts[0]) == "answer e1 b/b2"


def test_a_value_that_cannot_be_ranked_is_an_error_naming_the_task_and_method():
    # NaN compares false with everything: BFS at breadth 1 kept "a" (NaN) over "b" (5.0) silently
    nan_first = script(thoughts={"": ["a", "b", "c"]}, values={"a": float("nan"), "b": 5.0, "c": 1.0})
    with pytest.raises(ValueError, match="task 'toy': parse_value returned NaN"):
        bfs(caller_for(ScriptedEngine(nan_first)), ToyTask(), EXAMPLE, ToyTask().config)

    class NoValue(ToyTask):
        def parse_value(self, text: str) -> float:
            return None  # a forgotten return

    with pytest.raises(TypeError, match="task 'toy': parse_value returned None; a value must be a number"):
        bfs(caller_for(ScriptedEngine(TWO_STEP)), NoValue(), EXAMPLE, ToyTask().config)


class StrExtend(ToyTask):
    def extend(self, state, thought):
        return thought  # a str, not a State


class StrPrompt(ToyTask):
    def value_prompt(self, example, state):
        return f"value {example.id} {self.path(state)}"


class NoPrediction(ToyTask):
    def prediction(self, example, state, answer):
        return None


class BoolScore(ToyTask):
    def score(self, example, prediction):
        return prediction == example.data["gold"]


@pytest.mark.parametrize("task, message", [
    (StrExtend(), "task 'toy': extend returned str 'a', not a State"),  # was: 'str' object has no attribute 'thoughts'
    (StrPrompt(), "the task's value_prompt returned str .*, not a Prompt"),  # was: no attribute 'max_new_tokens'
    (NoPrediction(), "task 'toy': prediction returned None; it must return a string"),
    (BoolScore(), "task 'toy': score returned (True|False); it must return a dict"),  # was: no attribute 'items'
])
def test_a_task_method_returning_the_wrong_type_is_an_error_naming_the_method(tmp_path, task, message):
    with pytest.raises(TypeError, match=message):
        solve_dataset(ScriptedEngine(TWO_STEP), task, [EXAMPLE], settings=RunSettings(search=task.config),
                      output_dir=tmp_path)


def test_bfs_log_matches_official_tot_shape():
    result = bfs(caller_for(ScriptedEngine(TWO_STEP)), ToyTask(), EXAMPLE, ToyTask().config)
    first, second = result.steps
    assert set(first) >= {"step", "frontier", "thoughts", "new_states", "values", "kept"}
    assert first["step"] == 0 and first["frontier"] == [[]]
    assert first["thoughts"] == ["a", "b", "c"]
    assert first["new_states"] == [["a"], ["b"], ["c"]]
    assert first["values"] == [3.0, 7.0, 7.0] and first["kept"] == [1]
    assert second["frontier"] == [["b"]] and second["kept"] == [1]
    json.dumps(result.to_dict())  # JSON-serialisable


def test_bfs_breadth_two_expands_every_kept_state_in_one_call():
    task = ToyTask(SearchConfig(depth=2, n_generate=3, breadth=2, max_new_tokens=16))
    engine = ScriptedEngine(TWO_STEP)
    result = bfs(caller_for(engine), task, EXAMPLE, task.config)
    second_thoughts = engine.calls[2].prompts
    assert len(second_thoughts) == 2 * 3  # |frontier| * n
    assert len(set(second_thoughts[:3])) == 1 and len(set(second_thoughts[3:])) == 1
    assert engine.user_of(second_thoughts[0]) == "think e1 b"  # ties keep order: b before c
    assert result.steps[0]["kept"] == [1, 2]
    assert result.steps[1]["values"] == [1.0, 9.0, 2.0, 5.0, 5.0, 5.0]
    assert result.steps[1]["kept"] == [1, 3]  # 9, then the first of the 5s
    assert result.state == State(("b", "b2"))


def test_bfs_stops_when_the_kept_state_is_final():
    responder = script(thoughts={"": ["a", "done!", "c"]}, values={"a": 1, "done!": 8, "c": 2})
    engine = ScriptedEngine(responder)
    task = ToyTask(SearchConfig(depth=4, n_generate=3, breadth=1))
    result = bfs(caller_for(engine), task, EXAMPLE, task.config)
    assert len(result.steps) == 1 and len(engine.calls) == 3
    assert result.prediction == "done!"


def test_prior_value_replaces_the_model_and_duplicates_are_valued_once():
    class WithPrior(ToyTask):
        def prior_value(self, example: Example, state: State) -> float | None:
            return -1.0 if state.thoughts[-1] == "illegal" else None

    responder = script(thoughts={"": ["illegal", "x", "x"], "x": ["y!"] * 3}, values={"x": 4, "x/y!": 6})
    engine = ScriptedEngine(responder)
    task = WithPrior()
    result = bfs(caller_for(engine), task, EXAMPLE, task.config)
    first_values = engine.calls[1]
    assert [engine.user_of(p) for p in first_values.prompts] == ["value e1 x"]  # one state asked
    assert result.steps[0]["values"] == [-1.0, 4.0, 0.0]  # prior, model, duplicate
    assert result.state == State(("x", "y!"))


# ---------------------------------------------------------------------------- DFS
DFS_SCRIPT = script(
    thoughts={"": ["a", "b", "c"], "a": ["a1", "a2", "a3"], "c": ["c1", "c2!", "c3"]},
    values={"a": 8, "b": 2, "c": 6, "a/a1": 1, "a/a2": 4, "a/a3": 0, "c/c1": 3, "c/c2!": 9, "c/c3": 7},
)


def test_dfs_prunes_below_threshold_and_backtracks():
    task = ToyTask(SearchConfig(depth=3, n_generate=3, value_threshold=5.0))
    engine = ScriptedEngine(DFS_SCRIPT)
    result = dfs(caller_for(engine), task, EXAMPLE, task.config)
    expanded = [step["frontier"][0] for step in result.steps]
    assert expanded == [[], ["a"], ["c"]]  # a first (8), a's children all pruned, back to c (6); b never
    assert result.steps[0]["kept"] == [0, 2]
    assert result.steps[1]["kept"] == []
    assert result.steps[2]["kept"] == [1, 2]  # c2! (9) then c3 (7); c2! is final, so the search stops
    assert result.state == State(("c", "c2!")) and result.prediction == "c/c2!"
    assert len(engine.calls) == 3 * 2 + 1


def test_dfs_budget_falls_back_to_the_best_state_seen():
    task = ToyTask(SearchConfig(depth=3, n_generate=3, value_threshold=5.0))
    result = dfs(caller_for(ScriptedEngine(DFS_SCRIPT)), task, EXAMPLE, task.config, max_expansions=2)
    assert result.expanded == 2
    assert result.state == State(("a",))  # the highest value seen (8)


# ---------------------------------------------------------------------------- LLMCaller
def test_a_prompts_single_stop_string_is_one_stop_not_its_characters():
    engine = ScriptedEngine(lambda user, copy: "1")
    caller_for(engine).complete([Prompt("x", stop="\n\n"), Prompt("y", stop=["END"])], phase="value")
    # stop="\n\n" used to stop at the first "\n" (tuple("\n\n")), and "END" at any E, N or D
    assert [c.params.stop for c in engine.calls] == [("\n\n",), ("END",)]


@pytest.mark.parametrize("fields, message", [
    (dict(stop=None), "Prompt stop must be a string or a tuple of strings"),
    (dict(stop=("",)), "Prompt stop strings must be non-empty strings"),
    (dict(max_new_tokens=0), "Prompt max_new_tokens must be a positive integer or None"),
    (dict(assistant_prefix=None), "Prompt assistant_prefix must be a string"),
])
def test_a_prompt_the_engine_cannot_run_is_refused_where_the_task_builds_it(fields, message):
    with pytest.raises((TypeError, ValueError), match=message):
        Prompt("x", **fields)


def test_caller_varies_seeds_per_call_reproducibly_and_groups_by_stop():
    def seeds(key: str) -> list[int]:
        engine = ScriptedEngine(lambda user, copy: "1")
        caller = caller_for(engine, seed=5)
        caller.reseed(key)
        caller.complete([Prompt("value e1 a")], phase="value")
        caller.complete([Prompt("value e1 a"), Prompt("value e1 b", stop=("x",))], phase="value")
        return [c.params.seed for c in engine.calls]

    first = seeds("p1")
    assert len(first) == 3 and len(set(first)) == 3  # the mixed-stop batch is split into 2 calls
    assert seeds("p1") == first and seeds("p2") != first

    engine = ScriptedEngine(lambda user, copy: "one two")
    caller = caller_for(engine)
    caller.complete([Prompt("x")] * 3, phase="thought")
    stats = caller.take_stats()
    assert set(stats) == {"thought"} and stats["thought"].new_tokens == 12
    assert stats["thought"].acceptance_rate == 0.5 and caller.take_stats() == {}


# ---------------------------------------------------------------------------- solve_dataset
EXAMPLES = [Example(id=f"e{i}", data={"question": f"q{i}", "gold": "b/b2" if i != 2 else "nope"}) for i in range(1, 4)]


def run(tmp_path: Path, task: Task | None = None, resume: bool = False) -> dict:
    task = task or ToyTask()
    settings = load_settings(None, base=task.config)
    return solve_dataset(ScriptedEngine(TWO_STEP), task, EXAMPLES, settings=settings,
                         output_dir=tmp_path, resume=resume)


def read_lines(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]


def test_solve_dataset_writes_results_and_summary(tmp_path: Path):
    summary = run(tmp_path)
    records = read_lines(tmp_path)
    assert [r["id"] for r in records] == ["e1", "e2", "e3"]
    first = records[0]
    assert first["prediction"] == "b/b2" and first["correct"] is True and first["input"]["question"] == "q1"
    assert len(first["steps"]) == 2 and first["steps"][0]["kept"] == [1]
    assert set(first["stats"]) == {"thought", "value", "answer"}
    assert first["stats"]["thought"]["acceptance_rate"] == 0.5 and first["wall_s"] >= 0
    assert summary == json.loads((tmp_path / "summary.json").read_text())
    assert summary["n"] == 3 and summary["accuracy"] == pytest.approx(2 / 3)
    assert summary["acceptance_rate"] == 0.5 and summary["tokens_per_target_forward"] == 2.0
    assert set(summary["phases"]) == {"thought", "value", "answer"}
    assert summary["mode"] == "seed" and summary["k_config"] == [1, 1, 1] and summary["algorithm"] == "bfs"


def test_solve_dataset_runs_the_judge_when_the_task_has_one(tmp_path: Path):
    class Judged(ToyTask):
        def judge_prompt(self, example: Example, prediction: str) -> Prompt:
            return Prompt(user=f"judge {example.id} {prediction}")

    summary = run(tmp_path, Judged())
    assert read_lines(tmp_path)[0]["judge_score"] == 7.0
    assert summary["mean_judge_score"] == 7.0 and "judge" in summary["phases"]


def test_existing_results_without_resume_is_an_error(tmp_path: Path):
    run(tmp_path)
    with pytest.raises(ResultsFileError, match="--resume"):
        run(tmp_path)


class InterruptedOnSecond(ToyTask):
    """A run that Ctrl-C stops at its second problem."""

    def thought_prompt(self, example: Example, state: State) -> Prompt:
        if example.id == "e2":
            raise KeyboardInterrupt
        return super().thought_prompt(example, state)


def test_resume_after_an_interrupt_solves_each_example_once(tmp_path: Path):
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, InterruptedOnSecond())
    assert [r["id"] for r in read_lines(tmp_path)] == ["e1"]

    summary = run(tmp_path, resume=True)
    assert [r["id"] for r in read_lines(tmp_path)] == ["e1", "e2", "e3"]
    assert summary["n"] == 3


def test_resume_drops_a_truncated_last_line(tmp_path: Path):
    run(tmp_path)
    path = tmp_path / "results.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:2]) + lines[2][:40])  # a write cut short by a kill
    fresh = run(tmp_path, resume=True)
    records = read_lines(tmp_path)
    assert [r["id"] for r in records] == ["e1", "e2", "e3"]
    assert fresh["n"] == 3


def test_resume_rejects_corruption_before_the_last_line(tmp_path: Path):
    run(tmp_path)
    path = tmp_path / "results.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("garbage\n" + "".join(lines))
    with pytest.raises(ResultsFileError, match="results.jsonl:1"):
        run(tmp_path, resume=True)


def test_resume_with_other_settings_is_refused_naming_each_difference(tmp_path: Path):
    """A resumed run's records would be appended beside the old ones and summarised under its
    settings: another mode or search shape is refused, naming what differs; the same settings
    from another file resume."""
    run(tmp_path)
    task = ToyTask()
    changed = apply_overrides(load_settings(None, base=task.config), mode="ar", max_new_tokens=7)
    with pytest.raises(ResultsFileError) as err:
        solve_dataset(ScriptedEngine(TWO_STEP), task, EXAMPLES, settings=changed, output_dir=tmp_path, resume=True)
    message = str(err.value)
    assert "run.json" in message and "mode: 'seed' there, 'ar' now" in message
    assert "search.max_new_tokens" in message and "k_config" not in message
    assert len(read_lines(tmp_path)) == 3  # nothing appended
    same = dataclasses.replace(load_settings(None, base=task.config), source="elsewhere.yaml")
    assert solve_dataset(ScriptedEngine(TWO_STEP), task, EXAMPLES, settings=same, output_dir=tmp_path,
                         resume=True)["n"] == 3


def test_a_resume_over_other_problems_with_the_same_ids_is_refused_naming_the_id(tmp_path: Path):
    """Ids are line indexes in most data files, so a resume given another file (GSM8K train for
    test) finds "its" ids done: those problems were skipped and other problems' records counted
    in their place. A record answers its id only if its input is that problem's."""
    run(tmp_path)
    other = [dataclasses.replace(ex, data={**ex.data, "question": "another"}) for ex in EXAMPLES]
    task = ToyTask()
    with pytest.raises(ResultsFileError) as err:
        solve_dataset(ScriptedEngine(TWO_STEP), task, other, settings=load_settings(None, base=task.config),
                      output_dir=tmp_path, resume=True)
    message = str(err.value)
    assert "results.jsonl:1" in message and "id 'e1'" in message and "3 of the requested" in message
    assert len(read_lines(tmp_path)) == 3  # nothing appended


def _named(target: str, draft: str) -> ScriptedEngine:
    engine = ScriptedEngine(TWO_STEP)
    engine.target_name, engine.draft_name = target, draft
    return engine


RESUMABLE = {  # (first run's settings changes, engine names) -> (the resume's): the records' content agrees
    "int vs float": ((dict(temperature=1), ("m", "d")), (dict(temperature=1.0), ("m", "d"))),
    "option as text": ((dict(policy_options={"passes": 2}), ("m", "d")), (dict(policy_options={"passes": "2"}), ("m", "d"))),
    "scheduling": ((dict(n_workers=2, verify_batch=1), ("m", "d")), (dict(n_workers=4, verify_batch="all"), ("m", "d"))),
    "model elsewhere": ((dict(), ("/env1/site-packages/m.gguf", "d")), (dict(), ("/env2/lib/m.gguf", "d"))),
    "draft unread by ar": ((dict(mode="ar"), ("m", "d")), (dict(mode="ar"), ("m", "none"))),
}


@pytest.mark.parametrize("case", list(RESUMABLE))
def test_a_resume_whose_records_would_agree_is_not_refused(tmp_path: Path, case):
    """Settings spelled another way (1 and 1.0; the CLI's "2" for an option's 2), how rows are
    scheduled, the same model file installed elsewhere, a draft the mode never runs: none of these
    changes what a record says, so none refuses a resume."""
    task = ToyTask()
    (first, first_names), (again, again_names) = RESUMABLE[case]

    def settings(changes):
        base = load_settings(None, base=task.config)
        search = {k: changes.pop(k) for k in list(changes) if k == "temperature"}
        return apply_overrides(dataclasses.replace(base, search=dataclasses.replace(base.search, **search)), **changes)

    solve_dataset(_named(*first_names), task, EXAMPLES[:1], settings=settings(dict(first)), output_dir=tmp_path)
    summary = solve_dataset(_named(*again_names), task, EXAMPLES, settings=settings(dict(again)),
                            output_dir=tmp_path, resume=True)
    assert summary["n"] == 3


def test_a_run_interrupted_before_its_summary_still_refuses_other_settings(tmp_path: Path):
    """run.json is written before the first record, so a run killed before summary.json exists is
    protected too; a directory from before run.json is checked against summary.json's settings."""
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, InterruptedOnSecond())
    assert not (tmp_path / "summary.json").exists() and (tmp_path / "run.json").is_file()
    task = ToyTask()
    dfs = dataclasses.replace(load_settings(None, base=task.config), algorithm="dfs")
    with pytest.raises(ResultsFileError, match="algorithm: 'bfs' there, 'dfs' now"):
        solve_dataset(ScriptedEngine(TWO_STEP), task, EXAMPLES, settings=dfs, output_dir=tmp_path, resume=True)
    run(tmp_path, resume=True)
    (tmp_path / "run.json").unlink()  # as a directory written before run.json existed
    with pytest.raises(ResultsFileError, match="summary.json"):
        solve_dataset(ScriptedEngine(TWO_STEP), task, EXAMPLES, settings=dfs, output_dir=tmp_path, resume=True)


def test_dfs_through_solve_dataset(tmp_path: Path):
    task = ToyTask()
    settings = dataclasses.replace(load_settings(None, base=task.config), algorithm="dfs")
    summary = solve_dataset(ScriptedEngine(TWO_STEP), task, EXAMPLES[:1], settings=settings,
                            output_dir=tmp_path, resume=False)
    assert summary["algorithm"] == "dfs" and summary["n"] == 1


def test_score_fields_are_kept_beside_the_record_fields(tmp_path: Path):
    class Detailed(ToyTask):
        def score(self, example: Example, prediction: str) -> dict[str, Any]:
            return {"correct": True, "answer": "extracted", "steps": "clash"}

    run(tmp_path, Detailed())
    record = read_lines(tmp_path)[0]
    assert record["answer"] == "extracted" and record["answer_completion"] == "b/b2"
    assert record["score_steps"] == "clash" and isinstance(record["steps"], list)



def test_a_resume_knows_problems_whose_data_holds_a_set_whatever_its_iteration_order(tmp_path: Path):
    """A record spelled a set as str(set), which follows the set's iteration order: hash order, which for
    strings differs between processes, so a custom task's set-valued data made every resume look like other
    problems. {0, 8} and {8, 0} are equal sets that iterate in different orders in any one process."""
    task = ToyTask()
    settings = load_settings(None, base=task.config)
    first, again = ({**EXAMPLES[0].data, "tags": tags} for tags in ({0, 8}, {8, 0}))
    assert str(first["tags"]) != str(again["tags"])
    solve_dataset(ScriptedEngine(TWO_STEP), task, [dataclasses.replace(EXAMPLES[0], data=first)], settings=settings,
                  output_dir=tmp_path)
    summary = solve_dataset(ScriptedEngine(TWO_STEP), task, [dataclasses.replace(EXAMPLES[0], data=again)] + EXAMPLES[1:],
                            settings=settings, output_dir=tmp_path, resume=True)
    assert summary["n"] == 3 and [r["id"] for r in read_lines(tmp_path)] == ["e1", "e2", "e3"]
    assert read_lines(tmp_path)[0]["input"]["tags"] == [0, 8]


def test_sets_are_spelled_in_one_order_numbers_by_value_and_sets_of_sets_too():
    """key=repr wrote {2, 10} as [10, 2], and ordered a set of frozensets by reprs that follow hash order."""
    from seed_tot.search.results_file import json_default

    assert json.dumps({10, 2}, default=json_default) == "[2, 10]"
    a, b = frozenset({0, 2}), frozenset({1, 4})  # {a, b} and {b, a} iterate in different orders
    first, again = {a}, {b}
    first.add(b)
    again.add(a)
    assert list(first) != list(again)
    assert json.dumps(first, default=json_default) == json.dumps(again, default=json_default) == "[[0, 2], [1, 4]]"


def test_a_run_that_spelled_a_set_as_text_before_still_resumes(tmp_path: Path, monkeypatch):
    """Records written before sets were spelled as lists hold str(set), stable for numbers; a resume of
    such a run was refused as other problems."""
    from seed_tot.search import solve as solve_module

    task = ToyTask()
    settings = load_settings(None, base=task.config)
    examples = [dataclasses.replace(EXAMPLES[0], data={**EXAMPLES[0].data, "tags": {0, 8}})] + EXAMPLES[1:]
    with monkeypatch.context() as patch:  # the records as that code wrote them
        patch.setattr(solve_module, "json_default", str)
        solve_dataset(ScriptedEngine(TWO_STEP), task, examples[:1], settings=settings, output_dir=tmp_path)
    assert read_lines(tmp_path)[0]["input"]["tags"] == "{0, 8}"
    summary = solve_dataset(ScriptedEngine(TWO_STEP), task, examples, settings=settings, output_dir=tmp_path, resume=True)
    assert summary["n"] == 3
