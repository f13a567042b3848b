"""The `seed-tot` command line: generate, solve, score (and bench, see seed_tot.bench)."""
from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

import click

from seed_tot.cli_endpoint import check_endpoint_options, endpoint_options, solve_on_endpoint
from seed_tot.cli_algorithms import ALGORITHMS, algorithm_options, compare_command
from seed_tot.cli_engine import engine_options, refuse_engine_options
from seed_tot.engine.engine_settings import DEFAULT_ATTENTION, DEFAULT_COMPILE, compile_setting, describe as describe_engine
from seed_tot.cli_options import (DEFAULT_PROMPT, MODE_CHOICE, MODE_OPTIONS, check_data_file, check_mode_options,
                                  check_policy_setting, decode_setting, load_engine, model_options, parse_k_config,
                                  pipeline_options, policy_kwargs, policy_options)
from seed_tot.engine.decode_spec import DRAFTING_MODES, MODES, DecodeSpec
from seed_tot.engine.pipeline import PIPELINE_MODES
from seed_tot.view.command import view_command, write_run_page

log = logging.getLogger("seed_tot")

class _Main(click.Group):
    """Bad input (data, config, model paths) ends in one clear line, not a traceback."""

    def main(self, *args, **kwargs):
        from seed_tot.interrupt import CtrlC

        restore = CtrlC().install()  # Ctrl-C stops every command within seconds, a second one at once
        try:
            return super().main(*args, **kwargs)
        finally:
            restore()

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as err:  # one line and exit 130, not click's "Aborted!" (seed_tot/interrupt.py)
            from seed_tot.interrupt import finish
            finish(err)
        except (ValueError, OSError) as err:
            log.debug("command failed", exc_info=True)
            raise click.ClickException(str(err)) from err
        except TypeError as err:  # a user's task method that returned the wrong type (search/expansion.py)
            expansion = sys.modules.get("seed_tot.search.expansion")  # not imported here: `--help` stays light
            if expansion is None or not isinstance(err, expansion.TaskMethodError):
                raise
            log.debug("command failed", exc_info=True)
            raise click.ClickException(str(err)) from err


@click.group(cls=_Main)
@click.version_option(package_name="seed-tot", prog_name="seed-tot")
@click.option("-v", "--verbose", count=True, help="-v: info logs, -vv: debug logs.")
def main(verbose: int) -> None:
    """Tree-of-thoughts reasoning on a scheduled speculative decoding (SEED) engine."""
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)


# generate's mode-specific options: the engine modes' and the pipeline modes' (trace records engine events only)
_GENERATE_MODE_OPTIONS = {**MODE_OPTIONS, "k_config": (*DRAFTING_MODES, "stpp"), "trace_dir": MODES,
                          **dict.fromkeys(("stages", "port", "pipeline_timeout", "join", "simulate"), PIPELINE_MODES),
                          **dict.fromkeys(("width", "children"), ("pipedec",))}


@main.command()
@click.argument("prompt", required=False)
@click.option("--prompt-file", type=click.Path(exists=True, dir_okay=False), help="Read the prompt from a file.")
@click.option("--mode", type=click.Choice([*MODE_CHOICE.choices, *PIPELINE_MODES]), default="seed", show_default=True,
              help="Decoding mode (README, Python API); pipedec, pp, stpp split the target into --stages processes.")
@model_options
@click.option("--k-config", callback=parse_k_config, default="1,1,1", show_default=True, help="Draft tree shape, e.g. 2,2,1.")
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy.")
@click.option("--top-k", type=int, default=0, show_default=True, help="Sample from the k likeliest tokens (0 = off).")
@click.option("--top-p", type=float, default=1.0, show_default=True, help="Nucleus sampling mass (1 = off).")
@click.option("--max-new-tokens", type=int, default=64, show_default=True, help="New tokens per sequence at most.")
@click.option("--num-samples", "-n", type=int, default=1, show_default=True, help="Copies of the prompt (a ToT thought batch).")
@click.option("--n-workers", type=int, callback=decode_setting("n_workers"), default=None,
              help="SEED draft workers running at once (default: all).")
@click.option("--verify-batch", callback=decode_setting("verify_batch"), default="auto", show_default=True,
              help="SEED: queued drafts verified per target forward (a number, 'all', or 'auto': all where exact).")
@click.option("--draft-batch", callback=decode_setting("draft_batch"), default="auto", show_default=True,
              help="SEED: ready draft workers drafted per draft forward (a number, 'all' or 'auto'; 1: one per forward, the paper's).")
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--seed", type=int, default=0, show_default=True, help="Sampling seed.")
@click.option("--draft-invariant", is_flag=True,
              help="Sampled: draw each token at a uniform keyed by the seed and its position, so every mode and "
                   "draft policy writes the same tokens for a seed (docs/engine.md).")
@click.option("--raw", is_flag=True, help="Do not apply the chat template.")
@click.option("--trace", "trace_dir", type=click.Path(file_okay=False), default=None, help="Write a Chrome/Perfetto trace here.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per result.")
@pipeline_options
@policy_options
@engine_options
def generate(prompt, prompt_file, mode, target, draft, draft_layers, device, dtype, k_config, temperature, top_k, top_p,
             max_new_tokens, num_samples, n_workers, verify_batch, draft_batch, stop, seed, raw, trace_dir, as_json,
             draft_policy, policy_option, head_dir, attention, compile_forwards, draft_invariant=False, **pipeline):
    """Generate a completion for PROMPT (default: a GSM8K question) and print text and stats."""
    from seed_tot import SamplingParams
    from seed_tot.engine import summarize

    if prompt is not None and prompt_file is not None:
        raise click.UsageError("give a PROMPT or --prompt-file, not both")
    check_mode_options(click.get_current_context(), [mode], _GENERATE_MODE_OPTIONS)
    # -sig: a byte-order mark (as Windows editors save UTF-8) is not part of the prompt
    text = Path(prompt_file).read_text(encoding="utf-8-sig") if prompt_file else (prompt or DEFAULT_PROMPT)
    try:
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                                stop=stop, seed=seed, draft_invariant=draft_invariant)
    except ValueError as err:
        raise click.UsageError(str(err)) from None
    if mode in PIPELINE_MODES:  # PipeDec and its baselines: N + 1 processes on torch.distributed
        refuse_engine_options(attention, compile_forwards, f"--mode {mode} runs the target's stages as processes "
                              "of their own, with per-stage caches and eager forwards")
        engine = load_engine(target, draft, draft_layers, device, dtype, modes=["ar" if mode == "pp" else "sd"])
        rendered = text if raw else engine.render_prompt(text)
        return _run_pipeline(engine, [rendered] * num_samples, params, mode, k_config, as_json, pipeline)
    spec = DecodeSpec(mode=mode, k_config=k_config, n_workers=n_workers, verify_batch=verify_batch,
                      draft_batch=draft_batch, **policy_kwargs(draft_policy, policy_option, head_dir))
    check_policy_setting(spec, "--policy-option")
    engine = load_engine(target, draft, draft_layers, device, dtype, modes=[mode], attention=attention,
                         compile_forwards=compile_forwards)
    rendered = text if raw else engine.render_prompt(text)
    with _tracing(trace_dir, "generate") as tracer:
        results = engine.generate([rendered] * num_samples, params, spec=spec)
        tracer.add_call(mode, results)
    for i, r in enumerate(results):
        if as_json:
            click.echo(json.dumps({"index": i, "text": r.text, "token_ids": r.token_ids,
                                   "finish_reason": r.finish_reason, "stats": r.stats.to_dict(),
                                   "threads": engine.threads_report()}))
        else:
            click.echo(f"--- {i} ({r.finish_reason}, {len(r.token_ids)} tokens)\n{r.text}")
    total = summarize(results)
    if not as_json:
        # what drafted: the policy by name (its default depends on the draft model), then the k_config given
        drafting = (f" policy={engine.policy_name(spec.draft_policy, mode, k_config)} k_config={','.join(map(str, k_config))}"
                    if mode in DRAFTING_MODES else "")
        click.echo(f"--- mode={mode}{drafting} target={engine.target_name} draft={engine.draft_name} "
                   f"{describe_engine(attention, compile_forwards)}")
        click.echo(f"wall {total.wall_s:.2f}s  tokens {total.new_tokens}  tokens/s {total.new_tokens / max(total.wall_s, 1e-9):.1f}  "
                   f"acceptance {total.acceptance_rate:.3f}  tokens/target forward {total.tokens_per_target_forward:.2f}  "
                   f"target forwards {total.target_forwards:.0f} (+{total.target_prefills:.0f} prefill)  "
                   f"draft forwards {total.draft_forwards:.0f}  verifications {total.verifications}  "
                   f"target busy {total.target_busy_fraction:.0%}"
                   + (f"  threads {engine.forward_thread.threads.describe()}" if engine.forward_thread else ""))


def _run_pipeline(engine, prompts, params, mode: str, k_config, as_json: bool, options: dict) -> None:
    """`generate --mode pipedec|pp|stpp`: run the pipeline and print each result and its tick counters."""
    from seed_tot.engine.pipeline.api import generate_pipelined

    outputs = generate_pipelined(engine, prompts, params, mode, stages=options["stages"], width=options["width"],
                                 children=options["children"], k_config=k_config, processes=not options["simulate"],
                                 port=options["port"], timeout_s=options["pipeline_timeout"], join=options["join"])
    for i, out in enumerate(outputs):
        r = out.result
        if as_json:
            click.echo(json.dumps({"index": i, "text": r.text, "token_ids": r.token_ids, "finish_reason": r.finish_reason,
                                   "pipeline": out.stats.to_dict()}))
        else:
            click.echo(f"--- {i} ({r.finish_reason}, {len(r.token_ids)} tokens)\n{r.text}")
            s = out.stats
            click.echo(f"--- mode={mode} stages={options['stages']} ticks {s.ticks}  tokens {s.tokens}  "
                       f"ticks/token {s.ticks_per_token:.2f}  hit rate {s.hit_rate:.3f}  "
                       f"forwards per rank {s.stage_forwards}")


@main.command()
@click.argument("task_name", metavar="TASK")
@click.option("--data", callback=check_data_file, default=None,
              help="Local data file (default: the task's Hub dataset or generator).")
@click.option("--limit", type=int, default=None, help="Solve this many problems (default: all).")
@click.option("--offset", type=int, default=0, show_default=True, help="Skip this many problems first.")
@click.option("--config", "config_file", type=click.Path(), default=None, help="YAML settings (default: configs/TASK.yaml).")
@click.option("--mode", type=MODE_CHOICE, default=None, help="Decoding mode of every engine call (default: the config's).")
@model_options
@click.option("--k-config", callback=parse_k_config, default=None,
              help="sd/mcsd/seed: draft tree shape, e.g. 1,1,1 (a chain) or 2,2,1 (default: the config's).")
@click.option("--algorithm", type=click.Choice(ALGORITHMS), default=None,
              help="Tree search, or the cot / cot-sc baselines (default: the config's).")
@algorithm_options
@click.option("--depth", type=int, default=None, help="ToT steps per problem (default: the config's).")
@click.option("--breadth", type=int, default=None, help="States kept per step (default: the config's).")
@click.option("--n-generate", type=int, default=None, help="Thoughts generated per state (default: the config's).")
@click.option("--temperature", type=float, default=None, help="Of every call, 0 = greedy (default: the config's).")
@click.option("--draft-invariant/--no-draft-invariant", default=None,
              help="Sampled calls draw each token at a uniform keyed by its seed and position: the same text in "
                   "every mode and draft policy (default: the config's, else off).")
@click.option("--max-new-tokens", type=int, default=None, help="Caps every call (default: the config's).")
@click.option("--n-workers", type=int, callback=decode_setting("n_workers"), default=None,
              help="SEED draft workers running at once (default: the config's).")
@click.option("--verify-batch", callback=decode_setting("verify_batch"), default=None,
              help="SEED: a number, 'all' or 'auto' (default: the config's).")
@click.option("--draft-batch", callback=decode_setting("draft_batch"), default=None,
              help="SEED: a number, 'all' or 'auto' (default: the config's).")
@click.option("--seed", type=int, default=None, help="Base seed; each problem's comes from it and its id (default: the config's).")
@click.option("--output", type=click.Path(file_okay=False), required=True, help="Directory for results.jsonl and summary.json.")
@click.option("--resume", is_flag=True, help="Skip problems already in OUTPUT/results.jsonl.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the summary as JSON (summary.json without its settings) instead of a few lines for a person.")
@click.option("--view", "view_page", is_flag=True, help="When the run ends, write OUTPUT/tree.html (see `seed-tot view`).")
@click.option("--trace", "trace_dir", type=click.Path(file_okay=False), default=None,
              help="Write trace.json, gpu.csv and utilization.png of the engine here.")
@policy_options
@click.option("--concurrency", type=click.IntRange(min=1), default=1, show_default=True,
              help="Problems searched at once on one engine (their sequences share batched forwards in seed mode); "
                   "with --ray, on each actor's engine.")
@click.option("--ray", "ray_address", is_flag=False, flag_value="auto", default=None, metavar="[auto|local|ADDRESS]",
              help="Solve on Ray actors, one engine each. auto (the bare flag): a running cluster, else a new local "
                   "one; local: a new local one; or a cluster's address.")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="With --ray: engines (actors) [default: as many as the cluster fits].")
@click.option("--gpus-per-worker", type=click.FloatRange(min=0), default=None,
              help="With --ray: GPUs per engine [default: 1 if the cluster has GPUs, else 0].")
@click.option("--cpus-per-worker", type=click.FloatRange(min=0, min_open=True), default=None,
              help="With --ray: CPUs per engine, also its torch threads [default: 1].")
@click.option("--search-timeout", type=click.FloatRange(min=0, min_open=True), default=None, metavar="SECONDS",
              help="With --ray: a problem's search still running after this long is recorded as failed (--resume "
                   "tries it again) and its engine replaced by a new one [default: no limit].")
@endpoint_options
@engine_options(default=False)
def solve(task_name, data, limit, offset, config_file, mode, target, draft, draft_layers, device, dtype, k_config,
          algorithm, depth, breadth, n_generate, temperature, max_new_tokens, n_workers, verify_batch, draft_batch, seed, output, resume, trace_dir,
          draft_policy, policy_option, head_dir, concurrency, ray_address, workers, gpus_per_worker, cpus_per_worker,
          search_timeout, view_page, as_json, attention, compile_forwards, **more):
    """Solve a dataset with tree-of-thoughts search; results are written as they finish.

    TASK: gsm8k, creative_writing, blocksworld; your own as path/to/file.py:ClassName or
    package.module:ClassName; or a name an installed package registers under the `seed_tot.tasks`
    entry-point group. --config and the flags apply to every task alike."""
    from seed_tot.search import apply_overrides, solve_dataset
    from seed_tot.search.data_source import data_source
    from seed_tot.search.results_file import check_output_free
    from seed_tot.search.solve import summarize_finished_run

    # the --api-* options (cli_endpoint.py) and the algorithms' own options (cli_algorithms.py)
    api = {k: v for k, v in more.items() if k.startswith("api_")}
    algorithm_settings = {k: v for k, v in more.items() if k not in api}
    ray_only = {"--workers": workers, "--gpus-per-worker": gpus_per_worker, "--cpus-per-worker": cpus_per_worker,
                "--search-timeout": search_timeout}
    given = [name for name, value in ray_only.items() if value is not None]
    api_decoding = check_endpoint_options(click.get_current_context(), api)  # --api-base: the server's models
    if ray_address is None and given:
        raise click.UsageError(f"{', '.join(given)} only apply with --ray")
    if ray_address is not None and trace_dir is not None:
        raise click.UsageError("--trace records an engine in this process; it does not combine with --ray")
    task, settings, examples = _task_setup(task_name, config_file, data, limit, offset)
    source = data_source(task, data)  # part of the run's identity: a resume never mixes two datasets
    check_mode_options(click.get_current_context(), [mode or settings.decode.mode])
    _warn_unused_settings(settings, mode or settings.decode.mode)
    results = Path(output) / "results.jsonl"
    if not resume and results.is_file() and results.stat().st_size > 0:  # fail before loading models
        raise click.UsageError(f"{results} already holds results: pass --resume to continue it, or another --output")
    check_output_free(Path(output))  # another run writing there fails now, not after the models load
    settings = apply_overrides(settings, mode=mode, k_config=k_config, algorithm=algorithm, depth=depth, breadth=breadth,
                               n_generate=n_generate, temperature=temperature,
                               max_new_tokens=max_new_tokens, n_workers=n_workers, verify_batch=verify_batch,
                               draft_batch=draft_batch, seed=seed, attention=attention, compile=compile_forwards,
                               **algorithm_settings,
                               **policy_kwargs(draft_policy, policy_option, head_dir))
    check_policy_setting(settings.decode,
                         "--policy-option" if policy_option or draft_policy else settings.source or "config")
    start = time.perf_counter()
    if resume and results.is_file() and results.stat().st_size > 0:
        # before loading models: records made with other settings are refused (run_identity.py), and a
        # run with nothing left needs no model at all
        summary = summarize_finished_run(task, examples, settings, output, data=source)
        if summary is not None:  # every problem already solved: no model to load, no Ray cluster to start
            if view_page:
                write_run_page(output, task)
            _echo_summary(summary, output, as_json, time.perf_counter() - start)
            return
    if api["api_base"] is not None:
        unused = [f"{key}={value}" for key, value, default in (("attention", settings.attention, DEFAULT_ATTENTION),
                                                                ("compile", settings.compile, DEFAULT_COMPILE))
                  if value != default]
        if unused:  # from the config: the run goes on, as with other keys a mode does not read
            log.warning("%s: %s apply to an engine in this process; the server at --api-base runs its own",
                        settings.source or "config", ", ".join(unused))
    if api["api_base"] is not None or ray_address is not None:
        start = time.perf_counter()
        summary = (solve_on_endpoint(api, api_decoding, task, examples, settings, output, resume, concurrency, source)
                   if ray_address is None else
                   _solve_on_ray(ray_address, (target, draft, draft_layers, device, dtype), task, examples, settings,
                                 output, resume, workers, gpus_per_worker, cpus_per_worker, concurrency, search_timeout, source))
        if view_page:
            write_run_page(output, task)
        _echo_summary(summary, output, as_json, time.perf_counter() - start)
        return
    engine = load_engine(target, draft, draft_layers, device, dtype, modes=[settings.decode.mode],
                         attention=settings.attention, compile_forwards=settings.compile)
    _prepare_policy(engine, settings)  # a first run's calibration, before the clocks of the wall and the first problem
    start = time.perf_counter()
    with _tracing(trace_dir, "solve") as tracer:
        summary = solve_dataset(tracer.wrap(engine), task, examples, settings=settings, output_dir=output, resume=resume,
                                concurrency=concurrency, data=source)
    if view_page:
        write_run_page(output, task)
    _echo_summary(summary, output, as_json, time.perf_counter() - start)


def _prepare_policy(engine, settings) -> None:
    from seed_tot import SamplingParams
    from seed_tot.engine.policy_warmup import prepare_policy

    if not callable(getattr(engine, "policy", None)):  # an engine that builds no draft policies (a test's fake)
        return
    prepare_policy(engine, settings.decode, SamplingParams(temperature=settings.search.temperature))


def _echo_summary(summary: dict, output: str, as_json: bool, wall_s: float) -> None:
    """solve's last words: a few lines for a person, or with --json the numbers (summary.json has both)."""
    from seed_tot.search.solve import describe_summary

    if as_json:
        click.echo(json.dumps({k: v for k, v in summary.items() if k != "settings"}, indent=2, default=str))
    else:
        click.echo(describe_summary(summary, output, wall_s))


def _warn_unused_settings(settings, mode: str) -> None:
    """One line for the config's mode-specific settings that `mode` ignores (the shipped configs'
    values equal the defaults, so they warn only where a config was written for another mode)."""
    defaults = DecodeSpec()
    fields = {"policy_option": "policy_options", "head_dir": None}  # option -> setting; --head has none
    ignored = [f"{field}={getattr(settings.decode, field)}" for name, users in MODE_OPTIONS.items()
               if (field := fields.get(name, name)) and mode not in users
               and getattr(settings.decode, field) != getattr(defaults, field)]
    if ignored:
        log.warning("%s: mode %s does not use %s", settings.source or "config", mode, ", ".join(ignored))


def _solve_on_ray(address, model, task, examples, settings, output, resume, workers, gpus_per_worker,
                  cpus_per_worker, concurrency, search_timeout, source):
    """solve --ray: the driver loads no model; each actor builds its engine from the same options."""
    from seed_tot.search.distributed import EngineSpec, RayRunError, solve_on_ray

    target, draft, draft_layers, device, dtype = model
    spec = EngineSpec(target=target, draft=draft, draft_layers=draft_layers, device=device, dtype=dtype,
                      load_draft=settings.decode.mode in DRAFTING_MODES, attention=settings.attention,
                      compile=compile_setting(settings.compile))
    try:
        return solve_on_ray(address, spec, task, examples, settings=settings, output_dir=output, resume=resume,
                            workers=workers, gpus_per_worker=gpus_per_worker, cpus_per_worker=cpus_per_worker or 1.0,
                            concurrency=concurrency, search_timeout_s=search_timeout, data=source)
    except RayRunError as err:
        raise click.ClickException(str(err)) from err


def _task_setup(task_name, config_file, data, limit, offset):
    from seed_tot.search import load_settings, shipped_config
    from seed_tot.search.expansion import check_examples
    from seed_tot.tasks.loading import check_window

    task = _get_task(task_name)
    if config_file is None:
        config_file = shipped_config(task.name)
    settings = load_settings(config_file, base=task.config, task_name=task.name)
    try:
        check_window(limit, offset)
    except ValueError as err:
        raise click.UsageError(str(err)) from None
    try:
        examples = check_examples(task, task.load(data, limit=limit, offset=offset))
    except TypeError as err:
        raise click.UsageError(str(err)) from None
    if not examples:
        raise click.UsageError(f"no problems to solve: {data or 'the default data of ' + task.name} has none "
                               f"from --offset {offset}")
    return task, settings, examples


def _get_task(task_name):
    from seed_tot.tasks import get_task

    try:
        return get_task(task_name)
    except ValueError as err:
        raise click.UsageError(str(err)) from None


@main.command()
@click.argument("task_name", metavar="TASK")
@click.option("--data", callback=check_data_file, default=None, help="The data the predictions answer.")
@click.option("--predictions", type=click.Path(exists=True, dir_okay=False), required=True,
              help='JSONL, one {"id", "prediction"} per line.')
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with n, correct and accuracy.")
def score(task_name, data, predictions, as_json):
    """Rescore saved predictions against the task's data."""
    from seed_tot.search.expansion import task_score
    from seed_tot.tasks.loading import DataError, check_unique_ids, read_jsonl

    task = _get_task(task_name)
    examples = {ex.id: ex for ex in task.load(data)}
    lines = read_jsonl(predictions, required=("id", "prediction"))
    check_unique_ids([str(record["id"]) for _, record in lines], [f"{predictions}:{n}" for n, _ in lines])
    rows = []
    for lineno, record in lines:
        example = examples.get(str(record["id"]))
        if example is None:
            raise DataError(f"{predictions}:{lineno}: id {record['id']!r} is not in the task's data")
        rows.append(task_score(task, example, str(record["prediction"])))
    n = len(rows)
    if rows and "correct" in rows[0]:
        correct = sum(bool(r["correct"]) for r in rows)
        out = {"n": n, "correct": correct, "accuracy": correct / n if n else 0.0}
    else:
        mean = sum(float(r.get("score", 0.0)) for r in rows) / n if n else 0.0
        out = {"n": n, "mean_score": mean}
    out["no_prediction"] = len(examples) - n  # data ids the predictions file does not answer
    if as_json:
        click.echo(json.dumps(out))
        return
    figures = ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in out.items()
                        if k not in ("n", "no_prediction"))
    click.echo(f"{task.name}: {n} prediction{'s' * (n != 1)} scored: {figures}")
    if out["no_prediction"]:
        click.echo(f"{out['no_prediction']} of the {len(examples)} records in the data have no prediction "
                   "(not counted above)")


class _NoTrace:
    def add_call(self, mode, results) -> None:
        pass

    def wrap(self, engine):
        return engine


class _tracing:
    """--trace DIR: a Chrome trace of the engine events (see seed_tot.trace); no-op without DIR."""

    def __init__(self, trace_dir, name: str):
        self.trace_dir, self.name = trace_dir, name

    def __enter__(self):
        if self.trace_dir is None:
            self.tracer = _NoTrace()
        else:
            from seed_tot.trace import TraceRecorder
            self.tracer = TraceRecorder(Path(self.trace_dir), self.name)
            self.tracer.start()
        return self.tracer

    def __exit__(self, *exc):
        if self.trace_dir is not None:
            self.tracer.finish()
            click.echo(self.tracer.written(), err=True)
        return False


def _register_bench() -> None:
    from seed_tot.bench import bench
    from seed_tot.tasks_command import tasks_command
    from seed_tot.serve.command import serve_command
    from seed_tot.training.cli import train_head_command
    from seed_tot.training.drafter_cli import train_drafter_command
    from seed_tot.training.vocab_cli import drafter_vocab_command
    main.add_command(bench)
    main.add_command(drafter_vocab_command)
    main.add_command(train_head_command)
    main.add_command(train_drafter_command)
    main.add_command(view_command)
    main.add_command(tasks_command)
    main.add_command(serve_command)
    main.add_command(compare_command)


_register_bench()

if __name__ == "__main__":
    main()
