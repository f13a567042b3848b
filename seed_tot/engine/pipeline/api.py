"""The engine-facing entry points: `Engine.generate_pipelined` and `seed-tot generate --mode pipedec|pp|stpp`."""
from __future__ import annotations

import logging

import click

from typing import TYPE_CHECKING

from ..params import SamplingParams

if TYPE_CHECKING:
    from .launcher import PipelineOutput

log = logging.getLogger(__name__)


def generate_pipelined(engine, prompts, params: SamplingParams | None = None, mode: str = "pipedec",
                       stages: int = 2, width: int = 4, children: int = 2, k_config=(2, 2, 1),
                       processes: bool = True, port: int | None = None, timeout_s: float = 600.0,
                       join: bool = False) -> list[PipelineOutput]:
    """Run `engine`'s target split in `stages` stages, its draft as stage 0.
    processes=True: N + 1 local processes (forked where safe, so they share the loaded weights
    copy-on-write); False: the single-process simulation; join=True: this process is one rank of a
    group started by torchrun."""
    from .launcher import ModelSource, PipelineConfig, join_group, launch, simulate  # torch: only when a pipeline runs

    params = params or SamplingParams()
    cfg = PipelineConfig(mode=mode, n_stages=stages, width=width, children=children, k_config=tuple(k_config))
    encoded = engine.encode(prompts)
    draft = engine.draft if mode != "pp" else None
    common = dict(eos_ids=tuple(engine.eos_ids), tokenizer=engine.tokenizer)
    if join:
        return join_group(ModelSource(engine.target, draft), encoded, params, cfg, engine.vocab_size,
                          timeout_s=timeout_s, **common)
    if not processes:
        return simulate(engine.target, draft, encoded, params, cfg, engine.vocab_size, **common)
    return launch(ModelSource(engine.target, draft), encoded, params, cfg, engine.vocab_size,
                  engine.target.config.num_hidden_layers, port=port, timeout_s=timeout_s, **common)


def pipeline_options(fn):
    """The `generate` options that only the pipeline modes read."""
    for option in reversed([
        click.option("--stages", type=click.IntRange(min=1), default=2, show_default=True,
                     help="pipedec/pp/stpp: target pipeline stages (one process each, plus one for the draft)."),
        click.option("--width", type=click.IntRange(min=1), default=4, show_default=True,
                     help="pipedec: prediction-tree nodes per layer."),
        click.option("--children", type=click.IntRange(min=1), default=2, show_default=True,
                     help="pipedec: children per node considered for the next layer."),
        click.option("--port", type=int, default=None, help="pipedec/pp/stpp: rendezvous port (default: a free one)."),
        click.option("--pipeline-timeout", type=float, default=600.0, show_default=True,
                     help="pipedec/pp/stpp: seconds before a stuck pipeline is stopped."),
        click.option("--join", is_flag=True, help="pipedec/pp/stpp: be one rank of a torchrun group instead of launching."),
        click.option("--simulate", is_flag=True, help="pipedec/pp/stpp: run every stage in this process (lockstep)."),
    ]):
        fn = option(fn)
    return fn


def echo_pipeline(outputs: list[PipelineOutput], mode: str, as_json: bool, stages: int) -> None:
    import json

    for i, out in enumerate(outputs):
        r = out.result
        if as_json:
            click.echo(json.dumps({"index": i, "text": r.text, "token_ids": r.token_ids, "finish_reason": r.finish_reason,
                                   "pipeline": out.stats.to_dict()}))
        else:
            click.echo(f"--- {i} ({r.finish_reason}, {len(r.token_ids)} tokens)\n{r.text}")
            s = out.stats
            click.echo(f"--- mode={mode} stages={stages} ticks {s.ticks}  tokens {s.tokens}  "
                       f"ticks/token {s.ticks_per_token:.2f}  hit rate {s.hit_rate:.3f}  "
                       f"forwards per rank {s.stage_forwards}")


def run_cli(engine, prompts, params: SamplingParams, mode: str, k_config, as_json: bool, options: dict) -> None:
    """`seed-tot generate --mode pipedec|pp|stpp`: run and print."""
    outputs = generate_pipelined(engine, prompts, params, mode, stages=options["stages"], width=options["width"],
                                 children=options["children"], k_config=k_config, processes=not options["simulate"],
                                 port=options["port"], timeout_s=options["pipeline_timeout"], join=options["join"])
    echo_pipeline(outputs, mode, as_json, options["stages"])
