"""docs/custom_task.md runs as pasted: its Python route, its `seed-tot` commands and the settings
file it shows (shipped as examples/game24.yaml), on tiny models or a scripted engine."""
from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from scripted_engine import ScriptedEngine

from seed_tot.cli import main
from seed_tot.engine import Engine
from seed_tot.tasks import get_task

ROOT = Path(__file__).resolve().parents[1]
GUIDE = (ROOT / "docs" / "custom_task.md").read_text(encoding="utf-8")


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", GUIDE, flags=re.DOTALL)


@pytest.fixture
def in_a_checkout(tmp_path, monkeypatch):
    """A scratch directory laid out like the repository root, where the guide's commands run."""
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_settings_file_the_guide_shows_is_the_one_it_ships():
    shown = [block for block in _blocks("yaml") if block.startswith("# game24.yaml")]
    assert shown == [(ROOT / "examples" / "game24.yaml").read_text(encoding="utf-8")]


def test_the_guides_python_route_runs_as_pasted(in_a_checkout, monkeypatch):
    runnable = [block for block in _blocks("python") if "solve_dataset(" in block and block.startswith("from ")]
    assert len(runnable) == 1
    # any reply will do: the point is that the pasted code imports, loads and solves
    monkeypatch.setattr(Engine, "from_pretrained", staticmethod(lambda *a, **k: ScriptedEngine(
        lambda user, copy: "likely")))
    namespace: dict = {}
    exec(compile(runnable[0], "docs/custom_task.md", "exec"), namespace)
    assert namespace["summary"]["n"] == 3 and namespace["task"].name == "game24"
    assert len((in_a_checkout / "runs" / "game24" / "results.jsonl").read_text().splitlines()) == 3


def test_the_guides_commands_run_as_pasted(in_a_checkout, tiny_model_dirs):
    target, draft = tiny_model_dirs
    commands = [shlex.split(line, comments=True) for block in _blocks("bash") for line in block.splitlines()
                if line.startswith("seed-tot ")]
    # mypackage.game24 names the reader's own installed module; the guide says so
    runnable = [argv[1:] for argv in commands if not any(a.startswith("mypackage.") for a in argv)]
    assert [argv[0] for argv in runnable] == ["solve", "score"]
    tiny = ["--target", target, "--draft", draft, "--max-new-tokens", "2", "--temperature", "0"]
    for argv in runnable:
        result = CliRunner().invoke(main, argv + tiny if argv[0] == "solve" else argv)
        assert result.exit_code == 0, result.output
    assert len((in_a_checkout / "runs" / "game24-cli" / "results.jsonl").read_text().splitlines()) == 3
    summary = json.loads((in_a_checkout / "runs" / "game24-cli" / "summary.json").read_text())
    assert summary["task"] == "game24" and summary["settings"]["search"]["breadth"] == 5  # the shipped YAML's


def test_no_puzzle_is_a_worked_example_in_its_own_prompts():
    task = get_task(f"{ROOT}/examples/game24.py:Game24")
    prompts = [getattr(sys.modules[type(task).__module__], name) for name in ("THOUGHT_PROMPT", "VALUE_PROMPT", "ANSWER_PROMPT")]
    for example in task.load():
        puzzle = example.data["puzzle"]
        assert not any(re.search(rf"\b{puzzle}\b", p.replace("{numbers}", "")) for p in prompts), puzzle


def test_the_guides_pytest_command_prints_its_pass_count():
    """pyproject's addopts already hold -q: a documented `-q` on top (-q -q) silences the "N passed"
    line a reader looks for."""
    import shlex
    import tomllib

    addopts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"]
    commands = [line for block in _blocks("bash") for line in block.splitlines() if "-m pytest" in line]
    assert commands
    for command in commands:
        quiet = sum(arg.count("q") for arg in shlex.split(addopts) + shlex.split(command)
                    if arg == "--quiet" or (arg.startswith("-") and not arg.startswith("--") and set(arg[1:]) <= {"q"}))
        assert quiet <= 1, command
