"""The command-line side of the search algorithms: `solve`'s algorithm options and `seed-tot compare`."""
from __future__ import annotations

import json
from typing import Callable

import click

from seed_tot.search.algorithms import ALGORITHMS
from seed_tot.search.mcts import ANSWER_CHOICES

__all__ = ["ALGORITHMS", "algorithm_options", "compare_command"]


def algorithm_options(command: Callable) -> Callable:
    """--samples (cot-sc), --iterations / --exploration / --parallel-leaves / --mcts-answer (mcts);
    each None when not given, so the config's value stands."""
    options = [
        click.option("--samples", type=click.IntRange(min=1), default=None,
                     help="cot-sc: chains sampled in one call and voted on (default: the config's, else 5)."),
        click.option("--iterations", type=click.IntRange(min=1), default=None,
                     help="mcts: select-expand-backpropagate rounds (default: the config's, else 10)."),
        click.option("--exploration", type=click.FloatRange(min=0), default=None,
                     help="mcts: UCT's exploration constant c (default: the config's, else 1.0)."),
        click.option("--parallel-leaves", type=click.IntRange(min=1), default=None,
                     help="mcts: leaves expanded per iteration under virtual loss, their rows sharing each "
                          "engine call (default: the config's, else 1)."),
        click.option("--mcts-answer", type=click.Choice(ANSWER_CHOICES), default=None,
                     help="mcts: answer from the path of most visits or of best mean value (default: visits)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


@click.command("compare")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="One JSON object per run instead of the table.")
def compare_command(run_dirs, as_json):
    """Accuracy (95% Wilson interval), new tokens per problem and problems per hour of each run.

    Give the output directories of runs of the same problems under different --algorithm and
    --mode settings: "accuracy at equal tokens" reads off one table."""
    from seed_tot.search.compare import format_table, run_row

    try:
        rows = [run_row(d) for d in run_dirs]
    except FileNotFoundError as err:
        raise click.UsageError(str(err)) from None
    if as_json:
        for row in rows:
            click.echo(json.dumps(row))
    else:
        click.echo(format_table(rows))
