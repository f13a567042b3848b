"""What speculation can gain over batched AR at a given load, from measured forward costs alone.

For `rows` sequences sharing each forward and a per-token acceptance alpha, the best batched round
(auto.plan_lengths: every row's draft length, shared draft steps, one verification forward) is
compared with `parallel`'s round (every row one token, one target forward):

    ceiling = max over plans [ sum_i tokens(K_i) / time(K) ]  /  [ rows / t_target(rows) ]

once with the calibrated draft cost and once with a free draft (what a drafter costing nothing
could reach). Nothing here runs a model: the costs are the `auto` calibration of a target/draft
pair (`seed-tot` caches it in ~/.cache/seed-tot/calibration.json the first time `auto` or
`cut=cost` runs; `--measure` measures it now). Overheads the model leaves out (the draft's prefill,
scheduling) only lower what is reachable, so a ceiling below a goal shows the goal is out of reach
on that hardware with that pair.

    python benchmarks/speculation_ceiling.py --key qwen2.5-coder-1.5b --alpha 0.56,0.7,0.8 --rows 1,3,9,18,36

`--measure` calibrates a pair first (the embedded default unless --target/--draft say otherwise):

    python benchmarks/speculation_ceiling.py --measure --alpha 0.45,0.52 --rows 1,3,9
    python benchmarks/speculation_ceiling.py --measure --dtype bfloat16 --alpha 0.45,0.52 --rows 1,3,9

`--points` prices a pair from forward times measured elsewhere instead of a calibration, in
milliseconds by query tokens (rows x tokens per row), e.g. a GPU's replayed graphs from
`benchmarks/gpu_step.py graphs` (a 7B target at 1, 8 and 32 rows; a draft step of about a millisecond):

    python benchmarks/speculation_ceiling.py --points "target=1:8.77,8:10.0,32:13.5;draft=1:1.0" --alpha 0.4 --rows 9

`--gain 3:8` adds what more concurrency can give each kind of round: the best plan's tokens per
second at 8 rows over its tokens per second at 3 rows, beside the same ratio for `parallel`.
Issue 10 asks four ToT searches for 2x the problems per hour of one; on a CPU, where a forward's
cost grows with its query tokens, a round that already fills its forward with drafts gains less
from more rows than one that carries a single token per row.

`--prefill F` prices the whole workload, not its decoding alone: F is the share of the baseline's
wall spent scoring prompts (bench's `prefill` column; docs/benchmarks.md has the measured shares, e.g.
0.58 on the Qwen tot-step). No draft shortens that part, so a decode ceiling c becomes
1 / (F + (1 - F) / c) over the workload (Amdahl's law).

    python benchmarks/speculation_ceiling.py --key qwen2.5-coder-1.5b --alpha 0.56 --rows 9 --prefill 0.58

`--draft-prefill D` adds what drafting costs before its first round: the draft model scoring the
prompts too, D as a share of the baseline's wall (the drafting run's draft prefill seconds over the
baseline's wall), so a drafting plan's whole-workload ratio is 1 / (F + (1 - F) / c + D). A run
that does not draft pays no D, which is why `auto` prices the prefill before a call drafts.

The calibration times one row of n tokens over a 64-token history, so it leaves out what a forward
of many long rows adds (see benchmarks/row_forward_cost.py).
"""
from __future__ import annotations

import argparse
import json
import logging

from seed_tot.engine.cost_model import Costs, cache_path, costs_from_entry
from seed_tot.engine.policies.auto import batch_time, expected_tokens, plan_lengths

log = logging.getLogger(__name__)


def best_round(costs: Costs, alpha: float, rows: int, max_len: int = 8, pending: int = 2) -> tuple[float, list[int]]:
    """(expected tokens per second, plan) of the best batched round of `rows` rows of acceptance alpha."""
    plan = plan_lengths([alpha] * rows, [pending] * rows, costs, max_len)
    return sum(expected_tokens(alpha, k) for k in plan) / batch_time(plan, [pending] * rows, costs), plan


def ceiling(costs: Costs, alpha: float, rows: int, max_len: int = 8) -> tuple[float, list[int]]:
    """(best plan's tokens per second / parallel's, the plan) for `rows` rows of acceptance alpha."""
    rate, plan = best_round(costs, alpha, rows, max_len)
    return rate / (rows / costs.target(rows)), plan


def over_workload(decode_ratio: float, prefill: float, draft_prefill: float = 0.0) -> float:
    """A decode-only speed ratio over a whole workload whose baseline spends `prefill` of its wall
    scoring prompts, which speculation leaves as it is (Amdahl's law), plus `draft_prefill` of that
    wall which a drafting run adds scoring the prompts through its draft."""
    return 1.0 / (prefill + (1.0 - prefill) / decode_ratio + draft_prefill)


def load_entry(key: str) -> tuple[str, Costs]:
    cached = json.loads(cache_path().read_text(encoding="utf-8"))
    matches = [k for k in cached if key in k]
    if len(matches) != 1:
        raise SystemExit(f"{cache_path()}: {len(matches)} calibrations match {key!r}: {', '.join(cached) or 'none'}")
    entry = cached[matches[0]]
    return matches[0], costs_from_entry(entry)


def from_points(text: str) -> tuple[str, Costs]:
    """Costs from 'target=TOKENS:MS,...;draft=TOKENS:MS,...' (the draft's part optional: a free draft)."""
    parts: dict[str, tuple[tuple[int, float], ...]] = {}
    try:
        for part in text.split(";"):
            role, _, pairs = part.partition("=")
            parts[role.strip()] = tuple((int(n), float(ms) / 1e3) for n, ms in
                                        (pair.split(":") for pair in pairs.split(",")))
    except ValueError:
        raise SystemExit(f"--points {text!r}: expected 'target=TOKENS:MS,...;draft=TOKENS:MS,...', "
                         f"e.g. 'target=1:8.77,8:10.0,32:13.5;draft=1:1.0'") from None
    target, draft = parts.get("target", ()), parts.get("draft", ((1, 0.0),))
    if len(target) < 2 or set(parts) - {"target", "draft"}:
        raise SystemExit(f"--points {text!r}: needs target= with at least two TOKENS:MS pairs (and at most a draft=)")
    if len(draft) == 1:  # one measured draft step: flat in its tokens
        draft = (draft[0], (draft[0][0] + 1, draft[0][1]))
    return f"points {text}", Costs(0.0, 0.0, draft[0][1], target, draft)


def measured(target: str | None, draft: str | None, dtype: str | None = None) -> tuple[str, Costs]:
    """Calibrate (or read the cached calibration of) this pair on this machine, in `dtype`."""
    from seed_tot import Engine
    from seed_tot.engine.cost_model import cache_key, load_costs

    engine = Engine.from_pretrained(target, draft, dtype=dtype)
    return cache_key(engine), load_costs(engine)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--key", help="a substring of the calibration's key (target|draft|device|dtype)")
    parser.add_argument("--measure", action="store_true", help="calibrate --target/--draft now (cached)")
    parser.add_argument("--points", help="'target=TOKENS:MS,...;draft=TOKENS:MS,...': forward times measured elsewhere")
    parser.add_argument("--target", help="with --measure: hub id, local dir or .gguf (default: embedded)")
    parser.add_argument("--draft", help="with --measure: its draft (default: the shipped one)")
    parser.add_argument("--dtype", help="with --measure: float32 (CPU default), bfloat16, float16")
    parser.add_argument("--alpha", default="0.3,0.56,0.7,0.8,0.9")
    parser.add_argument("--rows", default="1,3,9,18,36")
    parser.add_argument("--max-len", type=int, default=8)
    parser.add_argument("--gain", help="LOW:HIGH rows: what going from LOW to HIGH rows gives each round")
    parser.add_argument("--prefill", type=float, help="the baseline's prompt-scoring share of its wall, in [0, 1)")
    parser.add_argument("--draft-prefill", type=float, default=0.0,
                        help="with --prefill: the draft's prompt scoring as a share of the baseline's wall")
    args = parser.parse_args()
    if args.prefill is not None and not 0.0 <= args.prefill < 1.0:
        parser.error(f"--prefill {args.prefill}: expected a share of the wall in [0, 1), e.g. 0.58")
    if args.draft_prefill < 0.0 or (args.draft_prefill and args.prefill is None):
        parser.error(f"--draft-prefill {args.draft_prefill}: expected a share >= 0, given with --prefill")
    if sum((args.measure, bool(args.key), bool(args.points))) != 1:
        parser.error("give exactly one of --key (a cached calibration), --measure and --points")
    if args.points:
        key, costs = from_points(args.points)
    else:
        key, costs = measured(args.target, args.draft, args.dtype) if args.measure else load_entry(args.key)
    free = Costs(costs.target_fixed_s, costs.target_per_token_s, 0.0, costs.target_points, ((1, 0.0), (2, 0.0)))
    alphas = [float(a) for a in args.alpha.split(",")]
    print(f"calibration: {key}")
    print("| rows | " + " | ".join(f"alpha {a}: x parallel (plan), free draft" for a in alphas) + " |")
    print("| --- |" + " --- |" * len(alphas))
    whole = []  # (rows, cells) over the whole workload, with --prefill
    for rows in (int(r) for r in args.rows.split(",")):
        cells, whole_cells = [], []
        for a in alphas:
            real, plan = ceiling(costs, a, rows, args.max_len)
            ideal, ideal_plan = ceiling(free, a, rows, args.max_len)
            cells.append(f"{real:.2f} (K={max(plan)}), {ideal:.2f} (K={max(ideal_plan)})")
            if args.prefill is not None:
                whole_cells.append(f"{over_workload(real, args.prefill, args.draft_prefill):.2f}, "
                                   f"{over_workload(ideal, args.prefill):.2f}")
        print(f"| {rows} | " + " | ".join(cells) + " |")
        whole.append((rows, whole_cells))
    if args.prefill is not None:
        extra = f", the draft's prefill {args.draft_prefill:.0%} more (not the free draft's)" if args.draft_prefill else ""
        print(f"\nover the whole workload, {args.prefill:.0%} of the baseline's wall scoring prompts{extra}:")
        print("| rows | " + " | ".join(f"alpha {a}: x parallel (plan), free draft" for a in alphas) + " |")
        print("| --- |" + " --- |" * len(alphas))
        for rows, cells in whole:
            print(f"| {rows} | " + " | ".join(cells) + " |")
    if args.gain:
        try:
            low, high = (int(r) for r in args.gain.split(":"))
        except ValueError:
            parser.error(f"--gain {args.gain!r}: expected LOW:HIGH, two whole numbers of rows (e.g. 3:8)")
        parallel_gain = (high / costs.target(high)) / (low / costs.target(low))
        print(f"\n{low} -> {high} rows: parallel gains {parallel_gain:.2f}x tokens per second")
        print("| alpha | best plan's gain | free draft's gain |")
        print("| --- | --- | --- |")
        for a in alphas:
            real = best_round(costs, a, high, args.max_len)[0] / best_round(costs, a, low, args.max_len)[0]
            ideal = best_round(free, a, high, args.max_len)[0] / best_round(free, a, low, args.max_len)[0]
            print(f"| {a} | {real:.2f}x | {ideal:.2f}x |")


if __name__ == "__main__":
    main()
