"""`seed-tot view RUN_DIR [RUN_DIR ...] --output PAGE.html`, and the page `solve --view` writes."""
from __future__ import annotations

import logging
from pathlib import Path

import click

log = logging.getLogger(__name__)


@click.command("view")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("--output", "-o", type=click.Path(dir_okay=False), required=True, help="The HTML page to write.")
@click.option("--label", "labels", multiple=True,
              help="A name per run, in order (repeatable; default: the directories' names).")
@click.option("--task", "task_spec", default=None,
              help="The task whose show_state draws the states (default: the task the run's summary names; "
                   "give path/to/file.py:ClassName for a custom task).")
def view_command(run_dirs, output, labels, task_spec):
    """Write one offline HTML page of each problem's thought tree and the engine's work per node.

    Several RUN_DIRs of the same data (e.g. an `ar` and a `seed` run) are drawn side by side, their
    trees aligned per problem and differences marked. The page needs no server or network: open it
    from disk."""
    from seed_tot.view.page import write_page

    if labels and len(labels) != len(run_dirs):
        raise click.UsageError(f"--label given {len(labels)} times for {len(run_dirs)} run directories")
    task = None
    if task_spec is not None:
        from seed_tot.tasks import get_task

        try:
            task = get_task(task_spec)
        except ValueError as err:
            raise click.UsageError(str(err)) from None
    path = write_page(run_dirs, output, labels=labels or None, task=task)
    click.echo(f"wrote {path}")


def write_run_page(output_dir: str | Path, task=None) -> Path:
    """solve --view: OUTPUT/tree.html from the run just finished (all of results.jsonl, resumed part included)."""
    from seed_tot.view.page import PAGE_FILE, write_page

    path = write_page([output_dir], Path(output_dir) / PAGE_FILE, task=task)
    click.echo(f"tree page written to {path}", err=True)
    return path
