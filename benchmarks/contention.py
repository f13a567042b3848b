"""The engine beside other busy processes: does it slow by its fair share, or starve?

Three parts, each run in fresh processes (a neighbour is a process of its own, started with torch's
default threads, and the measured run starts after it is busy):

1. Greedy `ar` of `--new-tokens` tokens of a GSM8K prompt on the embedded default (SmolLM2-135M),
   beside each neighbour (none; a PyTorch process multiplying 256x256 matrices; a 135M model's
   forwards), in three columns: the engine as it chooses its threads, the engine under
   OMP_NUM_THREADS=1, and transformers' own `generate` with torch's default threads.
2. A decode step's cost, `ar` and `seed`, beside each neighbour over its cost alone: (wall of N new
   tokens - wall of 1) / (N - 1), which takes the prefill out, from the same runs.
3. Two `seed-tot solve` runs started together, against one alone (both walls from start to exit).

Every figure is the median of `--repeats` after one untimed warm-up. Run it alone on the machine
(nothing else running but what it starts):

    python benchmarks/contention.py --json contention.json

A quick check that it runs (tiny settings, meaningless figures): tests/test_contention_bench.py.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

log = logging.getLogger("contention")

NEIGHBOURS = ("none", "matmul", "model")
COLUMNS = ("engine", "omp1", "transformers")  # "pinned2" (SEED_TOT_THREADS=2: torch's old default) on request
NEIGHBOUR_NAMES = {"none": "none", "matmul": "a PyTorch process multiplying 256x256 matrices (default threads)",
                   "model": "a heavier PyTorch job (a 135M model's forwards)"}
COLUMN_NAMES = {"engine": "engine, its own thread choice", "omp1": "engine, OMP_NUM_THREADS=1",
                "pinned2": "engine, SEED_TOT_THREADS=2 (before the thread choice)",
                "transformers": "transformers generate, default threads"}
PROMPT = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
          "How many clips did Natalia sell altogether in April and May?")
THREAD_SETTINGS = ("SEED_TOT_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
SOLVE_ARGS = "gsm8k --data ../shared/data/gsm8k/test.jsonl --limit 1"


def _clean_env(**extra: str) -> dict[str, str]:
    """This environment without thread settings (each process chooses as a user's would), plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in THREAD_SETTINGS}
    return {**env, **extra}


def _load(target: str | None, stock: bool, draft: str | None = None, load_draft: bool = False):
    from seed_tot import Engine

    return Engine.from_pretrained(target=target, draft=draft, device="cpu", load_draft=load_draft,
                                  cpu_linear="stock" if stock else None)


# ---- a neighbour: busy until killed ------------------------------------------------------------

def neighbour(kind: str, target: str | None) -> None:
    """Keep torch's default threads busy, on the main thread like any user's script; say "ready" first."""
    import torch

    if kind == "matmul":
        a = torch.randn(256, 256)
        print("ready", flush=True)
        while True:
            a = torch.tanh(a @ a)
    model = _load(target, stock=True).target
    ids = torch.randint(0, model.config.vocab_size, (1, 64))
    print("ready", flush=True)
    with torch.inference_mode():
        while True:
            model(ids)


def _start_neighbour(kind: str, target: str | None) -> subprocess.Popen | None:
    if kind == "none":
        return None
    args = [sys.executable, __file__, "_neighbour", kind] + (["--target", target] if target else [])
    proc = subprocess.Popen(args, env=_clean_env(), stdout=subprocess.PIPE, text=True)
    if proc.stdout.readline().strip() != "ready":
        proc.kill()
        raise RuntimeError(f"neighbour {kind} did not start (exit status {proc.wait()})")
    return proc


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is not None:
        proc.kill()
        proc.wait()


# ---- one measured process ----------------------------------------------------------------------

def measure(column: str, target: str | None, draft: str | None, new_tokens: int, repeats: int, modes: list[str]) -> dict:
    """Walls of N and of 1 new tokens per mode (medians), in this process; prints nothing."""
    import torch

    from seed_tot import SamplingParams
    from seed_tot.engine.decode_spec import DecodeSpec

    engine = _load(target, column == "transformers", draft, load_draft=column != "transformers" and modes != ["ar"])
    prompt = engine.render_prompt(PROMPT)

    def run(mode: str, n: int) -> None:
        params = SamplingParams(max_new_tokens=n, temperature=0.0)
        if column == "transformers":  # transformers' own loop, on this thread with torch's default threads
            ids = torch.tensor([engine.tokenizer(prompt, add_special_tokens=False)["input_ids"]])
            with torch.inference_mode():
                engine.target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                                       do_sample=False)
        else:
            engine.generate([prompt], params, spec=DecodeSpec(mode=mode))

    result = {}
    for mode in (["ar"] if column == "transformers" else modes):
        walls = {}
        for n in (new_tokens, 1):
            run(mode, n)  # warm-up
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                run(mode, n)
                times.append(time.perf_counter() - start)
            walls[n] = statistics.median(times)
        result[mode] = {"wall_s": walls[new_tokens], "step_ms": 1e3 * (walls[new_tokens] - walls[1]) / max(new_tokens - 1, 1)}
    result["threads"] = engine.threads_report()
    return result


def _measured(column: str, args) -> dict:
    env = _clean_env(**({"OMP_NUM_THREADS": "1"} if column == "omp1" else
                        {"SEED_TOT_THREADS": "2"} if column == "pinned2" else {}))
    cmd = [sys.executable, __file__, "_measure", column, "--new-tokens", str(args.new_tokens), "--repeats",
           str(args.repeats), "--modes", args.modes] + (["--target", args.target] if args.target else []) + (
           ["--draft", args.draft] if args.draft else [])
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{column}: exit status {out.returncode}\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---- two solves at once --------------------------------------------------------------------------

def _solve_walls(copies: int, args, out_dir: Path) -> list[float]:
    """Walls of `copies` `seed-tot solve` runs started together (each into its own output)."""
    procs, starts = [], []
    for i in range(copies):
        output = out_dir / f"solve-{copies}-{i}"
        cmd = [sys.executable, "-m", "seed_tot.cli", "solve", *shlex.split(args.solve_args), "--output", str(output)]
        starts.append(time.perf_counter())
        procs.append(subprocess.Popen(cmd, env=_clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    walls = []
    for proc, start in zip(procs, starts):
        _, err = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"seed-tot solve failed ({proc.returncode}): {err[-2000:]}")
        walls.append(time.perf_counter() - start)
    return walls


# ---- the tables ------------------------------------------------------------------------------

def run_all(args) -> dict:
    figures: dict = {"new_tokens": args.new_tokens, "repeats": args.repeats, "cells": {}}
    for kind in args.neighbours.split(","):
        for column in args.columns.split(","):
            proc = _start_neighbour(kind, args.target)
            try:
                figures["cells"][f"{kind}/{column}"] = cell = _measured(column, args)
            finally:
                _stop(proc)
            log.info("%s beside %s: %s", column, kind, json.dumps(cell))
    if args.solves:
        out_dir = Path(args.work_dir or tempfile.mkdtemp(prefix="contention-"))  # a fresh one: solve refuses to overwrite
        alone = _solve_walls(1, args, out_dir)[0]
        together = _solve_walls(2, args, out_dir)
        figures["solve"] = {"alone_s": alone, "together_s": together, "ratio": max(together) / alone}
    return figures


def format_tables(figures: dict) -> str:
    cells, n = figures["cells"], figures["new_tokens"]
    kinds = list(dict.fromkeys(key.split("/")[0] for key in cells))
    columns = list(dict.fromkeys(key.split("/")[1] for key in cells))
    lines = [f"greedy ar, {n} new tokens (median of {figures['repeats']}); x: over the same column alone", "",
             "| neighbour | " + " | ".join(COLUMN_NAMES[c] for c in columns) + " |",
             "| --- |" + " --- |" * len(columns)]
    for kind in kinds:
        row = []
        for column in columns:
            cell, alone = cells.get(f"{kind}/{column}"), cells.get(f"none/{column}")
            if cell is None:
                row.append("not measured")
                continue
            wall = cell["ar"]["wall_s"]
            ratio = f", {wall / alone['ar']['wall_s']:.1f}x alone" if alone and kind != "none" else ""
            threads = f", threads {cell['threads']['min']}-{cell['threads']['max']}" if cell.get("threads") else ""
            row.append(f"{wall:.2f} s ({n / wall:.0f} tok/s{ratio}{threads})")
        lines.append(f"| {NEIGHBOUR_NAMES[kind]} | " + " | ".join(row) + " |")
    lines += ["", "decode step (ms; (wall N - wall 1) / (N - 1)) and its ratio over the same mode and column alone", "",
              "| neighbour | column | mode | step ms | x alone |", "| --- | --- | --- | --- | --- |"]
    for key, cell in cells.items():
        kind, column = key.split("/")
        for mode in ("ar", "seed"):
            if mode not in cell:
                continue
            alone = cells.get(f"none/{column}", {}).get(mode)
            ratio = f"{cell[mode]['step_ms'] / alone['step_ms']:.2f}" if alone and alone["step_ms"] > 0 else "-"
            lines.append(f"| {kind} | {column} | {mode} | {cell[mode]['step_ms']:.1f} | {ratio} |")
    if "solve" in figures:
        s = figures["solve"]
        lines += ["", f"two `seed-tot solve {s.get('args', '')}` started together: "
                      f"{', '.join(f'{w:.1f}' for w in s['together_s'])} s; one alone {s['alone_s']:.1f} s; "
                      f"{s['ratio']:.2f}x"]
    return "\n".join(lines)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("role", nargs="?", default="main", choices=["main", "_measure", "_neighbour"],
                    help=argparse.SUPPRESS)
    ap.add_argument("what", nargs="?", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--target", default=None, help="Model (default: the embedded SmolLM2-135M-Instruct).")
    ap.add_argument("--draft", default=None, help="Draft of the seed mode (default: the target's shipped drafter).")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--modes", default="ar,seed", help="Engine modes timed (ar is the table's).")
    ap.add_argument("--neighbours", default=",".join(NEIGHBOURS))
    ap.add_argument("--columns", default=",".join(COLUMNS))
    ap.add_argument("--solves", type=int, default=1, help="1: also time two solves together against one (0: skip).")
    ap.add_argument("--solve-args", default=SOLVE_ARGS, help="What each `seed-tot solve` is given (before --output).")
    ap.add_argument("--work-dir", default=None, help="An empty directory for the solves' outputs (default: a new temporary one).")
    ap.add_argument("--json", dest="json_file", default=None, help="Also write every figure here.")
    return ap.parse_args(argv)


def main(argv=None) -> dict | None:
    args = parse_args(argv)
    if args.role == "_neighbour":
        neighbour(args.what, args.target)
        return None
    if args.role == "_measure":
        print(json.dumps(measure(args.what, args.target, args.draft, args.new_tokens, args.repeats, args.modes.split(","))))
        return None
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    figures = run_all(args)
    if "solve" in figures:
        figures["solve"]["args"] = args.solve_args
    print(format_tables(figures))
    if args.json_file:
        Path(args.json_file).write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    return figures


if __name__ == "__main__":
    main()
