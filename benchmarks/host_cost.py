"""Host cost of a decode step on a model whose arithmetic is negligible: the engine against
transformers' own batched `generate` (issue 40's CPU proxy for the GPU's host-bound step).

A tiny Llama (2 layers, hidden 64, vocab 8192, float32, random weights from a fixed seed) decodes
greedily (with `--temperature`, sampling) from `--prompt-len`-token prompts (different random tokens
per row, all one length, so no padding and no shared prefill). Each side runs the same batch twice,
for `--new-tokens` tokens and for one token; per-step time = (wall(N) - wall(1)) / (N - 1), which takes the prefill out. Medians
over `--repeats` after one untimed warm-up of each. Every forward runs on the engine's forward
thread (forward_thread.py says why), transformers' too, with `--threads` intra-op threads.

"torch ops per forward" counts the aten ops dispatched inside one decode-step forward of the target
(a TorchDispatchMode entered by forward hooks), for the engine and for transformers: host cost per
forward is roughly proportional to it, so a count that grows with rows is host cost that grows with rows.

Run it alone on the machine (other work on the cores changes every figure):
    python benchmarks/host_cost.py --rows 1,27 --repeats 11 --new-tokens 64 --modes parallel,seed --json host_cost.json
(fewer repeats or tokens cannot resolve 10% on a busy 2-core machine)
"""
from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import LlamaConfig, LlamaForCausalLM

from seed_tot.engine import Engine, SamplingParams

log = logging.getLogger("host_cost")

ENGINE_MODES = ("parallel", "seed")


def tiny_llama(layers: int, vocab: int, seed: int) -> LlamaForCausalLM:
    """The proxy model: random float32 weights, no EOS (every row decodes every requested token)."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         eos_token_id=None, bos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0  # generate asks for one with a batch; no row ever pads
    return model


class _OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


class ForwardOps:
    """Counts the aten ops of each forward of `model` while installed: (query tokens, ops) per forward."""

    def __init__(self, model):
        self.model, self.forwards, self._modes, self._handles = model, [], [], []

    def __enter__(self) -> "ForwardOps":
        self._handles = [self.model.register_forward_pre_hook(self._pre, with_kwargs=True),
                         self.model.register_forward_hook(self._post, with_kwargs=True)]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()

    def _pre(self, module, args, kwargs):
        counter = _OpCounter()
        counter.__enter__()  # on the thread that runs the forward: dispatch modes are per thread
        self._modes.append(counter)

    def _post(self, module, args, kwargs, output):
        counter = self._modes.pop()
        counter.__exit__(None, None, None)
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.forwards.append((int(ids.numel()) if ids is not None else -1, counter.ops))

    def decode_ops(self, rows: int) -> int | None:
        """Ops of the last forward that scored one token per row (a decode step of the whole batch)."""
        return next((ops for tokens, ops in reversed(self.forwards) if tokens == rows), None)


def _prompts(rows: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(1, vocab, (rows, length), generator=gen).tolist()


def _hf_generate(model, prompts: list[list[int]], new_tokens: int, temperature: float = 0.0) -> None:
    ids = torch.tensor(prompts)
    sampling = dict(do_sample=True, temperature=temperature, top_k=0) if temperature else dict(do_sample=False)
    with torch.inference_mode():
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                       min_new_tokens=new_tokens, use_cache=True, **sampling)


def _engine_generate(engine: Engine, mode: str, prompts: list[list[int]], new_tokens: int,
                     temperature: float = 0.0, policy_name: str = "fixed") -> None:
    engine.clear_prefix_cache(keep=False)  # a repeat must score its prompts again, as the first run did
    # seed with fixed chains: its default on a CPU, auto, declines the draft on these models and would
    # time parallel's step, not the drafting path
    policy = {"draft_policy": policy_name} if mode == "seed" else {}
    engine.generate(prompts, SamplingParams(max_new_tokens=new_tokens, temperature=temperature), mode=mode, **policy)


def per_step_ms(run, new_tokens: int, repeats: int) -> float:
    """Median over repeats of (wall(new_tokens) - wall(1)) / (new_tokens - 1), after one warm-up of each."""
    run(new_tokens), run(1)
    steps = []
    for _ in range(repeats):
        walls = []
        for n in (new_tokens, 1):
            start = time.perf_counter()
            run(n)
            walls.append(time.perf_counter() - start)
        steps.append((walls[0] - walls[1]) / (new_tokens - 1))
    return 1e3 * statistics.median(steps)


def measure_rows(engine: Engine, rows: int, args) -> dict:
    """One table row: per-step ms of transformers and of each engine mode, and ops per decode forward."""
    prompts = _prompts(rows, args.prompt_len, args.vocab, args.seed + rows)
    model = engine.target
    on_thread = engine.on_forward_thread
    result: dict = {"rows": rows}
    t = args.temperature
    result["transformers_ms"] = on_thread(per_step_ms, lambda n: _hf_generate(model, prompts, n, t),
                                          args.new_tokens, args.repeats)
    for mode in args.modes:
        result[f"{mode}_ms"] = per_step_ms(lambda n, m=mode: _engine_generate(engine, m, prompts, n, t, args.policy),
                                           args.new_tokens, args.repeats)
    # counted apart from the timed runs: the dispatch mode itself costs host time
    with ForwardOps(model) as counted:
        on_thread(_hf_generate, model, prompts, 3, t)
    result["transformers_ops"] = counted.decode_ops(rows)
    with ForwardOps(model) as counted:
        _engine_generate(engine, args.modes[0], prompts, 3, t)
    result["engine_ops"] = counted.decode_ops(rows)
    result["ratio"] = result[f"{args.modes[0]}_ms"] / result["transformers_ms"]
    return result


def table_header(modes: list[str]) -> str:
    extra = "".join(f" {m} ms/token |" for m in modes[1:])  # a seed step can emit several tokens
    return (f"| rows | transformers ms/step | engine ({modes[0]}) ms/step | ratio |{extra} "
            f"torch ops per forward (engine / transformers) |\n|{' --- |' * (5 + len(modes) - 1)}")


def table_row(r: dict, modes: list[str]) -> str:
    def ops(n):
        return "-" if n is None else str(n)
    extra = "".join(f" {r[f'{m}_ms']:.2f} |" for m in modes[1:])
    return (f"| {r['rows']} | {r['transformers_ms']:.2f} | {r[f'{modes[0]}_ms']:.2f} | {r['ratio']:.2f}x |{extra} "
            f"{ops(r['engine_ops'])} / {ops(r['transformers_ops'])} |")


def build_engine(args) -> Engine:
    target = tiny_llama(args.layers, args.vocab, args.seed)
    draft = tiny_llama(1, args.vocab, args.seed + 1) if "seed" in args.modes else None
    # no prefix store: each timed call scores its prompts, as transformers' generate does
    return Engine(target, draft, vocab_size=args.vocab, prefix_cache_entries=0)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1,27", help="comma-separated batch sizes")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompt-len", type=int, default=300)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--modes", default="parallel",
                        help=f"engine modes, comma separated, from {', '.join(ENGINE_MODES)}; the first is the "
                             f"ratio's and the op count's (seed adds a 1-layer random draft)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="0: greedy; else both sides sample at it (no top-k/top-p)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policy", default="fixed",
                        help="seed's draft policy (fixed: the drafting path; suffix, choose: the text drafts' host cost)")
    parser.add_argument("--json", dest="json_file", help="write the rows and settings here")
    args = parser.parse_args(argv)
    args.rows = [int(r) for r in args.rows.split(",")]
    args.modes = [m.strip() for m in args.modes.split(",")]
    if any(m not in ENGINE_MODES for m in args.modes):
        parser.error(f"--modes takes {', '.join(ENGINE_MODES)}, got {','.join(args.modes)}")
    if args.new_tokens < 2:
        parser.error("--new-tokens must be at least 2 (per step = (wall(N) - wall(1)) / (N - 1))")
    return args


def main(argv=None) -> list[dict]:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    engine = build_engine(args)
    engine.pin_threads(args.threads)  # the figures are per thread count: not chosen by the machine's load
    print(f"tiny Llama ({args.layers} layers, hidden 64, vocab {args.vocab}, float32), {args.prompt_len}-token "
          f"prompts, {args.new_tokens} new tokens, {'temperature %g' % args.temperature if args.temperature else 'greedy'}, {args.threads} thread(s), median of {args.repeats}; "
          f"torch {torch.__version__}", flush=True)
    print(table_header(args.modes), flush=True)
    results = []
    for rows in args.rows:
        results.append(measure_rows(engine, rows, args))
        print(table_row(results[-1], args.modes), flush=True)
        if args.json_file:  # after every row: an interrupted run keeps what it measured
            settings = {k: v for k, v in vars(args).items() if k != "json_file"}
            Path(args.json_file).write_text(json.dumps({"settings": settings, "torch": torch.__version__,
                                                        "rows": results}, indent=2) + "\n", encoding="utf-8")
    return results


if __name__ == "__main__":
    main()
