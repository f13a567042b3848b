"""--attention and --compile: how the engine runs its batched forwards, one place for every command
that loads models (generate, solve, bench, serve); the YAML keys of the same names are
search/config.py's (engine/engine_settings.py holds the words both accept)."""
from __future__ import annotations

import click

from seed_tot.engine.engine_settings import ATTENTION_PATHS, COMPILE_WORDS, DEFAULT_ATTENTION, DEFAULT_COMPILE


def engine_options(fn=None, *, default: bool = True):
    """--attention/--compile on a command. default=False: not given is None (solve: the config's)."""
    def later(setting: str) -> str:
        return "" if default else f" [default: the config's, else {setting}]"

    def add(fn):
        for option in reversed([
            click.option("--attention", type=click.Choice(ATTENTION_PATHS),
                         default=DEFAULT_ATTENTION if default else None, show_default=default,
                         help="How batched forwards read the KV pool: gather copies each row's history out, "
                              "pool reads the pool in place with FlexAttention (docs/engine.md)"
                              + later(DEFAULT_ATTENTION) + "."),
            click.option("--compile", "compile_forwards", type=click.Choice(tuple(COMPILE_WORDS)),
                         default=DEFAULT_COMPILE if default else None, show_default=default,
                         help="Compile the fixed-shape forwards with torch.compile (inductor), one compile per "
                              "bucket: auto = on CUDA (docs/engine.md)" + later(DEFAULT_COMPILE) + "."),
        ]):
            fn = option(fn)
        return fn
    return add(fn) if fn is not None else add


def refuse_engine_options(attention: str | None, compile_forwards: str | None, where: str) -> None:
    """A command whose forwards this process's engine does not run (`where` says whose they are)
    refuses --attention/--compile set away from their defaults, rather than ignore them."""
    given = [f"--{name} {value}" for name, value, default in (("attention", attention, DEFAULT_ATTENTION),
                                                               ("compile", compile_forwards, DEFAULT_COMPILE))
             if value is not None and value != default]
    if given:
        raise click.UsageError(f"{' and '.join(given)}: {where}, so the option would change nothing here")
