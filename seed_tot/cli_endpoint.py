"""`seed-tot solve --api-base URL`: the solve options and checks of a run whose calls go to an
OpenAI-compatible server (seed_tot.search.endpoint) instead of an engine in this process."""
from __future__ import annotations

import click

from seed_tot.cli_options import given_options

# solve's options that load or trace an engine here: with --api-base the server holds the models
_LOCAL_ENGINE_OPTIONS = ("target", "draft", "draft_layers", "device", "dtype", "head_dir", "trace_dir", "ray_address",
                         "workers", "gpus_per_worker", "cpus_per_worker", "search_timeout", "attention",
                         "compile_forwards")
# solve's decoding options -> the DecodeSpec field each sets, sent with every request when given
_DECODING_OPTIONS = {"mode": "mode", "k_config": "k_config", "n_workers": "n_workers", "verify_batch": "verify_batch",
                     "draft_batch": "draft_batch", "draft_policy": "draft_policy", "policy_option": "policy_options"}


def endpoint_options(fn):
    """--api-base and its companions, for solve."""
    for option in reversed([
        click.option("--api-base", default=None, metavar="URL",
                     help="Run the search's calls on this OpenAI-compatible server (seed-tot serve, vLLM, llama.cpp, "
                          "...), e.g. http://127.0.0.1:8000/v1, instead of loading models here (docs/api_base.md)."),
        click.option("--api-model", default=None, metavar="NAME",
                     help="With --api-base: the model the requests name [default: the one the server lists]."),
        click.option("--api-key-env", default="OPENAI_API_KEY", show_default=True, metavar="VAR",
                     help="With --api-base: the environment variable holding the API key (unset: no key)."),
        click.option("--api-prompt", type=click.Choice(["chat", "text"]), default="chat", show_default=True,
                     help="With --api-base: chat sends messages to /v1/chat/completions (the server applies the "
                          "model's chat template, as solve does in process); text sends the prompt as written to "
                          "/v1/completions (for a model without a chat template)."),
    ]):
        fn = option(fn)
    return fn


def check_endpoint_options(ctx: click.Context, api: dict) -> tuple[str, ...] | None:
    """Usage errors for options that do not combine with --api-base (or need it); the decoding
    settings given on the command line, which the requests carry (None: none given)."""
    given = given_options(ctx)
    flags = {p.name: max(p.opts, key=len) for p in ctx.command.params}
    if api["api_base"] is None:
        stray = [flags[name] for name in ("api_model", "api_key_env", "api_prompt") if name in given]
        if stray:
            raise click.UsageError(f"{', '.join(stray)} only apply with --api-base")
        return None
    local = [flags[name] for name in _LOCAL_ENGINE_OPTIONS if name in given]
    if local:
        raise click.UsageError(f"--api-base runs the calls on the server, which holds the models: {', '.join(local)} "
                               f"do not apply (start the server with the models and devices you want)")
    decoding = tuple(field for name, field in _DECODING_OPTIONS.items() if name in given)
    return decoding or None


def solve_on_endpoint(api: dict, decoding: tuple[str, ...] | None, task, examples, settings, output, resume,
                      concurrency, data=None):
    """Solve with every call sent to the endpoint; its summary."""
    from seed_tot.search import solve_dataset
    from seed_tot.search.endpoint import EndpointConfig, EndpointEngine, EndpointError

    config = EndpointConfig(base_url=api["api_base"], model=api["api_model"], api_key_env=api["api_key_env"],
                            prompt_format=api["api_prompt"], decoding=decoding)
    try:
        engine = EndpointEngine(config)  # reaches the server (and checks the model) before anything is written
    except EndpointError as err:
        raise click.ClickException(str(err)) from None
    with engine:
        try:
            return solve_dataset(engine, task, examples, settings=settings, output_dir=output, resume=resume,
                                 concurrency=concurrency, data=data)
        except EndpointError as err:
            raise click.ClickException(f"{err} (the problems finished before it are in {output}/results.jsonl; "
                                       f"--resume continues)") from None
