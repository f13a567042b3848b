"""What one decode forward of r rows costs through the engine's batched path, beside plain batching.

Each row has a `--context`-token history (a ToT prompt is 500-700 tokens) and scores one token.
`forward_batch` (kv_cache.py) attends every row over its own storage (row_attention.py: one loop
over rows and segments per layer, no copy of any history); "padded" is transformers' own batched
decode over one DynamicCache holding every row's history (one attention call per layer). Its cache
is built outside the timing, but DynamicCache appends by `torch.cat`, so each padded forward still
copies every row's history once per layer, as the stock batched decode does. The medians of
`--repeats` forwards per size, after a warm-up; run it alone on the machine.

With `--drafting N`, only N rows score `--entries` tokens and the rest one (a verification where a
few rows drafted): the table then sets the one-query rows' attention apart (row_attention.RowSplit,
the default) beside one attention call of every row at the widest row's width.

    python benchmarks/row_forward_cost.py --context 600 --rows 1,2,3,4,6,9,12
    python benchmarks/row_forward_cost.py --target MODEL.gguf --dtype bfloat16 --entries 4 --rows 1,3,9
    python benchmarks/row_forward_cost.py --context 600 --rows 4,7,9 --entries 4 --drafting 1
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import DynamicCache

from seed_tot import Engine
from seed_tot.engine.cache_argument import cache_kwargs
from seed_tot.engine import row_attention
from seed_tot.engine.kv_cache import KVCache, forward_batch
from seed_tot.engine.model_runtime import ATTENTION_PATHS, ModelRuntime
from seed_tot.engine.speculative import prefill


def _median_ms(step, repeats: int) -> float:
    step()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


@torch.inference_mode()
def measure(runtime, context: int, rows: int, repeats: int, entries: int = 1,
            drafting: int | None = None) -> tuple[float, float | None]:
    """(forward_batch ms, padded ms) for `rows` rows of `context` tokens, `entries` new tokens each
    (a chain, as a verification scores a draft) through a ModelRuntime; padded only at one entry (a decode step).
    drafting: only the first `drafting` rows score `entries` tokens, the rest one; the second figure is
    then forward_batch with every row in one attention call (no RowSplit)."""
    model = runtime.model
    widths = [entries if drafting is None or b < drafting else 1 for b in range(rows)]
    prompt = [(i * 7) % 5000 + 10 for i in range(context + 1)]
    caches = []
    for _ in range(rows):
        kv = KVCache()
        prefill(runtime, kv, prompt)  # context tokens in the cache
        caches.append(kv)

    def row_step():
        forward_batch(runtime, caches, [list(range(5, 5 + n)) for n in widths], [list(range(-1, n - 1)) for n in widths])
        for kv in caches:
            kv.commit([])  # drop the scored token: every repeat sees the same history

    if drafting is not None:
        split_ms = _median_ms(row_step, repeats)
        minimum = row_attention.SPLIT_MIN_PAIRS
        row_attention.SPLIT_MIN_PAIRS = 1 << 62  # one attention call of every row
        try:
            return split_ms, _median_ms(row_step, repeats)
        finally:
            row_attention.SPLIT_MIN_PAIRS = minimum

    history = DynamicCache()
    model(input_ids=torch.tensor([prompt[:context]] * rows), use_cache=True, **cache_kwargs(model, history))
    positions = torch.full((rows, 1), context)

    def padded_step():
        for layer in history.layers:  # drop what the last step appended
            layer.keys, layer.values = layer.keys[..., :context, :], layer.values[..., :context, :]
        model(input_ids=torch.tensor([[5]] * rows), position_ids=positions, use_cache=True,
              **cache_kwargs(model, history))

    return _median_ms(row_step, repeats), _median_ms(padded_step, repeats) if entries == 1 else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", help="hub id, local dir or .gguf (default: the embedded target)")
    parser.add_argument("--context", type=int, default=600)
    parser.add_argument("--rows", default="1,2,3,4,6,9,12")
    parser.add_argument("--entries", type=int, default=1, help="new tokens per row (a chain): a verification's size")
    parser.add_argument("--drafting", type=int, help="rows that score --entries tokens (the rest: one each)")
    parser.add_argument("--dtype", help="float32 (CPU default), bfloat16, float16")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--attention", default="gather", choices=ATTENTION_PATHS,
                        help="how batched forwards read the rows' history (model_runtime.py)")
    args = parser.parse_args()
    engine = Engine.from_pretrained(args.target, "lookup", dtype=args.dtype)  # the target alone: no draft model to load
    sizes = [int(r) for r in args.rows.split(",")]
    runtime = ModelRuntime(engine.target, args.attention)

    def run():
        return [measure(runtime, args.context, r, args.repeats, args.entries, args.drafting) for r in sizes]

    # on a CPU every forward runs on the engine's forward thread (forward_thread.py), as in a real run
    results = engine.on_forward_thread(run) if engine.forward_thread is not None else run()
    per_row = (f"{args.entries} new token(s) per row" if args.drafting is None else
               f"{args.entries} new tokens in {args.drafting} row(s), one in the others")
    print(f"{engine.target_name} ({engine.target.dtype}, attention={args.attention}), {args.context}-token history, "
          f"{per_row}, median of {args.repeats} (ms)")
    if args.drafting is not None:
        print("| rows | forward_batch (one-query rows apart) | forward_batch, one attention call | apart / one call |")
    else:
        print("| rows | forward_batch | padded (one attention call) | forward_batch / padded |")
    print("| --- | --- | --- | --- |")
    for r, (row_ms, padded_ms) in zip(sizes, results):
        padded = "- | -" if padded_ms is None else f"{padded_ms:.1f} | {row_ms / padded_ms:.2f}"
        print(f"| {r} | {row_ms:.1f} | {padded} |")


if __name__ == "__main__":
    main()
