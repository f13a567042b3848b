"""`seed-tot tasks`: the tasks `solve` takes by name, what each is, and the data it solves without --data."""
from __future__ import annotations

import importlib.metadata
import inspect

import click


def describe(task) -> tuple[str, str]:
    """(what the task is, its default data) in words: the first line of its module's docstring for a
    built-in (the class's for a user's task), and its `default_data` where it says."""
    doc = inspect.getdoc(inspect.getmodule(type(task))) if type(task).__module__.startswith("seed_tot.tasks") else None
    doc = doc or inspect.getdoc(type(task)) or ""
    what = doc.strip().splitlines()[0] if doc.strip() else "(no description)"
    data = getattr(task, "default_data", None) or "whatever its load(None) returns (it does not say)"
    return what, data


@click.command("tasks")
def tasks_command() -> None:
    """List the tasks `solve` and `score` take by name, and the data each uses without --data."""
    from seed_tot.tasks import ENTRY_POINT_GROUP, TASK_NAMES, get_task

    plugins = sorted(ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))
    for name in (*TASK_NAMES, *plugins):
        try:
            what, data = describe(get_task(name))
        except (ValueError, ImportError) as err:  # an installed plugin that does not load: say so, list the rest
            what, data = f"(does not load: {err})", "?"
        click.echo(f"{name}\n  {what}\n  default data: {data}")
    click.echo("Your own task: solve path/to/file.py:ClassName or package.module:ClassName (docs/custom_task.md).")
