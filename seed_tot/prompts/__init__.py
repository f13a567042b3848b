"""Prompt templates are data: one YAML file per task beside this module, str.format placeholders.

Keeping the wording out of the Python lets a user tune a prompt without touching task logic, and
the same file ships inside the wheel (see `package-data` in pyproject.toml).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

_DIR = Path(__file__).parent


def available() -> list[str]:
    """The names that `load_prompts` accepts (the YAML files shipped here)."""
    return sorted(p.stem for p in _DIR.glob("*.yaml"))


def load_prompts(name: str) -> dict[str, Any]:
    """The templates of task `name`, from `seed_tot/prompts/{name}.yaml`."""
    file = _DIR / f"{name}.yaml"
    if not file.is_file():
        raise ValueError(f"no prompt templates named {name!r} (looked for {file}); "
                       f"available: {', '.join(available()) or 'none'}")
    with file.open(encoding="utf-8") as fh:
        prompts = yaml.safe_load(fh)
    if not isinstance(prompts, dict):
        raise ValueError(f"{file}: expected a mapping of template names to strings")
    return prompts


def task_prompts(name: str, prompts: dict[str, Any] | None, required: tuple[str, ...]) -> dict[str, Any]:
    """A task's templates (`prompts`, or the shipped file when None), checked to hold `required`."""
    prompts = prompts if prompts is not None else load_prompts(name)
    missing = [k for k in required if k not in prompts]
    if missing:
        raise ValueError(f"{name} prompts lack template(s) {', '.join(missing)}")
    return prompts
