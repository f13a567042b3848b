"""A real model's forward on the CPU with its linear layers run by torch's `F.linear` (stock) and by
oneDNN (seed_tot/engine/cpu_linear.py), alternating in one process, per number of query tokens.

What it shows: how a forward's cost grows with the tokens it carries, which is what speculation
buys (a verification adds tokens to a forward) and what the engine's cost model calibrates.
Each forward scores `tokens` new tokens with no cached context (the linear layers are the cost
being compared; attention over a context is the same for both kernels).

    python benchmarks/cpu_linear.py --model /root/.cache/seed-tot/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from torch import nn

from seed_tot.engine.cpu_linear import OneDnnLinear, use_onednn_linears
from seed_tot.engine.models import default_target, load_model


def set_kernel(model: nn.Module, kernel: str) -> None:
    if kernel == "onednn":
        use_onednn_linears(model)
    else:
        for module in model.modules():
            if type(module) is OneDnnLinear:
                module.__class__ = nn.Linear


@torch.inference_mode()
def time_forward(model: nn.Module, tokens: int, vocab: int) -> float:
    ids = torch.randint(0, vocab, (1, tokens), generator=torch.Generator().manual_seed(tokens))
    start = time.perf_counter()
    model(ids, use_cache=False)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="Hub id, local directory or .gguf (default: the embedded model)")
    parser.add_argument("--tokens", default="1,2,4,9,18,27", help="query tokens per forward, comma-separated")
    parser.add_argument("--repeats", type=int, default=5, help="timed forwards per kernel and size (median)")
    parser.add_argument("--json", default=None, help="write the table here")
    args = parser.parse_args()
    name = args.model or default_target()
    model = load_model(name, torch.device("cpu"), torch.float32)
    vocab = model.config.vocab_size
    sizes = [int(n) for n in args.tokens.split(",")]
    times: dict[str, dict[int, list[float]]] = {k: {n: [] for n in sizes} for k in ("stock", "onednn")}
    for kernel in times:  # warm-up: first-call allocations and oneDNN's primitive cache
        set_kernel(model, kernel)
        for n in sizes:
            time_forward(model, n, vocab)
    for _ in range(args.repeats):
        for n in sizes:
            for kernel in times:  # alternating, so that a drift of the machine reaches both alike
                set_kernel(model, kernel)
                times[kernel][n].append(time_forward(model, n, vocab))
    rows = []
    print(f"{name}: ms per forward, median of {args.repeats}")
    print("| tokens | stock ms | oneDNN ms | stock / oneDNN | stock x 1 token | oneDNN x 1 token |")
    print("| --- | --- | --- | --- | --- | --- |")
    one = {k: statistics.median(times[k][sizes[0]]) for k in times}
    for n in sizes:
        stock, fast = (statistics.median(times[k][n]) for k in ("stock", "onednn"))
        rows.append({"tokens": n, "stock_ms": stock * 1e3, "onednn_ms": fast * 1e3})
        print(f"| {n} | {stock * 1e3:.1f} | {fast * 1e3:.1f} | {stock / fast:.2f} | {stock / one['stock']:.2f} "
              f"| {fast / one['onednn']:.2f} |")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"model": name, "repeats": args.repeats, "threads": torch.get_num_threads(), "rows": rows}, f,
                      indent=1)


if __name__ == "__main__":
    main()
