"""Write the page: static/page.html with its CSS, script and the runs' JSON pasted in.

One file that needs nothing else: the browser opens it from disk, and its Content-Security-Policy
forbids every request, so a page that tried to load anything would fail loudly in the tests.
"""
from __future__ import annotations

import html
import json
import logging
import re
from importlib import resources
from pathlib import Path
from typing import Any, Sequence

from seed_tot.search.protocol import Task

from .page_data import StateShower, build_page_data, load_run

log = logging.getLogger(__name__)

PAGE_FILE = "tree.html"  # what `seed-tot solve --view` writes into the run directory


def _static(name: str) -> str:
    return resources.files("seed_tot.view").joinpath("static", name).read_text(encoding="utf-8")


def embed_json(data: Any) -> str:
    """JSON that cannot end its <script> element: every "<" is written as its \\u escape."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), default=str, allow_nan=False)
    return text.replace("<", "\\u003c")


def render_page(data: dict[str, Any], title: str) -> str:
    # one pass over the template, so no placeholder text inside what is put in is ever replaced: a
    # run directory named "__DATA__" put the whole JSON in the title, one named "__SCRIPT__" the script
    parts = {"__TITLE__": html.escape(title), "__STYLE__": _static("page.css"), "__SCRIPT__": _static("page.js"),
             "__DATA__": embed_json(data)}
    return re.sub("|".join(parts), lambda match: parts[match.group(0)], _static("page.html"))


def _clean_numbers(value: Any) -> Any:
    """NaN and infinities are not JSON: the page shows them as missing."""
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    if isinstance(value, dict):
        return {k: _clean_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean_numbers(v) for v in value]
    return value


def state_shower(task: Task | None, task_name: str | None) -> StateShower | None:
    """The task's `show_state(example, state)`, if it has one; for a run of a built-in or registered
    task the task is found by the name its summary records."""
    if task is None and task_name:
        from seed_tot.tasks import get_task

        try:
            task = get_task(task_name)
        except (ValueError, ImportError) as err:
            log.info("task %s not loadable here (%s): states shown as plain text", task_name, err)
            return None
    return getattr(task, "show_state", None)


def write_page(run_dirs: Sequence[str | Path], output: str | Path, *, labels: Sequence[str] | None = None,
               task: Task | None = None) -> Path:
    """Read the run directories and write one self-contained HTML page to `output`."""
    if not run_dirs:
        raise ValueError("give at least one run directory")
    names = list(labels) if labels else _labels([Path(d) for d in run_dirs])
    runs = [load_run(d, label) for d, label in zip(run_dirs, names)]
    task_name = next((r.summary.get("task") for r in runs if r.summary and r.summary.get("task")), None)
    data = _clean_numbers(build_page_data(runs, state_shower(task, task_name)))
    title = "seed-tot: " + " vs ".join(names)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(render_page(data, title), encoding="utf-8")
    log.info("wrote %s: %d problems from %d run(s)", output, len(data["problems"]), len(runs))
    return output


def _labels(dirs: list[Path]) -> list[str]:
    """Each run's directory name; with its parent's where two runs share a name."""
    names = [d.resolve().name or str(d) for d in dirs]
    if len(set(names)) == len(names):
        return names
    return [f"{d.resolve().parent.name}/{d.resolve().name}" if names.count(n) > 1 else n for d, n in zip(dirs, names)]
