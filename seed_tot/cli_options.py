"""Options shared by the `seed-tot` commands that load models."""
from __future__ import annotations

import click

from seed_tot.engine.params import DRAFTING_MODES, MODES

MODE_CHOICE = click.Choice(MODES)


def parse_k_config(ctx, param, value):
    if value is None:
        return None
    try:
        k = tuple(int(x) for x in str(value).replace(" ", "").strip("()").split(",") if x)
    except ValueError:
        raise click.BadParameter(f"expected comma-separated positive integers like 2,2,1, got {value!r}") from None
    if not k or any(c <= 0 for c in k):
        raise click.BadParameter(f"expected comma-separated positive integers like 2,2,1, got {value!r}")
    return k


def model_options(fn):
    """--target/--draft/... shared by every command that loads models."""
    for option in reversed([
        click.option("--target", default=None, help="Hub id, local dir or .gguf file (default: embedded SmolLM2-135M-Instruct)."),
        click.option("--draft", default=None, help="Hub id, local dir or .gguf file (default: the target's first --draft-layers layers)."),
        click.option("--draft-layers", default=4, show_default=True, help="Depth of the default layer-truncated draft."),
        click.option("--device", default="auto", show_default=True),
        click.option("--dtype", default=None, help="float32, bfloat16, float16 (default: bf16 on GPU, fp32 on CPU)."),
    ]):
        fn = option(fn)
    return fn


def load_engine(target, draft, draft_layers, device, dtype, modes=DRAFTING_MODES):
    """The engine for `modes`; the draft is loaded only when one of them drafts."""
    from seed_tot import Engine
    return Engine.from_pretrained(target=target, draft=draft, device=device, dtype=dtype, draft_layers=draft_layers,
                                  load_draft=any(m in DRAFTING_MODES for m in modes))


DEFAULT_PROMPT = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
                  "How many clips did Natalia sell altogether in April and May?")
