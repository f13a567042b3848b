"""What `seed-tot bench` writes: one row per mode from its timed runs (`summarize_reports`), the
table (`format_table`), each row as soon as its mode has run (`RowStream`: printed, --jsonl, --json)
and the document's header (settings, title, environment). bench.py times; this file reports."""
from __future__ import annotations

import datetime
import json
import platform
from pathlib import Path
from typing import Any

import click

from seed_tot.engine.decode_spec import DRAFTING_MODES

# A report is seed_tot.bench's ModeReport (its spec, runs, median, totals()); bench imports this
# module, so the name stays unimported here and the annotations below name it by alias.
ModeReport = Any

HALF_DTYPES = ("bfloat16", "float16")


class RowStream:
    """Each mode's row as soon as it has run (medians so far): printed, appended to --jsonl and
    rewritten into --json, so that a run cut short keeps every figure it measured."""

    def __init__(self, header: dict, summary_args: tuple, json_file: str | None, jsonl_file: str | None):
        self.header, self.summary_args = header, summary_args  # summarize_reports' (greedy, synthetic, tot, problems)
        self.json_file, self.jsonl_file = json_file, jsonl_file

    def __call__(self, reports: list[ModeReport], report: ModeReport, index: int) -> None:
        rows = summarize_reports([r for r in reports if r.runs], *self.summary_args)
        row = next(r for r in rows if r["label"] == report.spec.label)
        greedy, synthetic, tot = self.summary_args[:3]
        table = format_table([row], greedy, tot, synthetic, self.header["environment"]["dtype"]).splitlines()
        click.echo(f"{self.header['workload']}: {row['label']} after run {index} of {self.header['repeats']}")
        click.echo("\n".join(table[:3]))  # header, rule, this mode's line (footnotes come with the final table)
        if self.jsonl_file:
            line = {k: self.header[k] for k in ("kind", "workload", "target", "draft", "temperature", "repeats")}
            line.update(device=self.header["environment"]["device_name"], round=index,
                        overlap_drafting=self.header["environment"].get("overlap_drafting"), **row)
            with Path(self.jsonl_file).open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(line) + "\n")
        if self.json_file:
            self.write(rows, partial=True)

    def write(self, rows: list[dict], partial: bool = False) -> None:
        """The --json document: the run's settings and environment, and every row (so far, if partial)."""
        out = {**self.header, **({"partial": True} if partial else {}), "modes": rows}
        Path(self.json_file).write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")


def summarize_reports(reports: list[ModeReport], greedy: bool, synthetic: dict | None, tot: bool,
                      problems: int | None = None) -> list[dict]:
    """One row per mode. Greedy outputs are checked against ar's, or where ar is not in the run
    against parallel's (greedy batched AR, which the tests prove token-identical to ar)."""
    ref = {m: next((r for r in reports if r.spec.decode.mode == m), None) for m in ("ar", "parallel")}
    reference = "ar" if ref["ar"] else "parallel"
    rows = []
    for r in reports:
        total = r.totals()
        row: dict[str, Any] = {**r.spec.to_dict(), "walls_s": [x.wall_s for x in r.runs], "wall_median_s": r.median,
                               "wall_min_s": min(x.wall_s for x in r.runs), "wall_max_s": max(x.wall_s for x in r.runs)}
        for m, other in ref.items():
            row[f"speedup_vs_{m}"] = other.median / r.median if other and r.median > 0 else None
        tokens_per_run = total.new_tokens / len(r.runs)  # identical runs under greedy decoding
        row.update(new_tokens_per_run=tokens_per_run, tokens_per_s=tokens_per_run / r.median,
                   acceptance_rate=total.acceptance_rate, tokens_per_target_forward=total.tokens_per_target_forward,
                   rows_per_target_forward=total.rows_per_target_forward,
                   query_tokens_per_target_forward=total.query_tokens_per_target_forward, cache_share=total.cache_share,
                   draft_forwards_per_token=total.draft_forwards / total.new_tokens if total.new_tokens else 0.0,
                   # what a drafter costs per round (ParallelSpec's one forward vs an AR drafter's k)
                   draft_ms_per_round=1000 * total.draft_busy_s / total.verifications if total.verifications else 0.0,
                   target_busy_fraction=total.target_busy_fraction, prefill_fraction=total.prefill_fraction,
                   target_forwards=round(total.target_forwards, 6),
                   target_prefills=round(total.target_prefills, 6), draft_forwards=round(total.draft_forwards, 6),
                   prompt_tokens_scored_per_run=round(total.target_prefill_tokens / len(r.runs), 3),
                   target_prefill_s_per_run=total.target_prefill_s / len(r.runs),
                   draft_prefill_s_per_run=total.draft_prefill_s / len(r.runs),
                   verifications=total.verifications, peak_memory_mib=r.peak_memory_mib)
        decode = r.spec.decode
        if decode.mode in DRAFTING_MODES and synthetic:
            from seed_tot.synthetic import expected_acceptance
            k = (1,) * len(decode.k_config) if decode.mode == "sd" else decode.k_config
            row["oracle_expected_acceptance"] = expected_acceptance(synthetic["alpha"], k)
        if problems:
            row["problems_per_hour"] = problems * 3600 / r.median if r.median > 0 else None
        row["matches_reference"] = reference
        row["matches_ar"] = _matches(r, ref[reference], greedy, tot)
        rows.append(row)
    return rows


def _matches(report: ModeReport, ar: ModeReport | None, greedy: bool, tot: bool) -> bool | None:
    if not greedy or ar is None:
        return None
    pick = (lambda run: run.predictions) if tot else (lambda run: run.tokens)
    reference = pick(ar.runs[0])
    return all(pick(run) == reference for run in report.runs)


def _environment(engine, dtype_name: str) -> dict[str, Any]:
    import torch
    import transformers

    from seed_tot.engine.cpu_linear import linear_kernel

    device = engine.target.device
    cpu = f"CPU {platform.processor() or platform.machine()} ({linear_kernel(engine.target)} linear)"
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu
    threads = engine.threads_report() if hasattr(engine, "threads_report") else None
    return {"device": str(device), "device_name": name, "dtype": dtype_name, "torch": torch.__version__,
            "cpu_threads": threads, "overlap_drafting": overlap_drafting(engine),
            "transformers": transformers.__version__, "python": platform.python_version(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "peak_memory": "torch.cuda.max_memory_allocated per mode" if device.type == "cuda"
            else "peak RSS of the whole process (a high-water mark: it never goes down between modes)"}


def overlap_drafting(engine) -> bool | None:
    """Whether the engine's step loop overlaps drafting with verification (seed.py's two schedules;
    None: an engine without that loop, e.g. a pipeline's)."""
    scheduler = getattr(engine, "scheduler", None)
    return getattr(scheduler, "overlap", None)


def format_table(rows: list[dict], greedy: bool, tot: bool, synthetic: dict | None, dtype: str = "float32") -> str:
    reference = rows[0].get("matches_reference", "ar") if rows else "ar"
    match_header = f"predictions == {reference}" if tot else f"tokens == {reference}"
    per_hour = any("problems_per_hour" in row for row in rows)
    headers = ["mode", "wall s median [min-max]", "x ar", "x parallel", *(["problems/h"] if per_hour else []),
               "tokens/s", "acceptance",
               "tokens/target fwd", "rows/target fwd", "query tok/target fwd", "target busy", "prefill", "cache share", "peak MiB", match_header]
    body = []
    for row in rows:
        accept = "-" if row["mode"] not in DRAFTING_MODES else f"{row['acceptance_rate']:.3f}"
        if "oracle_expected_acceptance" in row:
            accept += f" (oracle {row['oracle_expected_acceptance']:.3f})"
        matches = row["matches_ar"]
        match = ("n/a (sampling)" if not greedy else "n/a (no ar or parallel)" if matches is None
                 else "NO" if not matches else "ref" if row is _first(rows, reference) else "yes")
        rate = [f"{row['problems_per_hour']:.1f}" if row.get("problems_per_hour") else "-"] if per_hour else []
        body.append([row["label"], f"{row['wall_median_s']:.3f} [{row['wall_min_s']:.3f}-{row['wall_max_s']:.3f}]",
                     _ratio(row["speedup_vs_ar"]), _ratio(row["speedup_vs_parallel"]), *rate,
                     f"{row['tokens_per_s']:.1f}",
                     accept, f"{row['tokens_per_target_forward']:.2f}", f"{row['rows_per_target_forward']:.2f}",
                     f"{row['query_tokens_per_target_forward']:.2f}",
                     f"{row['target_busy_fraction']:.0%}", f"{row.get('prefill_fraction', 0.0):.0%}",
                     f"{row['cache_share']:.1%}",
                     f"{row['peak_memory_mib']:.0f}", match])
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *body)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip() for line in [headers, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if greedy and dtype in HALF_DTYPES and any(row["matches_ar"] is False for row in rows):
        # seen on this project's CPU: bf16 `parallel` differs from bf16 `ar` on 3 GSM8K thoughts
        lines.append(f"{dtype}: a forward's rounding depends on its batch shape, so the target's own greedy "
                     "output can differ between modes that batch differently (parallel against ar too); "
                     "token identity across modes holds in float32: rerun with --dtype float32 to check it "
                     "(README, 'Numerics')")
    if synthetic:
        lines.append(f"SYNTHETIC (preset {synthetic['preset']}, alpha {synthetic['alpha']:g}): "
                     "not a measurement of real models' outputs")
    return "\n".join(lines)


def _first(rows: list[dict], mode: str) -> dict | None:
    return next((row for row in rows if row["mode"] == mode), None)


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def synthetic_banner(preset: str, alpha: float) -> str:
    return (f"*** SYNTHETIC BENCHMARK: randomly initialised models of real shapes (preset {preset}); the draft "
            f"agrees with the target by an oracle with alpha={alpha:g}. Compute and timings are real; tokens, "
            f"acceptance and any accuracy are forced by the oracle, not produced by trained models. ***")


def bench_header(engine, synth: dict | None, workload: str, description: str, temperature: float, repeats: int,
            warmup: int) -> dict:
    """What the --json document says besides the rows: the run's settings, title and environment."""
    env = _environment(engine, str(engine.target.dtype).removeprefix("torch."))
    greedy = temperature == 0
    title = (f"{'SYNTHETIC ' if synth else ''}bench {workload}: {description}; "
             f"temperature {temperature:g}{' (greedy)' if greedy else ''}; {repeats} timed run(s) after {warmup} warm-up")
    return {"kind": "SYNTHETIC" if synth else "real", "synthetic": synth, "title": title,
            "workload": workload, "workload_description": description, "target": engine.target_name,
            "draft": engine.draft_name, "temperature": temperature, "greedy": greedy, "repeats": repeats,
            "environment": env}
