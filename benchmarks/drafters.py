"""Issue-12 table: drafters for one target, in one process, so every ratio comes from one run.

    python benchmarks/drafters.py --drafter ar1=DIR --drafter ps=DIR --workload thoughts \
        --data ../shared/data/gsm8k/test.jsonl --temperature 0 --repeats 3 --json OUT.json

The target loads once (default: the embedded SmolLM2-135M-Instruct); each drafter becomes an
engine over that same target: the layer-truncated self-draft ("self", always), and every
`--drafter NAME=DIR` from `seed-tot train-drafter`. A ParallelSpec drafter runs at each depth
k+1 for k in --ps-k (one forward drafts k+1 tokens), with each --ps-cut (cost: the round keeps the
levels that pay for their verification), each --ps-passes (P: P forwards a round, pass p feeds
the drafted level p-1 back) and each --ps-lookup (N: a prompt-lookup guess on the last N tokens
grafted beside the draft); the others draft a chain of --chain tokens.
A drafter with a draft vocabulary (draft_vocab.safetensors) drafts from it; --whole-vocab-too
adds the same weights over the whole vocabulary as NAME-allvocab. Settings run in turn, each
--repeats times after --warmup; the table (stderr) and the JSON hold medians, x ar, acceptance, tokens per target forward and draft ms per round (draft busy time
over verifications: what a drafter costs per round).
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from pathlib import Path

from seed_tot import DecodeSpec, Engine, SamplingParams
from seed_tot.bench import ModeSpec, bench_modes, thoughts_workload, tot_step_workload, tot_workload
from seed_tot.bench_report import format_table, summarize_reports
from seed_tot.engine.drafters import load_drafter
from seed_tot.engine.models import DEFAULT_DRAFT_LAYERS, truncated_draft
from seed_tot.engine.policies.auto import load_costs

log = logging.getLogger("drafters")


def specs_for(name: str, drafter, modes: list[str], ps_ks: list[int], chain: int,
              cuts: tuple[str, ...] = ("none",), passes: tuple[int, ...] = (1,),
              lookups: tuple[int, ...] = (0,)) -> list[ModeSpec]:
    """One ModeSpec per (mode, draft shape) this drafter runs; labels carry the drafter's name."""
    n_masks = getattr(drafter, "n_masks", 0)
    out = []
    for mode in modes:  # seed as the paper runs it (one worker per sequence, db1 vb1): the drafters' own costs
        if n_masks:
            out += [ModeSpec(f"{mode} {name} k={k}" + ("" if cut == "none" else f" cut={cut}")
                             + ("" if p == 1 else f" passes={p}") + (f" lookup={n}" if n else ""),
                             DecodeSpec(mode, (1,), None, 1, 1, "parallelspec",
                                        {"depth": str(k + 1), "cut": cut, "passes": str(p), "lookup": str(n)}))
                    for n in lookups for p in passes for cut in cuts for k in ps_ks if k <= n_masks]
        else:
            out.append(ModeSpec(f"{mode} {name} chain={chain}", DecodeSpec(mode, (1,) * chain, None, 1, 1)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    ap.add_argument("--drafter", action="append", default=[], metavar="NAME=DIR", help="a train-drafter directory")
    ap.add_argument("--self-layers", type=int, default=DEFAULT_DRAFT_LAYERS)
    ap.add_argument("--workload", choices=["thoughts", "tot-step", "tot-blocksworld", "tot-gsm8k"], default="thoughts")
    ap.add_argument("--data", default=None)
    ap.add_argument("--limit", type=int, default=1, help="tot-*: problems per run")
    ap.add_argument("--modes", default="sd,seed", help="drafting modes to run per drafter (ar always runs)")
    ap.add_argument("--ps-k", default="2,3,4,5", help="ParallelSpec mask counts to run (depth k+1)")
    ap.add_argument("--ps-cut", default="none",
                    help="parallelspec cut options to run (none, cost or none,cost; policies/parallelspec.py)")
    ap.add_argument("--ps-passes", default="1", help="comma-separated ParallelSpec passes per round (policy option passes)")
    ap.add_argument("--ps-lookup", default="0", help="comma-separated prompt-lookup n-grams to run (policy option "
                    "lookup; 0: off)")
    ap.add_argument("--chain", type=int, default=3, help="draft tokens per round of the non-ParallelSpec drafters")
    ap.add_argument("--whole-vocab-too", action="store_true",
                    help="also run each drafter that has a draft vocabulary over the whole vocabulary (NAME-allvocab)")
    ap.add_argument("--only", default=None, help="comma-separated drafter names to run (self and the --drafter names)")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--max-new-tokens", type=int, default=None, help="thoughts: default 64; tot-*: the task config's")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    base = Engine.from_pretrained(target=args.target, load_draft=False)
    # drafters are built, and their engines run, on the base engine's forward thread: one OpenMP team
    drafts = {"self": base.on_forward_thread(truncated_draft, base.target, args.self_layers)}
    for item in args.drafter:
        name, _, path = item.partition("=")
        if not path:
            ap.error(f"--drafter {item!r}: expected NAME=DIR")
        drafts[name] = base.on_forward_thread(load_drafter, path, base.target, base.target_name)
        if args.whole_vocab_too and drafts[name].draft_vocab_size:  # the same weights scoring every token
            drafts[f"{name}-allvocab"] = base.on_forward_thread(load_drafter, path, base.target, base.target_name,
                                                                draft_vocab=False)
    if args.only:
        keep = set(args.only.split(","))
        drafts = {n: d for n, d in drafts.items() if n in keep}
    engines = {n: Engine(base.target, d, base.tokenizer, target_name=base.target_name, draft_name=n,
                         forward_thread=base.forward_thread) for n, d in drafts.items()}

    params = SamplingParams(max_new_tokens=args.max_new_tokens or 64, temperature=args.temperature,
                            top_k=args.top_k, seed=args.seed)
    tmp = tempfile.TemporaryDirectory()
    tot = args.workload.startswith("tot-") and args.workload != "tot-step"
    if tot:
        run, description = tot_workload(args.workload, args.data, args.limit, args.temperature, args.max_new_tokens,
                                        args.seed, Path(tmp.name))
    else:
        make = tot_step_workload if args.workload == "tot-step" else thoughts_workload
        run, description = make(base, args.data, params)
    log.info("workload: %s", description)

    modes, ps_ks, cuts = args.modes.split(","), [int(k) for k in args.ps_k.split(",")], tuple(args.ps_cut.split(","))
    if "cost" in cuts:  # calibrate (or read the cached costs) before anything is timed
        for engine in engines.values():
            if getattr(engine.draft, "n_masks", 0):
                base.on_forward_thread(load_costs, engine)
    ar = bench_modes(base, run, [ModeSpec("ar", DecodeSpec("ar", (1,), None, 1, 1))], args.repeats, warmup=args.warmup)
    greedy = args.temperature == 0
    rows = [{**summarize_reports(ar, greedy, None, tot)[0], "drafter": "none"}]
    for name, engine in engines.items():
        reports = bench_modes(engine, run, specs_for(name, engine.draft, modes, ps_ks, args.chain, cuts,
                                                        tuple(int(p) for p in args.ps_passes.split(",")),
                                                        tuple(int(n) for n in args.ps_lookup.split(","))), args.repeats,
                              warmup=args.warmup)
        for row in summarize_reports(ar + reports, greedy, None, tot)[1:]:  # x ar against the one ar run
            rows.append({**row, "drafter": name, "n_masks": getattr(engine.draft, "n_masks", None)})
    sys.stderr.write(f"{description}; T={args.temperature} top_k={args.top_k}\n")
    sys.stderr.write(format_table(rows, greedy, tot, None) + "\n")
    sys.stderr.write("\n".join(f"{r['label']}: draft ms/round {r['draft_ms_per_round']:.1f}, "
                               f"draft fwd/token {r['draft_forwards_per_token']:.2f}" for r in rows if r["mode"] != "ar")
                     + "\n")
    if args.json:
        payload = {"command": " ".join(["python"] + sys.argv), "workload": args.workload, "description": description,
                   "temperature": args.temperature, "top_k": args.top_k, "target": base.target_name, "repeats": args.repeats, "warmup": args.warmup,
                   "rows": rows}
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
