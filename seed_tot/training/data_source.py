"""What every training command checks about its --data file before reading it."""
from __future__ import annotations

from pathlib import Path

import click


def refuse_test_split(data_file: str, what: str) -> None:
    """A file named like a test split is refused: a drafter, head or vocabulary fitted to the questions the
    project measures on would inflate every measurement taken with it. `what`: what the command makes."""
    if "test" in Path(data_file).stem.lower():
        raise click.BadParameter(f"{data_file} looks like a test split; {what} from training data "
                                 f"(e.g. gsm8k/train.jsonl)", param_hint="--data")
