"""`seed-tot bench`: time the decoding modes side by side on one tree-of-thoughts workload.

Workloads
  thoughts               one thought batch (3 copies of a GSM8K thought prompt) and one
                         state-evaluation batch (3 different value prompts), per run; no stop
                         strings, so every mode decodes the same max-new-tokens per sequence
  tot-step               one ToT-BFS step at breadth 3: 9 thought sequences (3 copies of each of 3
                         states' prompts) in one call, then 9 value prompts (9 different states)
  tot-gsm8k, tot-creative-writing, tot-blocksworld
                         whole ToT solves of --limit problems (blocksworld without --data uses its
                         built-in generator; the other two need --data, the Hub is not used)

Mode specs (--modes, comma separated): MODE[:K-K-K][@wN][@vbM][@dbM][@cN][@pc0][+POLICY[:KEY=VALUE...]]
  MODE    ar, parallel, sd, mcsd or seed
  :K-K-K  this mode's draft-tree shape (default --k-config), e.g. mcsd:2-2-1, seed:2-2-1
  @wN     SEED draft workers running at once (default --n-workers)
  @vbM    SEED drafts verified per target forward (default --verify-batch; M=all: every queued draft)
  @dbM    SEED ready workers drafted per draft forward (default --draft-batch; M=all: every ready one)
  @cN     tot-gsm8k/-creative-writing/-blocksworld: problems searched at once (default --concurrency),
          so one run can compare e.g. parallel,parallel@c4
  @pc0    keep no prompt stretches across calls (the engine's prefix store off), e.g. parallel,parallel@pc0
  +POLICY the draft policy (fixed, opt-tree, specdec, auto, parallelspec) with its options,
          e.g. sd+auto, seed+opt-tree:n=8:delta=0.2, sd+specdec:h=0.5:head=DIR
  e.g. --modes ar,parallel,sd,mcsd:2-2-1,seed@db1@vb1,seed@dball@vball,seed+opt-tree:n=8

Each mode gets its draft policy built (auto's one-time calibration included) and its warm-up runs,
then the timed runs go in rounds: every mode once per round,
--repeats rounds, so a machine whose speed drifts during the run slows every mode alike. Speedups
are ratios of medians taken in this one run. bench decodes greedily unless --temperature says otherwise (the task configs
sample at 1.0), because under greedy decoding every mode must reproduce ar's tokens (thoughts) or
predictions (tot-*), and the table says whether it did (against parallel, greedy batched AR,
where ar is not in the run).

--synthetic PRESET swaps the models for random ones of real shapes whose draft agrees with the
target at rate --alpha (seed_tot.synthetic): real compute, forced acceptance. The output
then says SYNTHETIC in its banner, title, table and JSON.
"""
from __future__ import annotations

import contextlib
import json
import re
import resource
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import click

from seed_tot.cli_engine import engine_options
from seed_tot.engine.engine_settings import compile_setting, describe as describe_engine
from seed_tot.bench_report import RowStream, bench_header, format_table, summarize_reports, synthetic_banner
from seed_tot.bench_workloads import ModeSpec, Workload, thoughts_workload, tot_step_workload, tot_workload
from seed_tot.cli_options import (check_data_file, check_mode_options, check_policy_setting, decode_setting,
                                  given_options, load_engine, model_options, one_of_later, parse_k_config)
from seed_tot.engine.decode_spec import DRAFTING_MODES, MODES, DecodeSpec, DecodeSpecError
from seed_tot.engine.params import GenerationResult, GenerationStats, SamplingParams
from seed_tot.run_progress import RunProgress, bench_plan, few_repeats_warning

WORKLOADS = ("thoughts", "tot-step", "tot-gsm8k", "tot-creative-writing", "tot-blocksworld")
DEFAULT_THOUGHT_TOKENS = 64
DEFAULT_ALPHA = 0.8
SPEC_SYNTAX = "MODE[:K-K-K][@wN][@vbM][@dbM][@cN][@pc0][+POLICY[:KEY=VALUE...]]"
_SPEC = re.compile(r"^(?P<mode>[a-z]+)(?::(?P<k>\d+(?:-\d+)*))?(?P<opts>(?:@(?:w\d+|vb(?:\d+|all)|db(?:\d+|all)|c\d+|pc[01]))*)"
                   r"(?:\+(?P<policy>[a-z-]+)(?P<popts>(?::[A-Za-z_]+=[^:,]+)*))?$")


_SUFFIX_SETTINGS = {"w": "n_workers", "vb": "verify_batch", "db": "draft_batch"}


def parse_modes(text: str, defaults: DecodeSpec) -> list[ModeSpec]:
    """The --modes entries; a setting an entry does not give comes from `defaults` (the flags)."""
    specs: list[ModeSpec] = []
    for label in (part.strip() for part in text.split(",")):
        m = _SPEC.match(label)
        if not m or m["mode"] not in MODES:
            raise click.BadParameter(f"{label!r} is not {SPEC_SYNTAX} with MODE one of {', '.join(MODES)}",
                                     param_hint="--modes")
        opts = dict(re.findall(r"@(w|vb|db|c|pc)(\d+|all)", m["opts"]))
        concurrency = int(opts.pop("c")) if "c" in opts else None
        prefix_cache = opts.pop("pc", "1") == "1"
        if concurrency is not None and concurrency <= 0:
            raise click.BadParameter(f"{label!r}: @c needs at least one problem at once", param_hint="--modes")
        if m["policy"] and m["mode"] not in DRAFTING_MODES:
            raise click.BadParameter(f"{label!r}: +{m['policy']} needs a drafting mode ({', '.join(DRAFTING_MODES)})",
                                     param_hint="--modes")
        if (m["k"] or opts) and m["mode"] not in DRAFTING_MODES:
            raise click.BadParameter(f"{label!r}: {m['mode']} drafts nothing, it takes no :K or @ settings",
                                     param_hint="--modes")
        if opts and m["mode"] != "seed":
            raise click.BadParameter(f"{label!r}: @w, @vb and @db are SEED settings", param_hint="--modes")
        changes = {_SUFFIX_SETTINGS[key]: value for key, value in opts.items()}
        if m["k"]:
            changes["k_config"] = m["k"].split("-")
        if m["policy"]:
            changes.update(draft_policy=m["policy"],
                           policy_options=[kv.split("=", 1) for kv in (m["popts"] or "").split(":") if kv])
        try:
            decode = defaults.replace(mode=m["mode"], **changes)
        except DecodeSpecError as err:
            raise click.BadParameter(f"{label!r}: {err}", param_hint="--modes") from None
        check_policy_setting(decode, "--modes", label)
        if any(s.label == label for s in specs):
            raise click.BadParameter(f"{label!r} is listed twice", param_hint="--modes")
        specs.append(ModeSpec(label, decode, concurrency, prefix_cache))
    return specs


class _CallLog:
    """Forwards to the engine and keeps every generate call's results (ToT solves make many)."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []

    def render_prompt(self, *args, **kwargs) -> str:
        return self.engine.render_prompt(*args, **kwargs)

    def generate(self, prompts, params, *, spec: DecodeSpec) -> list[GenerationResult]:
        results = self.engine.generate(prompts, params, spec=spec)
        self.calls.append(results)
        return results


@dataclass
class RunOutput:
    wall_s: float
    stats: GenerationStats
    tokens: list[list[int]]
    predictions: list[str] | None


def _sync(device) -> None:
    import torch  # here and below: imported when a benchmark runs, not for `bench --help`

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _run_once(engine, workload: Workload, spec: ModeSpec, index: int) -> RunOutput:
    engine.clear_prefix_cache(keep=spec.prefix_cache)  # every run starts cold, as a fresh solve does
    log_engine = _CallLog(engine)
    _sync(engine.target.device)
    start = time.perf_counter()
    predictions = workload(log_engine, spec, index)
    _sync(engine.target.device)
    wall = time.perf_counter() - start
    from seed_tot.engine import summarize

    stats = GenerationStats()
    for results in log_engine.calls:
        stats.add(summarize(results))
    stats.wall_s = wall
    return RunOutput(wall, stats, [r.token_ids for results in log_engine.calls for r in results], predictions)


@dataclass
class ModeReport:
    spec: ModeSpec
    runs: list[RunOutput] = field(default_factory=list)
    peak_memory_mib: float = 0.0

    @property
    def median(self) -> float:
        return statistics.median(r.wall_s for r in self.runs)

    def totals(self) -> GenerationStats:
        total = GenerationStats()
        for r in self.runs:
            total.add(r.stats)
            total.wall_s += r.wall_s
        return total


def build_policy(engine, spec: ModeSpec, params) -> None:
    """Build a drafting mode's draft policy (the one its calls will run) before its runs: building
    may time this machine's forwards (auto's calibration: on a CPU a minute or more for a pair of 1B
    models, once per machine), and a timed run, or a warm-up that --warmup 0 leaves out, must not carry it."""
    from seed_tot.engine.policy_warmup import prepare_policy

    if params is not None:
        prepare_policy(engine, spec.decode, params)  # says (-v) when it calibrates and how long it took


def bench_modes(engine, workload: Workload, specs: list[ModeSpec], repeats: int, recorder=None,
                warmup: int = 1, on_run=None, params=None) -> list[ModeReport]:
    """Time `repeats` rounds of every mode once each, each mode warmed up just before its first
    timed run (its draft policy built first: `build_policy`, with `params` the runs' sampling
    settings; None skips it); `on_run(reports, report, round)` after every timed run.

    Rounds rather than mode after mode: on a shared or thermally drifting machine a mode measured
    last would otherwise carry the drift into every ratio (seen here: ~30% within one sitting).
    Warm-ups inside the first round rather than all first: a run cut short (a device call's time
    limit) has then timed every mode it warmed up, and on_run has reported it. Each run is shown as
    it goes (run_progress.py)."""
    reports = [ModeReport(spec) for spec in specs]
    timed = [recorder.wrap(engine, label=spec.label) if recorder else engine for spec in specs]
    progress = RunProgress(bench_plan([spec.label for spec in specs], repeats, warmup))
    with contextlib.closing(progress):
        for i in range(1, repeats + 1):
            for report, eng in zip(reports, timed):
                _run_mode(engine, workload, report, eng, i, warmup, params, recorder, progress)
                if on_run:
                    on_run(reports, report, i)
    return reports


def _run_mode(engine, workload: Workload, report: ModeReport, timed, i: int, warmup: int, params, recorder,
              progress: RunProgress) -> None:
    """Round i's timed run of one mode (its policy and warm-ups first in round 1)."""
    import torch

    device = engine.target.device
    if i == 1:
        build_policy(engine, report.spec, params)
        for _ in range(warmup):
            progress.begin()
            _run_once(engine, workload, report.spec, 0)  # warm-up: kernels, allocator, caches; not timed
            progress.end()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    progress.begin()
    with (recorder.section(f"{report.spec.label} run {i}") if recorder else contextlib.nullcontext()):
        report.runs.append(_run_once(timed, workload, report.spec, i))
    progress.end()
    if device.type == "cuda":
        report.peak_memory_mib = max(report.peak_memory_mib, torch.cuda.max_memory_allocated(device) / 2**20)
    else:  # ru_maxrss is KiB on Linux; it is the process's high-water mark, not this mode's
        report.peak_memory_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@click.command()
@click.option("--workload", type=click.Choice(WORKLOADS), default="thoughts", show_default=True,
              help="thoughts: one thought and one value batch; tot-step: one ToT-BFS step; tot-*: whole solves.")
@click.option("--modes", default="ar,parallel,sd,mcsd,seed", show_default=True,
              help=f"Comma-separated {SPEC_SYNTAX}: :K-K-K the draft tree, @wN SEED draft workers, @vbM / @dbM "
                   "drafts per target / draft forward (M=all: every one), @cN problems at once (tot-* solves), @pc0 "
                   "no prompt stretches kept across calls, +POLICY a draft policy and its options; e.g. "
                   "ar,parallel@c4,mcsd:2-2-1,seed@db1@vb1,seed@dball@vball,sd+auto,seed+opt-tree:n=8,seed+lookup.")
@model_options
@click.option("--k-config", callback=parse_k_config, default="1,1,1", show_default=True,
              help="Default draft-tree shape of sd (its depth), mcsd and seed.")
@click.option("--n-workers", type=click.IntRange(min=1), default=None,
              help="SEED draft workers running at once (default: all).")
@click.option("--verify-batch", callback=decode_setting("verify_batch"), default="auto", show_default=True,
              help="SEED drafts verified per target forward (a number, 'all', or 'auto': the engine's default).")
@click.option("--draft-batch", callback=decode_setting("draft_batch"), default="auto", show_default=True,
              help="SEED ready workers drafted per draft forward (a number, 'all' or 'auto').")
@click.option("--temperature", type=click.FloatRange(min=0), default=0.0, show_default=True, help="0 = greedy.")
@click.option("--draft-invariant", is_flag=True,
              help="Sampled: every mode draws each token at a uniform keyed by the seed and its position, so the "
                   "modes write the same text and their wall times compare directly (docs/engine.md).")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=None,
              help=f"Per sequence (thoughts default {DEFAULT_THOUGHT_TOKENS}; tot-* default: the task config's).")
@click.option("--data", callback=check_data_file, default=None, help="Local task data (thoughts: a GSM8K JSONL).")
@click.option("--limit", type=click.IntRange(min=1), default=1, show_default=True, help="Problems per tot-* run.")
@click.option("--concurrency", type=click.IntRange(min=1), default=1, show_default=True,
              help="tot-*: problems searched at once on the one engine.")
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True, help="Timed runs after a warm-up.")
@click.option("--output", "output_dir", type=click.Path(file_okay=False), default=None,
              help="tot-*: keep each run's results.jsonl and summary.json here (default: a temporary directory).")
@click.option("--warmup", type=click.IntRange(min=0), default=1, show_default=True,
              help="Untimed runs per mode first (0 for slow CPU runs of big models).")
@click.option("--seed", type=int, default=0, show_default=True, help="Sampling seed (and the synthetic models').")
@click.option("--json", "json_file", type=click.Path(dir_okay=False), default=None, help="Write every number here.")
@click.option("--jsonl", "jsonl_file", type=click.Path(dir_okay=False), default=None,
              help="Append each mode's row here (one JSON line) as soon as that mode has run.")
@click.option("--trace", "trace_dir", type=click.Path(file_okay=False), default=None,
              help="Write trace.json, gpu.csv and utilization.png (one panel per mode) here.")
@click.option("--synthetic", metavar="PRESET", callback=one_of_later("seed_tot.synthetic", "PRESETS"), default=None,
              help="Random models of real shapes with an acceptance oracle instead of --target/--draft: "
                   "llama2-7b+llama-160m, qwen2-1.5b+qwen2-0.5b or tiny (seed_tot.synthetic.PRESETS); "
                   "replay-NAME: the target replays a recorded real run's text (seed_tot/replay.py).")
@click.option("--alpha", type=click.FloatRange(0, 1), default=DEFAULT_ALPHA, show_default=True,
              help="--synthetic: probability that a draft token matches the target's.")
@engine_options
def bench(workload, modes, target, draft, draft_layers, device, dtype, k_config, n_workers, verify_batch, draft_batch,
          temperature, max_new_tokens, data, limit, concurrency, output_dir, repeats, warmup, seed, json_file, trace_dir,
          synthetic, alpha, jsonl_file, compile_forwards="auto", attention="gather", draft_invariant=False):
    """Benchmark the decoding modes on one workload and print a table."""
    specs = parse_modes(modes, DecodeSpec(k_config=k_config, n_workers=n_workers, verify_batch=verify_batch,
                                          draft_batch=draft_batch))
    ctx = click.get_current_context()
    check_mode_options(ctx, [s.decode.mode for s in specs])
    solves = tuple(w for w in WORKLOADS if w.startswith("tot-") and w != "tot-step")
    check_mode_options(ctx, [workload], dict.fromkeys(("limit", "concurrency", "output_dir"), solves), "workload")
    if not synthetic and "alpha" in given_options(ctx):
        raise click.UsageError("--alpha sets the acceptance oracle of --synthetic: it needs --synthetic")
    with_c = [s.label for s in specs if s.concurrency is not None]
    if with_c and not (workload.startswith("tot-") and workload != "tot-step"):
        raise click.BadParameter(f"{', '.join(with_c)}: @c (problems at once) applies to whole ToT solves "
                                 f"(tot-gsm8k, tot-creative-writing, tot-blocksworld), not {workload}",
                                 param_hint="--modes")
    if synthetic and (target or draft):
        raise click.UsageError("--synthetic builds its own models: leave out --target and --draft")
    if synthetic:
        from seed_tot.synthetic import build_synthetic_engine
        engine = build_synthetic_engine(synthetic, alpha, device, dtype, seed=seed, attention=attention,
                                        compile=compile_setting(compile_forwards))
        click.echo(synthetic_banner(synthetic, alpha))
    else:
        engine = load_engine(target, draft, draft_layers, device, dtype, modes=[s.decode.mode for s in specs],
                             attention=attention, compile_forwards=compile_forwards)
    synth = {"preset": synthetic, "alpha": alpha, "banner": synthetic_banner(synthetic, alpha)} if synthetic else None
    greedy, tot = temperature == 0, workload.startswith("tot-") and workload != "tot-step"
    recorder = None
    if trace_dir:
        from seed_tot.trace import TraceRecorder
        recorder = TraceRecorder(Path(trace_dir), f"bench {workload}" + (" SYNTHETIC" if synthetic else ""))
        recorder.start()
    with (contextlib.nullcontext(output_dir) if output_dir else tempfile.TemporaryDirectory(prefix="seed-tot-bench-")) as tmp:
        # a tot-* solve's calls sample at this temperature too (apply_overrides), so its draft policies,
        # keyed by greedy or not, are the ones these params build (bench_modes builds them before timing)
        params = SamplingParams(max_new_tokens=max_new_tokens or DEFAULT_THOUGHT_TOKENS, temperature=temperature,
                                seed=seed, draft_invariant=draft_invariant)
        if tot:
            run, description = tot_workload(workload, data, limit, temperature, max_new_tokens, seed, Path(tmp),
                                            concurrency, draft_invariant)
        else:
            make = tot_step_workload if workload == "tot-step" else thoughts_workload
            run, description = make(engine, data, params)
        header = bench_header(engine, synth, workload, description, temperature, repeats, warmup)
        header["compile"] = {"setting": compile_forwards}  # and, after the run, what each model compiled
        header["attention"] = attention
        header["draft_invariant"] = draft_invariant
        if draft_invariant and not greedy:
            header["title"] += "; draft-invariant sampling (a seed's tokens do not depend on the drafts)"
        stream = RowStream(header, (greedy, synth, tot, limit if tot else None), json_file, jsonl_file)
        try:
            reports = bench_modes(engine, run, specs, repeats, recorder, warmup, on_run=stream, params=params)
        finally:
            if recorder:
                recorder.finish()
                click.echo(recorder.written(), err=True)
    rows = summarize_reports(reports, greedy, synth, tot, limit if tot else None)
    env, title = header["environment"], header["title"]
    click.echo(title)
    threads = f" | threads {engine.forward_thread.threads.describe()}" if getattr(engine, "forward_thread", None) else ""
    overlap = {True: " | drafting overlaps verification", False: " | drafting and verification in turn"}.get(
        env.get("overlap_drafting"), "")
    click.echo(f"target {engine.target_name} | draft {engine.draft_name} | {env['device_name']} {env['dtype']} | "
               f"torch {env['torch']} | {env['date']}{threads}{overlap} | {describe_engine(attention, compile_forwards)}")
    click.echo(format_table(rows, greedy, tot, synth, env["dtype"]))
    if (note := few_repeats_warning(repeats)) is not None:
        click.echo(note, err=True)
    from seed_tot.engine.compiled_forward import compile_report
    for role in ("target", "draft"):
        runtime = getattr(engine, f"{role}_runtime", None)
        if runtime is not None:
            stream.header["compile"][role] = report = compile_report(runtime)
            if report["buckets"] or report["failures"]:
                click.echo(f"compiled {role} forwards: {report['buckets']} buckets in {report['seconds']:.1f} s "
                           f"(each bucket's first run), {report['failures']} failed to compile")
    if json_file:
        stream.write(rows)
        click.echo(f"results written to {json_file}", err=True)
