"""Users' own tasks from the command line: FILE.py:Class, module:Class and entry-point plugins."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from seed_tot.cli import main
from seed_tot.search import ConfigError, load_settings
from seed_tot.tasks import get_task

GAME24 = Path(__file__).resolve().parents[1] / "examples" / "game24.py"


def _config(tmp_path: Path, extra: str = "") -> Path:
    config = tmp_path / "game24.yaml"
    config.write_text("task: game24\ndepth: 1\nn_generate: 1\nbreadth: 1\nmax_new_tokens: 3\nmode: ar\n"
                      "extra: {thought_max_new_tokens: 2, answer_max_new_tokens: 2" + extra + "}\n")
    return config


def test_solve_runs_a_task_class_from_a_python_file_with_its_config(tmp_path: Path, tiny_model_dirs):
    target, _ = tiny_model_dirs
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["solve", f"{GAME24}:Game24", "--config", str(_config(tmp_path)),
                                       "--target", target, "--limit", "1", "--temperature", "0",
                                       "--output", str(out)])
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(records) == 1 and len(records[0]["steps"]) == 1  # the config's depth 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["task"] == "game24" and summary["settings"]["search"]["depth"] == 1
    assert summary["max_new_tokens_applied"]["thought"] == 2  # the config's extra reached the task
    assert max(summary["max_new_tokens_applied"].values()) <= 3


def test_config_extra_key_unknown_to_a_custom_task_is_refused(tmp_path: Path):
    task = get_task(f"{GAME24}:Game24")
    with pytest.raises(ConfigError, match="'nope'"):
        load_settings(_config(tmp_path, ", nope: 1"), base=task.config, task_name=task.name)


def test_entry_point_plugin_is_found_by_name(tmp_path: Path, monkeypatch):
    pkg = tmp_path / "toy_plugin_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent(f"""
        import importlib.util
        spec = importlib.util.spec_from_file_location("toy_plugin_game24", {str(GAME24)!r})
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)

        class Puzzles(module.Game24):
            name = "puzzles"
    """))
    dist = tmp_path / "toy_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[seed_tot.tasks]\npuzzles = toy_plugin_pkg:Puzzles\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    task = get_task("puzzles")
    assert task.name == "puzzles" and len(task.load(limit=2)) == 2
    assert get_task("toy_plugin_pkg:Puzzles").name == "puzzles"  # module:Class form


@pytest.mark.parametrize("spec,words", [("missing_dir/nothing.py:Task", "nothing.py: no such file"),
                                        (f"{GAME24}:Nope", "defines no 'Nope'"),
                                        ("no_such_module_x:Task", "no module named 'no_such_module_x'"),
                                        (f"{GAME24}:PUZZLES", "is not a class"),
                                        ("json:JSONDecoder", "not a seed_tot Task, it lacks name"),
                                        ("game25", "unknown task 'game25'")])
def test_a_bad_task_spec_is_a_one_line_error(tmp_path: Path, spec: str, words: str):
    result = CliRunner().invoke(main, ["solve", spec, "--output", str(tmp_path / "o")])
    assert result.exit_code == 2 and words in result.output, result.output


@pytest.mark.parametrize("source,words", [
    ("class Task:\n    def load(self)\n        return []\n", ["bad_task.py:2: not valid Python", "expected ':'"]),
    ("import os\nimport no_such_module_for_a_task\n", ["bad_task.py:2:", "No module named 'no_such_module_for_a_task'"]),
    ("class Task:\n    def __init__(self, data_dir):\n        pass\n",
     ["bad_task.py:Task", "is called without arguments", "data_dir"]),
])
def test_a_task_file_that_cannot_be_imported_or_built_names_the_file_and_line(tmp_path: Path, source: str,
                                                                                words: list[str]):
    # these were tracebacks (SyntaxError, ModuleNotFoundError, TypeError) rather than one usage error
    task_file = tmp_path / "bad_task.py"
    task_file.write_text(source)
    result = CliRunner().invoke(main, ["solve", f"{task_file}:Task", "--output", str(tmp_path / "o")])
    assert result.exit_code == 2, (result.output, result.exception)
    for word in words:
        assert word in result.output, result.output


@pytest.mark.parametrize("body,words", [
    ("    def load(self, path=None, limit=None, offset=0):\n        return [{'numbers': '4 4 6 8'}]\n",
     ["load returned a dict", "Example(id=str, data=dict)"]),
    ("    def load(self, path=None, limit=None, offset=0):\n        return [Example(1, {'numbers': '4 4 6 8'})]\n",
     ["load returned an Example with id 1 (int)", "a string"]),
    ("    def load(self, path=None, limit=None, offset=0):\n        return None\n", ["load returned None"]),
    ("    def __init__(self):\n        self.config = {'depth': 1}\n", ["config is a dict", "SearchConfig"]),
])
def test_a_task_whose_load_or_config_has_the_wrong_type_is_refused_before_any_model_loads(
        tmp_path: Path, body: str, words: list[str]):
    # these failed as AttributeError ('dict' object has no attribute 'id' / 'extra', 'int' object
    # has no attribute 'encode') after the models had loaded, or as "no problems to solve"
    task_file = tmp_path / "my_task.py"
    task_file.write_text(f"import sys\nsys.path.insert(0, {str(GAME24.parent)!r})\nfrom game24 import Game24\n"
                         f"from seed_tot.search.protocol import Example\n\nclass Task(Game24):\n{body}")
    result = CliRunner().invoke(main, ["solve", f"{task_file}:Task", "--target", str(tmp_path / "no-model"),
                                       "--output", str(tmp_path / "o")])
    assert result.exit_code == 2, (result.output, result.exception)
    assert "my_task.py" in result.output and "no-model" not in result.output, result.output
    for word in words:
        assert word in result.output, result.output


def test_a_task_method_returning_the_wrong_type_mid_run_is_one_line_naming_its_file(tmp_path: Path, tiny_model_dirs):
    # was a traceback through solve.py and expansion.py whose last line named the task, not the file
    target, _ = tiny_model_dirs
    task_file = tmp_path / "my_task.py"
    task_file.write_text(f"import sys\nsys.path.insert(0, {str(GAME24.parent)!r})\nfrom game24 import Game24\n\n"
                         f"class Task(Game24):\n    def score(self, example, prediction):\n        return True\n")
    result = CliRunner().invoke(main, ["solve", f"{task_file}:Task", "--config", str(_config(tmp_path)),
                                       "--target", target, "--limit", "1", "--output", str(tmp_path / "o")])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.exception
    assert f"Error: {task_file}:6: task 'game24': score returned True; it must return a dict" in result.output


def test_is_final_must_answer_true_or_false():
    # a string "no" was taken as True and ended the search
    from seed_tot.search.expansion import TaskMethodError, task_is_final
    from seed_tot.search.protocol import Example, State
    from short_task import ShortTask

    class Says(ShortTask):
        def is_final(self, example, state):
            return "no"

    task = Says()
    with pytest.raises(TaskMethodError, match=r"test_custom_task_cli.py:\d+: task .*is_final returned 'no'; it must return True or False"):
        task_is_final(task, Example("0", {}), State())
    assert task_is_final(ShortTask(), Example("0", {}), State()) is False
