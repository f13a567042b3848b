"""How many query rows a forward should carry, measured on the running hardware.

A forward over n new entries runs every linear layer as an [n, d] x [d, d'] product, and what that
costs for small n is up to the BLAS. Some BLAS builds run a few rows as one matrix-vector pass per
row and switch to a matrix-matrix kernel only at 4 or more, so 3 rows can cost more than 4 and a
verification of a 2-token draft pays three weight passes where four padded rows need under two;
other CPUs show no such step (docs/benchmarks.md, "Figures behind the code's design choices"). So
nothing is assumed: once per model runtime, `ModelRuntime.padded_rows` has `measure_padding` time one of
the model's large products (`_probe_layer`) for 1..MAX_ROWS rows and map each n to the cheapest m >= n.

`KVCache.forward` and `forward_batch` then add m - n padding entries after the real ones and drop
them before anything reads the cache, so no real entry ever attends to one: output is unchanged.
GPUs (and small models, where the product is too cheap to matter) are never padded.
"""
from __future__ import annotations

import logging
import time

import torch
from torch import nn

log = logging.getLogger(__name__)

MAX_ROWS = 8  # beyond this every BLAS is in its matrix-matrix regime
MIN_PARAMS = 1_000_000  # smaller products cost microseconds: timing them is noise
MAX_PROBE_PARAMS = 64_000_000  # a larger product takes too long to time 8 x 6 times at load
GAIN = 0.85  # pad only when the padded product costs at most this share of the unpadded one
NEAR = 1.25  # fewer rows unless many more are clearly cheaper: attention and the rest grow with rows too


def _probe_layer(model) -> nn.Linear | None:
    """The largest linear layer that is quick to time: a small model's LM head (SmolLM2's is most of
    its forward), a large model's biggest hidden projection."""
    layers = [m for m in model.modules() if isinstance(m, nn.Linear) and m.weight.numel() <= MAX_PROBE_PARAMS]
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if isinstance(head, nn.Linear) and head.weight.numel() <= MAX_PROBE_PARAMS and head not in layers:
        layers.append(head)  # a tied or shared head need not be among the model's own modules
    return max(layers, key=lambda m: m.weight.numel(), default=None)


@torch.inference_mode()
def measure_padding(model, repeats: int = 7) -> dict[int, int]:
    """{n: m} for the n that run cheaper padded to m rows (empty: never pad)."""
    layer = _probe_layer(model)
    if layer is None or layer.weight.device.type != "cpu" or layer.weight.numel() < MIN_PARAMS:
        return {}
    cost = {}
    for rows in range(1, MAX_ROWS + 1):
        x = torch.randn(1, rows, layer.in_features, dtype=layer.weight.dtype)
        layer(x)  # warm-up: first-call allocations
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            layer(x)
            times.append(time.perf_counter() - start)
        cost[rows] = min(times)  # the kernel's own cost; slower repeats are the machine's noise
    table = choose_padding(cost)
    log.info("query rows for %s (%s x %s linear, ms per 1..%d rows: %s): pad %s", type(model).__name__,
             layer.out_features, layer.in_features, MAX_ROWS, " ".join(f"{cost[m] * 1e3:.2f}" for m in cost),
             ", ".join(f"{n}->{m}" for n, m in table.items()) or "nothing")
    return table


def choose_padding(cost: dict[int, float]) -> dict[int, int]:
    """{n: m} from measured costs per row count 1..MAX_ROWS: pad n to the fewest rows m >= n that cost
    within NEAR of the cheapest, where that saves at least 1 - GAIN of n's cost."""
    top = max(cost)
    table = {}
    for n in range(1, top):
        cheapest = min(cost[m] for m in range(n, top + 1))
        # the fewest rows within NEAR of the cheapest: timings of equal kernels differ by noise
        best = next(m for m in range(n, top + 1) if cost[m] <= NEAR * cheapest)
        if best != n and cost[best] <= GAIN * cost[n]:
            table[n] = best
    return table
