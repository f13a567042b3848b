"""Issue-11 table: draft policies vs ar and transformers' assisted generation on GSM8K questions.

    python benchmarks/draft_policies.py --target T.gguf --draft D.gguf --data ../shared/data/gsm8k/test.jsonl \
        -n 5 --head HEAD_DIR [--temperature 1 --top-k 50]

One JSON line per (setting, question) on stdout, then the table on stderr: wall s, x ar, x HF
assisted, tokens per target forward, draft forwards per token, identical tokens to ar (greedy),
SpecDec++'s Pareto axes N_target/N (target forwards per new token) and N_discarded/N (drafted
tokens the target rejected, per new token), and for opt-tree the mean E(A) beside the realized
tokens per round. With --head, `auto` also runs with the head ("auto+head").
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

log = logging.getLogger("draft_policies")


def settings(head: str | None) -> list[tuple[str, str, tuple[int, ...], str | None, dict]]:
    rows = [("ar", "ar", (1,), None, {})]
    rows += [(f"sd fixed k={k}", "sd", (1,) * k, None, {}) for k in (2, 3, 4, 5)]
    rows += [("mcsd k=2-2-1", "mcsd", (2, 2, 1), None, {})]
    rows += [(f"opt-tree n={n} delta={d}", "sd", (1,), "opt-tree", {"n": str(n), "delta": str(d)})
             for n in (4, 8, 16) for d in (0.2, 0.5)]
    if head:
        rows += [(f"specdec h={h}", "sd", (1,), "specdec", {"head": head, "h": str(h)}) for h in (0.3, 0.5, 0.7, 0.9)]
    rows += [("auto", "sd", (1,), "auto", {})]
    if head:
        rows += [("auto+head", "sd", (1,), "auto", {"head": head})]
    return rows


def hf_assisted(engine: Engine, prompts: list[str], params: SamplingParams) -> tuple[float, list[list[int]]]:
    tok, walls, outs = engine.tokenizer, 0.0, []
    for p in prompts:
        ids = tok(p, return_tensors="pt", add_special_tokens=False).input_ids.to(engine.target.device)
        kwargs = dict(do_sample=not params.greedy, max_new_tokens=params.max_new_tokens, assistant_model=engine.draft,
                      attention_mask=torch.ones_like(ids))
        if not params.greedy:
            kwargs.update(temperature=params.temperature, top_k=params.top_k or None, top_p=params.top_p)
        torch.manual_seed(params.seed)
        start = time.perf_counter()
        out = engine.target.generate(ids, **kwargs)
        walls += time.perf_counter() - start
        outs.append(out[0, ids.shape[1]:].tolist())
    return walls, outs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    ap.add_argument("--draft", default=None, help="default: the drafter shipped for the target, else its first layers (self: those layers by name)")
    ap.add_argument("--data", required=True)
    ap.add_argument("-n", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--head", default=None, help="specdec head directory (seed-tot train-head --out)")
    ap.add_argument("--only", default=None, help="comma-separated labels to run (e.g. 'ar,auto')")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--json", default=None, help="also write the table (and the settings) to this JSON file")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    engine = Engine.from_pretrained(args.target, args.draft)
    questions = [r["question"] for r in load_records(args.data, required=("question",), limit=args.n)]
    prompts = [engine.render_prompt(q) for q in questions]
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k)
    table, ar_tokens = [], None
    only = set(args.only.split(",")) if args.only else None
    for label, mode, k, policy, options in settings(args.head):
        if only and label not in only and label != "ar":
            continue
        if policy:  # built (auto: calibrated, specdec: head loaded) before the clock starts, once per setting
            engine.policy(mode, k, params, policy, options)
        wall, tokens, fwd, dfwd, new, records = 0.0, [], 0.0, 0.0, 0, []
        drafted = accepted = 0
        for i, p in enumerate(prompts):
            r = engine.generate([p], params, mode=mode, k_config=k, draft_policy=policy, policy_options=options or None)[0]
            wall += r.stats.wall_s
            tokens.append(r.token_ids)
            fwd, dfwd, new = fwd + r.stats.target_forwards, dfwd + r.stats.draft_forwards, new + r.stats.new_tokens
            drafted, accepted = drafted + r.stats.drafted, accepted + r.stats.accepted
            print(json.dumps({"setting": label, "question": i, "stats": r.stats.to_dict()}), flush=True)
        if policy:
            records = engine.policy(mode, k, params, policy, options).records[-200:]
        ar_tokens = tokens if label == "ar" else ar_tokens
        ea = [x["expected_tokens"] for x in records if x["expected_tokens"] is not None]
        table.append({"setting": label, "wall_s": wall, "tokens_per_target_forward": new / fwd if fwd else 0,
                      "draft_forwards_per_token": dfwd / new if new else 0,
                      "acceptance": accepted / drafted if drafted else None,
                      "n_target_per_n": fwd / new if new else None,
                      "n_discarded_per_n": (drafted - accepted) / new if new else None,
                      "identical": tokens == ar_tokens if params.greedy else None,
                      "mean_E_A": sum(ea) / len(ea) if ea else None,
                      "mean_tokens_per_round": (sum(x["tokens"] for x in records) / len(records)) if records else None})
    hf_wall = None
    if not args.skip_hf:
        hf_wall, hf_tokens = hf_assisted(engine, prompts, params)
        table.append({"setting": "HF assisted", "wall_s": hf_wall, "tokens_per_target_forward": None,
                      "draft_forwards_per_token": None, "acceptance": None, "n_target_per_n": None,
                      "n_discarded_per_n": None, "identical": hf_tokens == ar_tokens if params.greedy else None,
                      "mean_E_A": None, "mean_tokens_per_round": None})
    ar_wall = table[0]["wall_s"]
    if args.json:  # filled in below, written at the end
        report = {"command": " ".join(sys.argv), "target": engine.target_name, "draft": engine.draft_name,
                  "questions": len(prompts), "params": vars(params) if hasattr(params, "__dict__") else str(params),
                  "table": table}
    for row in table:
        row["x_ar"] = ar_wall / row["wall_s"]
        row["x_hf"] = hf_wall / row["wall_s"] if hf_wall else None
        print(json.dumps({"summary": row}), flush=True)
        fmt = lambda v: "-" if v is None else f"{v:.2f}" if isinstance(v, float) else str(v)  # noqa: E731
        log.info("%-26s %s", row["setting"], "  ".join(f"{k}={fmt(v)}" for k, v in row.items() if k != "setting"))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=2, default=str)


if __name__ == "__main__":
    main()
