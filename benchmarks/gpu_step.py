"""Where a decode step's time goes on a GPU (issue 40): the probes behind the journal's first GPU table.

    python benchmarks/gpu_step.py table --models 7b
        the step table: per bucket (1, 8, 32 rows; 1 and 4 query entries per row) the step eagerly at
        its exact size, graphed (the bucketed forward replayed as a CUDA graph) and compiled (the same,
        its kernels compiled by inductor: engine/compiled_forward.py), each as the share of the
        bandwidth floor (the weights' bytes read once at the device's bandwidth), and each bucket's
        compile time; one JSON line per figure as it is measured, every eager and graphed figure
        before the first compile. Runs on a CPU too (graphed and
        compiled then run the bucketed forward eagerly), as the smoke test of the script
    python benchmarks/gpu_step.py graphs --models tiny,160m,1.1b,7b
        per model size and row count: one batched decode step (and a 4-entry tree step) eagerly at
        its exact size against the bucketed forward replayed as a CUDA graph, median of the steps,
        and whether both give the same tokens (the graphed times price a pair for
        benchmarks/speculation_ceiling.py --points); --attention gather,pool times both attention
        paths (model_runtime.py) on one model
    python benchmarks/gpu_step.py profile --preset llama2-7b+llama-160m --rows 9
        the engine on a synthetic pair: ms per step of `parallel` and `seed`; a cProfile of the step
        thread over 32 `parallel` steps (the one `.tolist()` a step waits in is the device's time);
        the CUDA kernels of the same forwards run eagerly at their fixed shapes, by total time

Random weights of the real shapes, bf16 (fp32 for `tiny`); prints each result as it comes. Needs CUDA
(`table` and `profile` also run on a CPU, as smoke tests of the script; `profile` without the kernel table).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import time

import torch
import transformers as tf

from seed_tot.engine import SamplingParams, graphed_forward
from seed_tot.engine.compiled_forward import CompileSettings
from seed_tot.engine.kv_cache import KVCache, forward_batch
from seed_tot.engine.model_runtime import ModelRuntime
from seed_tot.synthetic import build_synthetic_engine

SHAPES = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=8192),
    "160m": dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                 num_key_value_heads=12, vocab_size=32000),  # the synthetic preset's draft
    "1.1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                 num_key_value_heads=4, vocab_size=32000),
    "7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=32, vocab_size=32000),
}
TREE = ([10, 11, 12, 13], [-1, 0, 0, 2])  # a 4-entry draft tree: root, two children, a grandchild


# Peak memory bandwidth (bytes/s) by device name, from the vendors' data sheets; the first entry whose
# words all appear in torch.cuda.get_device_name() wins (more specific names first). A device not
# listed is priced by a measured device-to-device copy instead (`bandwidth` says which).
PEAK_BANDWIDTH = [("H200", 4.8e12), ("H100 PCIe", 2.0e12), ("H100 NVL", 3.9e12), ("H100", 3.35e12),
                  ("GH200", 4.0e12), ("A100 PCIe 40GB", 1.555e12), ("A100 SXM4 40GB", 1.555e12),
                  ("A100 PCIe", 1.935e12), ("A100", 2.039e12), ("L40S", 0.864e12), ("L4", 0.3e12),
                  ("A10G", 0.6e12), ("A10", 0.6e12), ("RTX 4090", 1.008e12), ("B200", 8.0e12)]


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _model(name: str):
    torch.manual_seed(0)
    config = tf.LlamaConfig(**SHAPES[name], max_position_embeddings=4096, bos_token_id=None, eos_token_id=None,
                            pad_token_id=None)
    config._attn_implementation = "sdpa"
    with torch.device(_device()):
        return tf.LlamaForCausalLM(config).to(torch.float32 if name == "tiny" else torch.bfloat16).eval()


def _rows(runtime: ModelRuntime, n_rows: int) -> list[KVCache]:
    rows = []
    for r in range(n_rows):  # prompts of 100+ tokens, each row its own length
        tokens = [(7 * i + r) % 1000 + 1 for i in range(100 + r)]
        kv = KVCache()
        forward_batch(runtime, [kv], [tokens], [list(range(-1, len(tokens) - 1))], fixed_shapes=False)
        kv.commit(list(range(len(tokens))))
        rows.append(kv)
    return rows


@torch.inference_mode()
def _steps(runtime: ModelRuntime, n_rows: int, fixed, tree: bool, steps: int = 24, warm: int = 4
           ) -> tuple[float, list]:
    """Median ms of a step (the argmax's transfer included: the step's one sync) and the tokens."""
    rows = _rows(runtime, n_rows)
    last, times, out = [5 + r for r in range(n_rows)], [], []
    for s in range(warm + steps):
        caches = [kv.fork() for kv in rows] if tree else rows
        _sync()
        start = time.perf_counter()
        if tree:
            logits = forward_batch(runtime, caches, [TREE[0]] * n_rows, [TREE[1]] * n_rows, fixed_shapes=fixed)
            out = torch.stack([lg.argmax(-1) for lg in logits]).tolist()
        else:
            logits = forward_batch(runtime, caches, [[t] for t in last], [[-1]] * n_rows, fixed_shapes=fixed)
            last = torch.stack([lg[-1] for lg in logits]).argmax(-1).tolist()
            out.append(last)
            for kv in rows:
                kv.commit([0])
        if s >= warm:
            times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times), out


def graphs(args) -> None:
    """Eager against fixed-shape steps per attention path, the forwards uncompiled (the step table times
    compiling): on CUDA the fixed shapes replay CUDA graphs; elsewhere they run eagerly (gpu.sh's smoke)."""
    device = _device()
    print(json.dumps(dict(device=torch.cuda.get_device_name() if device == "cuda" else "cpu", torch=torch.__version__,
                          transformers=tf.__version__)), flush=True)
    fixed = None if device == "cuda" else True  # off CUDA: the buckets run eagerly, when asked
    for name in args.models.split(","):
        model = _model(name)
        for attention in args.attention.split(","):  # model_runtime.ATTENTION_PATHS
            # one pool and one graph runner for both executions; FlexAttention compiled on CUDA (attention=pool)
            runtime = ModelRuntime(model, attention, compile=CompileSettings(enabled=False))
            for kind, row_counts in (("decode", args.rows), ("tree4", [r for r in args.rows if r <= 8])):
                for n_rows in row_counts:
                    eager_ms, eager_out = _steps(runtime, n_rows, False, kind == "tree4")
                    graph_ms, graph_out = _steps(runtime, n_rows, fixed, kind == "tree4")
                    print(json.dumps(dict(model=name, attention=attention, kind=kind, rows=n_rows,
                                          eager_ms=round(eager_ms, 3), graphed_ms=round(graph_ms, 3),
                                          same_tokens=eager_out == graph_out)), flush=True)
            del runtime
            if device == "cuda":
                torch.cuda.empty_cache()
        del model


def bandwidth() -> tuple[float, str]:
    """The device's memory bandwidth in bytes/s and where it comes from: the peak table by the CUDA
    device's name, else a measured copy (a 1 GiB device-to-device copy on CUDA, 256 MiB on the CPU:
    each byte read once and written once)."""
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        for words, peak in PEAK_BANDWIDTH:
            if all(w in name for w in words.split()):
                return peak, f"peak of {words} (data sheet)"
    n = (1 << 30) if torch.cuda.is_available() else (1 << 28)
    src = torch.empty(n, dtype=torch.uint8, device=_device())
    dst = torch.empty_like(src)
    times = []
    for _ in range(5):
        _sync()
        start = time.perf_counter()
        dst.copy_(src)
        _sync()
        times.append(time.perf_counter() - start)
    return 2 * n / min(times), "measured copy"


def table(args) -> None:
    """The step table (see the module doc): one JSON line per measured figure, as it comes."""
    device = _device()
    peak, source = bandwidth()
    print(json.dumps(dict(device=torch.cuda.get_device_name() if device == "cuda" else "cpu", torch=torch.__version__,
                          transformers=tf.__version__, bandwidth_gb_s=round(peak / 1e9, 1), bandwidth_source=source)),
          flush=True)
    for name in args.models.split(","):
        model = _model(name)
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        floor_ms = 1e3 * weights / peak
        # one runtime per way of running the bucketed forward: each keeps its own runner (and pool)
        plain = ModelRuntime(model, compile=CompileSettings(enabled=False))
        compiled = ModelRuntime(model, compile=CompileSettings(enabled=True, mode=args.compile_mode))
        print(json.dumps(dict(model=name, weights_gb=round(weights / 1e9, 3), floor_ms=round(floor_ms, 3))), flush=True)
        fixed = None if device == "cuda" else True  # off CUDA: the buckets run eagerly, when asked
        # eager and graphed for every bucket first (seconds), then the compiled step bucket by bucket
        # (a compile each, the decode buckets first): a time cap that cuts the table cuts compiles only
        buckets = [(n_rows, width) for width in args.widths for n_rows in args.rows]
        eager_tokens = {}
        for way, runtime, fixed_shapes in (("eager", plain, False), ("graphed", plain, fixed), ("compiled", compiled, fixed)):
            for n_rows, width in buckets:
                before = dict(runtime.graph_runner().compiled.compile_seconds) if way == "compiled" else {}
                ms, tokens = _steps(runtime, n_rows, fixed_shapes, width == len(TREE[0]), args.steps)
                line = dict(model=name, rows=n_rows, width=width, way=way, ms=round(ms, 3),
                            floor_share=round(floor_ms / ms, 3))
                if way == "eager":
                    eager_tokens[n_rows, width] = tokens
                else:
                    line.update(same_tokens=tokens == eager_tokens[n_rows, width])
                if way == "compiled":  # the buckets this figure compiled (prefills stay uncompiled)
                    runner = runtime.graphed.compiled
                    line.update(compile_s={"x".join(map(str, s)): round(t, 2)
                                           for s, t in runner.compile_seconds.items() if s not in before},
                                fell_back=runner.failures)
                print(json.dumps(line), flush=True)
        del plain, compiled, model
        if device == "cuda":
            torch.cuda.empty_cache()


def profile(args) -> None:
    cuda = torch.cuda.is_available()
    engine = build_synthetic_engine(args.preset, 0.4, "cuda" if cuda else "cpu")
    prompts = torch.randint(5, 1000, (args.rows, args.prompt_len), generator=torch.Generator().manual_seed(0)).tolist()
    if cuda:  # the kernel table wants every kernel visible: the fixed shapes run eagerly, never captured
        def refuse(*_args, **_kwargs):
            raise RuntimeError("profiling the fixed-shape forward eagerly")
        kernels = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
    for mode in ("parallel", "seed"):
        engine.generate(prompts, SamplingParams(max_new_tokens=16, temperature=0), mode=mode)  # captures
        walls = []
        for n in (32, 1):
            start = time.perf_counter()
            engine.generate(prompts, SamplingParams(max_new_tokens=n, temperature=0), mode=mode)
            walls.append(time.perf_counter() - start)
        print(f"{mode}: {1e3 * (walls[0] - walls[1]) / 31:.2f} ms per step ({args.rows} rows, "
              f"(wall(32) - wall(1)) / 31)", flush=True)
    profiler = cProfile.Profile()
    engine.scheduler.executor.call(profiler.enable)
    engine.generate(prompts, SamplingParams(max_new_tokens=32, temperature=0), mode="parallel")
    engine.scheduler.executor.call(profiler.disable)
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
    print(text.getvalue(), flush=True)
    if cuda:
        eager = build_synthetic_engine(args.preset, 0.4, "cuda")
        graphed_forward.GraphedForward._capture = refuse
        params = SamplingParams(max_new_tokens=8, temperature=0)
        eager.generate(prompts, params, mode="parallel")  # warm-up, eagerly
        torch.cuda.synchronize()
        with kernels:
            eager.generate(prompts, params, mode="parallel")
            torch.cuda.synchronize()
        print(kernels.key_averages().table(sort_by="cuda_time_total", row_limit=22, max_name_column_width=70))


def _ints(text: str) -> tuple[int, ...]:
    values = tuple(int(v) for v in text.split(","))
    if any(v < 1 for v in values) or not values:
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, got {text!r}")
    return values


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="probe", required=True)
    g = sub.add_parser("graphs", help="eager vs CUDA-graph steps per model size")
    g.add_argument("--models", default="tiny,1.1b,7b", help=f"comma-separated, from {', '.join(SHAPES)}")
    g.add_argument("--attention", default="gather",
                   help="comma-separated attention paths to time, from gather, pool (model_runtime.py)")
    g.add_argument("--rows", type=_ints, default=(1, 8, 32), help="row counts, comma-separated (tree steps: <= 8)")
    t = sub.add_parser("table", help="eager, graphed and compiled steps per bucket against the bandwidth floor")
    t.add_argument("--models", default="7b", help=f"comma-separated, from {', '.join(SHAPES)}")
    t.add_argument("--rows", type=_ints, default=(1, 8, 32), help="row counts, comma-separated")
    t.add_argument("--widths", type=_ints, default=(1, 4), help="query entries per row: 1 (decode), 4 (a tree)")
    t.add_argument("--steps", type=int, default=24, help="timed steps per figure (the median is printed)")
    t.add_argument("--compile-mode", default="default", help="inductor's mode (compiled_forward.MODES)")
    p = sub.add_parser("profile", help="the engine's step: timing, host profile, kernel table")
    p.add_argument("--preset", default="llama2-7b+llama-160m")
    p.add_argument("--rows", type=int, default=9)
    p.add_argument("--prompt-len", type=int, default=200)
    args = parser.parse_args(argv)
    if args.probe == "table" and set(args.widths) - {1, len(TREE[0])}:
        parser.error(f"--widths: 1 (a decode step) and {len(TREE[0])} (the probe's tree) only")
    {"graphs": graphs, "table": table, "profile": profile}[args.probe](args)


if __name__ == "__main__":
    main()
