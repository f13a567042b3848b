"""Latency model: PipeDec vs plain pipeline parallelism (PP) vs static-tree SD through the pipeline (STPP).

Inputs are measured, not assumed:
  layer_1, layer_w   one target decoder layer's forward at 1 and at w new tokens (over a KV prefix)
  draft_w            one draft forward at w new tokens
  comm               one activation hop between stage processes (gloo point-to-point + header)
  hit rate h, STPP tokens per round: from a counting run (`seed-tot generate --mode pipedec/stpp --json`)
A target of L layers split in N stages gives (every stage steps in lockstep, one tick at a time):
  PP      per token: N hops of (L/N) layers at width 1       = L*layer_1 + N*comm
  PipeDec per tick: max(draft_w, (L/N)*layer_w) + comm;  ticks per token = h + (1 - h) * N
          (a hit costs one tick, a miss refills the pipeline: N ticks)
  STPP    per round: D draft forwards + N hops at the tree's width; tokens per round from the run
Measuring (`--measure PRESET`) builds random-weight models of real shapes (seed_tot.synthetic):
run it where timings mean something; on a 2-core shared CPU only the tiny preset, as a smoke test.

  python benchmarks/pipedec_model.py --measure tiny --width 4 --hit-rate 0.6 --stpp-tokens 2.4 --json
"""
from __future__ import annotations

import argparse
import json
import logging
import time

import torch

from seed_tot.synthetic import PRESETS, build_model

log = logging.getLogger("pipedec_model")
PAPER = {"pipedec_over_pp": (4.46, 7.79), "pipedec_over_stpp": (2.2, 2.69)}  # Llama-3.1-70B, 14 stages


def _time(fn, repeats: int) -> float:
    fn()  # warm-up
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


@torch.inference_mode()
def layer_cost(model, width: int, prefix: int, repeats: int) -> float:
    """Seconds for one decoder layer over `width` new tokens that see a `prefix`-token KV cache."""
    from transformers import DynamicCache

    from seed_tot.engine.cache_argument import cache_kwargs
    from seed_tot.engine.masks import AttentionLayout
    from seed_tot.engine.pipeline.stages import tree_mask
    layer, rotary = model.model.layers[0], model.model.rotary_emb
    layout = AttentionLayout.of(model)
    dtype, device, hidden = model.dtype, model.device, model.config.hidden_size
    cache = DynamicCache()
    past = torch.randn(1, prefix, hidden, dtype=dtype, device=device)
    pos, mask = tree_mask(layout, 0, [i - 1 for i in range(prefix)], 0, dtype, device)
    layer(past, attention_mask=mask, position_ids=pos, use_cache=True,
          position_embeddings=rotary(past, position_ids=pos), **cache_kwargs(layer, cache))
    x = torch.randn(1, width, hidden, dtype=dtype, device=device)
    pos, mask = tree_mask(layout, prefix, [-1] * width, 0, dtype, device)
    emb = rotary(x, position_ids=pos)

    def step():
        layer(x, attention_mask=mask, position_ids=pos, use_cache=True, position_embeddings=emb, **cache_kwargs(layer, cache))
        for cache_layer in cache.layers:  # drop what this step appended: every repeat sees the same prefix
            if cache_layer.keys is not None and cache_layer.keys.shape[-2] > prefix:
                cache_layer.keys, cache_layer.values = cache_layer.keys[..., :prefix, :], cache_layer.values[..., :prefix, :]
    return _time(step, repeats)


def measure(preset: str, width: int, prefix: int, repeats: int) -> dict:
    target_spec, draft_spec = PRESETS[preset]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    target = build_model(target_spec, device, dtype)
    draft = build_model(draft_spec, device, dtype, seed=1)
    draft_layers = draft.config.num_hidden_layers
    return dict(preset=preset, layers=target.config.num_hidden_layers, width=width, prefix=prefix,
                layer_1=layer_cost(target, 1, prefix, repeats), layer_w=layer_cost(target, width, prefix, repeats),
                draft_w=draft_layers * layer_cost(draft, width, prefix, repeats),
                hidden=target.config.hidden_size)


def predict(costs: dict, comm: float, hit_rate: float, stpp_tokens: float, stpp_depth: int, stages: list[int]) -> list[dict]:
    rows = []
    layers = costs["layers"]
    for n in stages:
        if n > layers:
            log.warning("skipping %d stages: the target has only %d layers", n, layers)
            continue
        per_stage = -(-layers // n)  # the slowest stage holds ceil(L/N) layers
        pp = n * (per_stage * costs["layer_1"] + comm)
        tick = max(costs["draft_w"], per_stage * costs["layer_w"]) + comm
        pipedec = tick * (hit_rate + (1 - hit_rate) * n)
        stpp = (stpp_depth * costs["draft_w"] + n * (per_stage * costs["layer_w"] + comm)) / stpp_tokens
        rows.append(dict(stages=n, pp_s_per_token=pp, stpp_s_per_token=stpp, pipedec_s_per_token=pipedec,
                         pipedec_over_pp=pp / pipedec, pipedec_over_stpp=stpp / pipedec))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--measure", choices=list(PRESETS), help="measure layer/draft costs on random models of this preset")
    ap.add_argument("--costs", help="JSON file with layers, layer_1, layer_w, draft_w (instead of --measure)")
    ap.add_argument("--width", type=int, default=4)
    ap.add_argument("--prefix", type=int, default=256, help="KV prefix length the costs are measured at")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--comm-s", type=float, default=None, help="seconds per activation hop (default: measured gloo hop)")
    ap.add_argument("--hit-rate", type=float, required=True, help="PipeDec hit rate from a counting run")
    ap.add_argument("--stpp-tokens", type=float, required=True, help="STPP tokens per round from a counting run")
    ap.add_argument("--stpp-depth", type=int, default=3)
    ap.add_argument("--stages", default="2,4,7,14")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO)
    if args.measure:
        costs = measure(args.measure, args.width, args.prefix, args.repeats)
    elif args.costs:
        with open(args.costs, encoding="utf-8") as fh:
            costs = json.load(fh)
    else:
        ap.error("give --measure PRESET or --costs FILE")
    comm = args.comm_s if args.comm_s is not None else gloo_hop_seconds(costs.get("hidden", 1024) * args.width)
    rows = predict(costs, comm, args.hit_rate, args.stpp_tokens, args.stpp_depth,
                   [int(s) for s in args.stages.split(",")])
    report = dict(costs=costs, comm_s=comm, hit_rate=args.hit_rate, stpp_tokens=args.stpp_tokens, rows=rows, paper=PAPER)
    if args.json:
        print(json.dumps(report, indent=2))  # noqa: T201 - the script's output
        return
    print(f"costs {costs}  comm {comm * 1e6:.0f} us")  # noqa: T201
    print("stages  PP s/tok  STPP s/tok  PipeDec s/tok  PipeDec/PP  PipeDec/STPP")  # noqa: T201
    for r in rows:
        print(f"{r['stages']:6d}  {r['pp_s_per_token']:.4f}  {r['stpp_s_per_token']:.4f}  "  # noqa: T201
              f"{r['pipedec_s_per_token']:.4f}  {r['pipedec_over_pp']:.2f}x  {r['pipedec_over_stpp']:.2f}x")
    print(f"paper (70B, 14 stages): PipeDec/PP {PAPER['pipedec_over_pp']}, PipeDec/STPP {PAPER['pipedec_over_stpp']}")  # noqa: T201


def _hop_worker(rank: int, port: int, numel: int, repeats: int, out) -> None:
    import os
    from datetime import timedelta

    import torch.distributed as dist
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=60))
    x = torch.zeros(numel)
    header = torch.zeros(1, dtype=torch.long)
    start = time.perf_counter()
    for _ in range(repeats):
        if rank == 0:
            dist.send(header, 1)
            dist.send(x, 1)
            dist.recv(header, 1)
        else:
            dist.recv(header, 0)
            dist.recv(x, 0)
            dist.send(header, 0)
    if rank == 0:
        out.put((time.perf_counter() - start) / repeats)
    dist.destroy_process_group()


def gloo_hop_seconds(numel: int, repeats: int = 50) -> float:
    """One measured hop: a header plus `numel` floats to another gloo process (timed as a round trip whose reply is the header alone)."""
    import torch.multiprocessing as mp

    from seed_tot.engine.pipeline.launcher import free_port
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    mp.start_processes(_hop_worker, args=(free_port(), numel, repeats, out), nprocs=2, start_method="spawn")
    return out.get()


if __name__ == "__main__":
    main()
