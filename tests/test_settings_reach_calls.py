"""The run's settings (configs/, --config, flags) reach every engine call of every task."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from seed_tot.engine.params import GenerationResult, GenerationStats
from seed_tot.search import ConfigError, apply_overrides, load_settings, shipped_config, solve_dataset
from seed_tot.tasks import get_task

FIXTURES = Path(__file__).parent / "fixtures"
DATA = {"gsm8k": FIXTURES / "gsm8k_small.jsonl", "creative_writing": FIXTURES / "creative_writing_small.txt",
        "blocksworld": FIXTURES / "blocksworld_small.jsonl"}
SEP = "\x00"  # between the user message and the assistant prefix in a rendered prompt


class BudgetEngine:
    """Records the token budget of every call. Blocksworld thoughts get the next gold action
    (so plans stay legal and the model is asked for values); everything else a fixed reply."""

    def __init__(self, gold_plan: list[str] | None = None):
        self.gold_plan = gold_plan or []
        self.budgets: list[int] = []
        self.specs: list = []

    def render_prompt(self, user: str, assistant_prefix: str = "") -> str:
        return f"{user}{SEP}{assistant_prefix}"

    def _reply(self, prompt: str) -> str:
        prefix = prompt.split(SEP, 1)[1]
        if prefix.startswith("[PLAN]"):
            done = len([line for line in prefix.splitlines()[1:] if line.strip()])
            if done < len(self.gold_plan):
                return self.gold_plan[done]
        return "good. The coherency score is 7. The answer is 7."

    def generate(self, prompts, params, *, spec):
        self.budgets.append(params.max_new_tokens)
        self.specs.append(spec)
        return [GenerationResult(token_ids=[1], text=self._reply(p), stats=GenerationStats(new_tokens=1, wall_s=0.01),
                                 finish_reason="length") for p in prompts]


def _solve(name: str, tmp_path: Path, settings) -> tuple[BudgetEngine, dict]:
    task = get_task(name)
    examples = task.load(str(DATA[name]), limit=1)
    engine = BudgetEngine(examples[0].data.get("gold_plan"))
    summary = solve_dataset(engine, task, examples, settings=settings, output_dir=tmp_path / name)
    return engine, summary


@pytest.mark.parametrize("name", sorted(DATA))
def test_small_max_new_tokens_caps_every_thought_value_and_answer_call(name: str, tmp_path: Path):
    task = get_task(name)
    settings = apply_overrides(load_settings(shipped_config(name), base=task.config), max_new_tokens=1)
    engine, summary = _solve(name, tmp_path, settings)
    assert engine.budgets and max(engine.budgets) == 1
    applied = summary["max_new_tokens_applied"]
    assert {"thought", "value", "answer"} <= set(applied) and set(applied.values()) == {1}
    written = json.loads((tmp_path / name / "summary.json").read_text())
    assert written["max_new_tokens_applied"] == applied and written["settings"]["search"]["max_new_tokens"] == 1


def test_config_file_value_budget_reaches_the_value_calls(tmp_path: Path):
    config = tmp_path / "gsm8k.yaml"
    config.write_text("max_new_tokens: 64\nextra: {value_max_new_tokens: 1}\n")
    task = get_task("gsm8k")
    _, summary = _solve("gsm8k", tmp_path, load_settings(config, base=task.config))
    assert summary["max_new_tokens_applied"]["value"] == 1
    assert summary["max_new_tokens_applied"]["thought"] == 64


def test_blocksworld_depth_from_the_config_ends_the_plan_and_sizes_the_answer(tmp_path: Path):
    config = tmp_path / "bw.yaml"
    config.write_text("depth: 2\nextra: {action_max_new_tokens: 5}\n")
    task = get_task("blocksworld")
    engine, summary = _solve("blocksworld", tmp_path, load_settings(config, base=task.config))
    record = json.loads((tmp_path / "blocksworld" / "results.jsonl").read_text().splitlines()[0])
    assert len(record["steps"]) == 2  # two thought levels, then the answer
    assert len(record["prediction"].splitlines()) == 2  # is_final at the run's depth: nothing added
    assert engine.budgets[-1] == 1  # the finished plan's answer call
    assert summary["max_new_tokens_applied"]["thought"] == 5


def test_extra_key_the_task_does_not_read_is_refused(tmp_path: Path):
    config = tmp_path / "typo.yaml"
    config.write_text("extra: {value_max_new_token: 1}\n")
    with pytest.raises(ConfigError, match=r"typo.yaml.*value_max_new_token.*value_max_new_tokens"):
        load_settings(config, base=get_task("gsm8k").config)


def test_config_written_for_another_task_is_refused(tmp_path: Path):
    with pytest.raises(ConfigError, match=r"gsm8k.yaml:\d+: written for task 'gsm8k', not 'blocksworld'"):
        load_settings(shipped_config("gsm8k"), base=get_task("blocksworld").config, task_name="blocksworld")


def test_a_config_names_the_draft_policy_batches_and_options_every_call_uses(tmp_path: Path):
    config = tmp_path / "gsm8k.yaml"
    config.write_text("mode: seed\ndraft_policy: opt-tree\npolicy_options: {n: 8, delta: 0.2}\n"
                      "draft_batch: all\nverify_batch: 3\n")
    task = get_task("gsm8k")
    engine, summary = _solve("gsm8k", tmp_path, load_settings(config, base=task.config))
    assert engine.specs and all((s.draft_batch, s.verify_batch, s.draft_policy, s.options) ==
                                ("all", 3, "opt-tree", {"n": 8, "delta": 0.2}) for s in engine.specs)
    assert summary["settings"]["draft_policy"] == "opt-tree" and summary["settings"]["verify_batch"] == 3
    bad = tmp_path / "bad.yaml"
    bad.write_text("draft_policy: beam\n")
    with pytest.raises(ConfigError, match=r"bad.yaml.*draft_policy.*expected one of fixed, opt-tree"):
        load_settings(bad, base=task.config)
