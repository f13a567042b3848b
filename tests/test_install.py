"""A normal (non-editable) install: the wheel holds seed_tot.tasks and the configs, no top-level
`tasks`, and the CLI works from another directory where a user's own tasks.py sits."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "setup.py", "README.md", "seed_tot", "tasks", "configs")


def _pip(*args: str, cwd: Path) -> None:
    # --no-deps/--no-build-isolation: no download; the running environment has setuptools and the deps
    subprocess.run([sys.executable, "-m", "pip", *args, "--no-deps", "--no-build-isolation", "-q",
                    "--disable-pip-version-check"], cwd=cwd, check=True, capture_output=True, text=True)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """site-packages-like directory holding seed-tot installed from a wheel of this checkout."""
    root = tmp_path_factory.mktemp("install")
    src = root / "src"  # a copy, so the build leaves nothing in the checkout
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    _pip("wheel", str(src), "-w", str(root / "dist"), cwd=root)
    wheel = next((root / "dist").glob("seed_tot-*.whl"))
    _pip("install", "--target", str(root / "site"), str(wheel), cwd=root)
    return root


def _run(installed: Path, *args: str) -> subprocess.CompletedProcess:
    cwd = installed / "elsewhere"
    cwd.mkdir(exist_ok=True)
    # A user's own tasks.py in the working directory must not shadow anything of ours.
    (cwd / "tasks.py").write_text("raise ImportError('the user tasks.py was imported')\n")
    env = {**os.environ, "PYTHONPATH": str(installed / "site")}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_wheel_installs_tasks_and_configs_under_seed_tot(installed: Path):
    names = zipfile.ZipFile(next((installed / "dist").glob("*.whl"))).namelist()
    assert "seed_tot/tasks/gsm8k.py" in names and "seed_tot/configs/gsm8k.yaml" in names
    assert not [n for n in names if n.startswith(("tasks/", "configs/"))]  # no top-level `tasks` package


def test_installed_cli_help_and_shipped_configs_from_another_directory(installed: Path):
    probe = _run(installed, "-c", "import seed_tot, seed_tot.tasks; from seed_tot.search import shipped_config; "
                                  "print(seed_tot.__file__); print(shipped_config('blocksworld')); "
                                  "from seed_tot.cli import main; main(['solve', '--help'])")
    assert probe.returncode == 0, probe.stderr
    module, config, *help_text = probe.stdout.split("\n")
    site = str(installed / "site")
    assert module.startswith(site) and config.startswith(site) and config.endswith("blocksworld.yaml")
    assert "Usage:" in help_text[0] and "--config" in "\n".join(help_text)


def test_installed_cli_solves_a_problem_from_another_directory(installed: Path, tiny_model_dirs):
    target, _ = tiny_model_dirs
    config = installed / "tiny.yaml"  # one thought level, one sample: seconds on a tiny model
    config.write_text("depth: 1\nn_generate: 1\nmax_new_tokens: 2\nmode: ar\n")
    out = installed / "elsewhere" / "run"
    run = _run(installed, "-m", "seed_tot.cli", "solve", "gsm8k", "--data", str(REPO / "tests/fixtures/gsm8k_small.jsonl"),
               "--limit", "1", "--target", target, "--config", str(config), "--max-new-tokens", "1",
               "--output", str(out))
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads((out / "summary.json").read_text())["n"] == 1
