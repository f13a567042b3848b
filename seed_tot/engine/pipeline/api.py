"""The engine-facing entry point of the pipeline modes, behind `Engine.generate_pipelined` and
`seed-tot generate --mode pipedec|pp|stpp` (seed_tot/cli.py prints its results)."""
from __future__ import annotations

import logging
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
