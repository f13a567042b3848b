"""Shared-history attention on and off, alternating in one process (row_attention.py: rows that
hold a long prompt stretch in the same pool slots read it once, for every row's queries).

The batches are one ToT step's (`bench --workload tot-step`: 9 thought rows, 3 copies of each of 3
GSM8K thought prompts, then 9 value prompts), or its thought batch alone (`--batches thoughts`).
"Off" sets the threshold past any prompt, which is the gathered path every forward took before.
Each setting runs the same batches; tokens must be equal. Medians over --repeats (after a warm-up
of each), ratio = off / on. Run it alone on the machine:
    python benchmarks/shared_history.py --data ../shared/data/gsm8k/test.jsonl --modes parallel,seed --repeats 5
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

from seed_tot import Engine, SamplingParams
from seed_tot.bench_workloads import tot_step_workload
from seed_tot.engine import kv_pool

OFF = 10 ** 9


def step_batches(engine: Engine, data: str, params: SamplingParams) -> list[list[str]]:
    """The prompt batches of one ToT step, as `bench --workload tot-step` sends them."""
    batches: list[list[str]] = []

    class Recorder:
        def generate(self, prompts, params, spec=None):
            batches.append(list(prompts))

    run, _ = tot_step_workload(engine, data, params)
    run(Recorder(), type("Spec", (), {"decode": None})(), 0)
    return batches


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="GSM8K JSONL (the first question is used)")
    ap.add_argument("--target", default=None)
    ap.add_argument("--draft", default=None)
    ap.add_argument("--modes", default="parallel,seed")
    ap.add_argument("--batches", choices=("step", "thoughts"), default="step")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    engine = Engine.from_pretrained(args.target, args.draft)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0)
    batches = step_batches(engine, args.data, params)[: 1 if args.batches == "thoughts" else None]
    threshold, rows = kv_pool.MIN_SHARED_READ, []
    for mode in args.modes.split(","):
        walls: dict[str, list[float]] = {"on": [], "off": []}
        tokens: dict[str, list] = {}
        for repeat in range(args.repeats + 1):  # the first of each setting is a warm-up
            for setting in ("off", "on"):
                kv_pool.MIN_SHARED_READ = OFF if setting == "off" else threshold
                engine.clear_prefix_cache()
                start = time.perf_counter()
                out = [[r.token_ids for r in engine.generate(b, params, mode=mode)] for b in batches]
                if repeat:
                    walls[setting].append(time.perf_counter() - start)
                tokens.setdefault(setting, out)
        on, off = statistics.median(walls["on"]), statistics.median(walls["off"])
        row = {"mode": mode, "batches": args.batches, "rows": [len(b) for b in batches], "on_s": on, "off_s": off,
               "on_runs": walls["on"], "off_runs": walls["off"], "off_over_on": off / on,
               "tokens_equal": tokens["on"] == tokens["off"]}
        print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()
                          if not k.endswith("_runs")}), flush=True)
        rows.append(row)
    kv_pool.MIN_SHARED_READ = threshold
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"target": engine.target_name, "draft": engine.draft_name, "max_new_tokens": args.max_new_tokens,
                       "repeats": args.repeats, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
