"""Issue-2 table: every engine mode (and transformers' assisted generation) on GSM8K questions.

    python benchmarks/engine_modes.py --target DIR/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \
        --draft DIR/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf --data ../shared/data/gsm8k/test.jsonl -n 5

Greedy, 64 new tokens; one JSON line per (mode, question) on stdout, then a table on stderr.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time

import torch

from seed_tot import Engine, SamplingParams
from seed_tot.tasks.loading import load_records

MODES = [("ar", (1,)), ("sd", (1, 1, 1)), ("sd", (1, 1, 1, 1)), ("mcsd", (2, 2, 1)), ("mcsd", (4, 2, 1, 1)), ("seed", (1, 1, 1))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("-n", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    if args.threads:
        torch.set_num_threads(args.threads)
    engine = Engine.from_pretrained(args.target, args.draft)
    engine.pin_threads(args.threads)  # None: chosen by the machine's load (cpu_threads.py)
    questions = [r["question"] for r in load_records(args.data, required=("question",), limit=args.n)]
    prompts = [engine.render_prompt(q) for q in questions]
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0)
    rows: dict[str, dict] = {}
    ar_tokens: list[list[int]] = []
    for mode, k in MODES:
        name = f"{mode} {k}" if mode != "ar" else "ar"
        walls, acc, tpc, equal = [], [], [], []
        for i, p in enumerate(prompts):
            r = engine.generate([p], params, mode=mode, k_config=k)[0]
            if mode == "ar":
                ar_tokens.append(r.token_ids)
            walls.append(r.stats.wall_s)
            acc.append((r.stats.accepted, r.stats.draft_depth))
            tpc.append((r.stats.new_tokens, r.stats.target_forwards))
            equal.append(r.token_ids == ar_tokens[i])
            print(json.dumps({"mode": name, "question": i, "wall_s": r.stats.wall_s, "tokens": len(r.token_ids),
                              "stats": r.stats.to_dict(), "equal_to_ar": equal[-1]}), flush=True)
        rows[name] = {"wall_s": sum(walls), "acceptance": sum(a for a, _ in acc) / max(1, sum(d for _, d in acc)),
                      "tokens_per_target_forward": sum(t for t, _ in tpc) / sum(c for _, c in tpc), "equal": all(equal)}
    if not args.skip_hf:  # the peer to beat: transformers' assisted generation with the same draft
        walls, equal = [], []
        tok = engine.tokenizer
        for i, p in enumerate(prompts):
            ids = torch.tensor([tok(p, add_special_tokens=False)["input_ids"]])
            start = time.perf_counter()
            out = engine.target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=engine.draft,
                                         do_sample=False, max_new_tokens=args.max_new_tokens)
            walls.append(time.perf_counter() - start)
            new = out[0, ids.shape[1]:].tolist()
            equal.append(new == ar_tokens[i])
            print(json.dumps({"mode": "hf-assisted", "question": i, "wall_s": walls[-1], "tokens": len(new),
                              "equal_to_ar": equal[-1]}), flush=True)
        rows["hf assisted"] = {"wall_s": sum(walls), "acceptance": float("nan"), "tokens_per_target_forward": float("nan"),
                               "equal": all(equal)}
    ar = rows["ar"]["wall_s"]
    print(f"{'mode':18} {'wall s':>8} {'vs ar':>6} {'accept':>7} {'tok/call':>8} tokens==ar", file=sys.stderr)
    for name, row in rows.items():
        print(f"{name:18} {row['wall_s']:8.1f} {ar / row['wall_s']:6.2f} {row['acceptance']:7.3f} "
              f"{row['tokens_per_target_forward']:8.2f} {'yes' if row['equal'] else 'NO'}", file=sys.stderr)
    print(json.dumps({"summary": rows}), flush=True)


if __name__ == "__main__":
    main()
