"""Where `sd`'s time goes beside `ar` on a host-bound model (issue 40 item 4: on a GPU the tiny
preset's `sd` cost 11x `ar`, on a CPU 1.7x), in one short run.

The tiny synthetic preset (seed_tot/synthetic.py), greedy, `--prompts` prompts of
`--prompt-len` tokens, `--tokens` new tokens each, warm (one untimed call per mode first), medians
of `--repeats`. It times ar and sd
  - with distinct prompts (every forward is a single row's: the model's own attention, SDPA with a
    materialized mask whenever a forward scores more than one token after a cache), and with copies
    of one prompt (forked caches: every forward takes forward_batch's row attention, no SDPA);
  - with each SDPA backend setting in `--sdpa` (CUDA only: default, no-cudnn, efficient, math),
    since the backend torch picks for a masked multi-token query can differ from a one-token one;
then profiles one sd call and one ar call (torch.profiler, CPU and CUDA) and prints the host-side
operations that take the most time per generated token, host syncs among them.

    python benchmarks/sd_probe.py --device cuda --trace sd-probe    # about a minute on a GPU
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import statistics
import time

import torch

from seed_tot.engine import SamplingParams
from seed_tot.synthetic import build_synthetic_engine

log = logging.getLogger("sd_probe")

SDPA_SETTINGS = ("default", "no-cudnn", "efficient", "math")
SYNC_OPS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpyAsync", "cudaEventSynchronize",
            "aten::item", "aten::_local_scalar_dense")


def sdpa_setting(name: str, device: torch.device):
    """A context that restricts torch's SDPA backends (nothing to restrict on a CPU or for default)."""
    if device.type != "cuda" or name == "default":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backends = {"no-cudnn": [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH],
                "efficient": [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH],
                "math": [SDPBackend.MATH]}[name]
    return sdpa_kernel(backends)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(engine, prompts, params, mode: str, repeats: int) -> float:
    device = engine.target.device
    engine.generate(prompts, params, mode=mode)  # warm-up: kernels, allocator, plans
    walls = []
    for _ in range(repeats):
        engine.clear_prefix_cache()
        _sync(device)
        start = time.perf_counter()
        engine.generate(prompts, params, mode=mode)
        _sync(device)
        walls.append(time.perf_counter() - start)
    return statistics.median(walls)


def profile(engine, prompts, params, mode: str, tokens: int, top: int, trace: str | None) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if engine.target.device.type == "cuda" else [])
    engine.clear_prefix_cache()

    def run():
        with torch_profile(activities=activities) as prof:
            engine.generate(prompts, params, mode=mode)
            _sync(engine.target.device)
        return prof

    # where the forwards run (a CPU engine's forward thread): the profiler records its own thread's ops
    prof = engine.on_forward_thread(run)
    if trace:
        prof.export_chrome_trace(f"{trace}-{mode}.json")
    events = prof.key_averages()
    print(f"\n{mode}: host time by operation, per generated token ({tokens} tokens), top {top} by self CPU time")
    print("| operation | calls per token | self CPU us per token |\n| --- | --- | --- |")
    for e in sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]:
        print(f"| {e.key} | {e.count / tokens:.1f} | {e.self_cpu_time_total / tokens:.0f} |")
    syncs = {e.key: e.count for e in events if e.key in SYNC_OPS}
    print(f"{mode}: host syncs and copies per token: "
          + (", ".join(f"{k} {v / tokens:.1f}" for k, v in sorted(syncs.items())) or "none recorded"))


def main(argv=None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--alpha", type=float, default=0.8)
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--prompt-len", type=int, default=120)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sdpa", default=",".join(SDPA_SETTINGS), help=f"comma separated, from {', '.join(SDPA_SETTINGS)}")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--trace", help="write each profile's Chrome trace to TRACE-MODE.json")
    args = parser.parse_args(argv)
    engine = build_synthetic_engine(args.preset, args.alpha, args.device)
    device = engine.target.device
    vocab = engine.vocab_size
    gen = torch.Generator().manual_seed(0)
    distinct = torch.randint(1, vocab, (args.prompts, args.prompt_len), generator=gen).tolist()
    workloads = {"distinct prompts": distinct, "copies of one prompt": [distinct[0]] * args.prompts}
    params = SamplingParams(max_new_tokens=args.tokens, temperature=0)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"synthetic {args.preset} on {name} ({engine.target.dtype}), alpha {args.alpha:g}, {args.prompts} prompts "
          f"x {args.prompt_len} tokens, {args.tokens} new tokens, greedy, warm, median of {args.repeats}")
    print("| prompts | SDPA backends | ar s | sd s | sd / ar |\n| --- | --- | --- | --- | --- |")
    settings = [s.strip() for s in args.sdpa.split(",")] if device.type == "cuda" else ["default"]
    for label, prompts in workloads.items():
        for setting in settings:
            with sdpa_setting(setting, device):
                ar = timed(engine, prompts, params, "ar", args.repeats)
                sd = timed(engine, prompts, params, "sd", args.repeats)
            print(f"| {label} | {setting} | {ar:.3f} | {sd:.3f} | {sd / ar:.2f}x |", flush=True)
    total = args.prompts * args.tokens
    for mode in ("sd", "ar"):
        profile(engine, distinct, params, mode, total, args.top, args.trace)


if __name__ == "__main__":
    main()
