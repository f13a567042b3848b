"""`seed-tot serve`: the engine flags of `generate`, then an OpenAI-compatible server on --host:--port."""
from __future__ import annotations

import logging

import click

from seed_tot.cli_engine import engine_options
from seed_tot.engine.engine_settings import describe as describe_engine
from seed_tot.cli_options import (MODE_CHOICE, check_policy_setting, decode_setting, load_engine, model_options,
                                  parse_k_config, policy_kwargs, policy_options)

log = logging.getLogger(__name__)


@click.command("serve")
@model_options
@engine_options
@click.option("--mode", type=MODE_CHOICE, default=None,
              help="Decoding mode of every request that names none (default: seed where the engine can draft, "
                   "else parallel). A request may name its own (`mode` in the body).")
@click.option("--k-config", callback=parse_k_config, default=None, help="sd/mcsd/seed: draft tree shape, e.g. 1,1,1.")
@click.option("--n-workers", type=int, callback=decode_setting("n_workers"), default=None,
              help="SEED draft workers per request running at once (default: all its rows).")
@click.option("--verify-batch", callback=decode_setting("verify_batch"), default="auto", show_default=True,
              help="SEED: queued drafts verified per target forward (a number, 'all' or 'auto').")
@click.option("--draft-batch", callback=decode_setting("draft_batch"), default="auto", show_default=True,
              help="SEED: ready draft workers drafted per draft forward (a number, 'all' or 'auto').")
@policy_options
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True, help="Port to listen on.")
@click.option("--served-model-name", default=None,
              help="The model name requests give (default: --target as given, else the embedded model's Hub id).")
@click.option("--max-running", type=click.IntRange(min=1), default=64, show_default=True,
              help="Requests in the engine at once; more wait in the queue.")
@click.option("--max-waiting", type=click.IntRange(min=0), default=256, show_default=True,
              help="Requests queued behind --max-running; past that a request gets 429 with Retry-After.")
def serve_command(target, draft, draft_layers, device, dtype, mode, k_config, n_workers, verify_batch, draft_batch,
                  draft_policy, policy_option, head_dir, host, port, served_model_name, max_running, max_waiting,
                  attention, compile_forwards):
    """Serve the engine over OpenAI's HTTP API: /v1/completions, /v1/chat/completions, /v1/models,
    /health and /metrics (needs the `serve` extra: pip install "seed-tot[serve]").

    Every request's rows, and the n choices of each, share the engine's batched forwards."""
    try:
        import uvicorn

        from .app import Server, build_app
        from .runner import EngineRunner
    except ImportError as err:
        raise click.ClickException(f"seed-tot serve needs FastAPI and uvicorn ({err}): "
                                   f"pip install \"seed-tot[serve]\"") from None
    from seed_tot.engine.decode_spec import DRAFTING_MODES, DecodeSpec
    from seed_tot.engine.models import DEFAULT_TARGET_HUB_ID

    spec = DecodeSpec(mode=mode or "seed", k_config=k_config or (1, 1, 1), n_workers=n_workers,
                      verify_batch=verify_batch, draft_batch=draft_batch,
                      **policy_kwargs(draft_policy, policy_option, head_dir))
    check_policy_setting(spec, "--policy-option")
    engine = load_engine(target, draft, draft_layers, device, dtype, modes=[mode] if mode else DRAFTING_MODES,
                         attention=attention, compile_forwards=compile_forwards)
    if mode is None:
        spec = spec.replace(mode=engine.default_mode)
    name = served_model_name or target or DEFAULT_TARGET_HUB_ID  # the embedded model by its Hub id, not its file
    server = Server(EngineRunner(engine, spec, max_running, max_waiting), name)
    click.echo(f"seed-tot serve: {name} (mode {spec.mode}, draft {engine.draft_name}, "
               f"{describe_engine(attention, compile_forwards)}) on http://{host}:{port}/v1", err=True)
    uvicorn.run(build_app(server), host=host, port=port, log_level="warning", timeout_graceful_shutdown=5)
