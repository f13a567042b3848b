"""Acceptance of drafters over many GSM8K prompts, not one: the `thoughts` workload times 1 question,
so its acceptance is one thought and three value states' worth of tokens; this measures it over the
first --questions test questions, by prompt kind, with a bootstrap interval over questions.

    python benchmarks/acceptance.py --drafter ps=DIR --drafter v5=DIR --data ../shared/data/gsm8k/test.jsonl \
        --questions 40 --ps-k 1,2,3,4 --json OUT.json

Kinds: `thought`, each question's first-step thought prompt (what ToT's generator asks, State());
`value`, the value prompt of the state holding the question's first gold solution line (what the
evaluator asks). Greedy `sd` (acceptance at T=0 is a property of the two models, not of the mode or
the machine: seed drafts and accepts the same tokens), one draft shape per row of the table.
Acceptance = accepted / draft depth offered (GenerationStats), tau = tokens per target verification;
where a round's tree branches (a lookup guess beside the drafter's chain) it verifies more nodes
than its depth, so rows also give nodes per round and accepted per node.
Nothing here is timed; speed comes from benchmarks/drafters.py.
"""
from __future__ import annotations

import argparse
import json
import logging
import random
import sys
from pathlib import Path

from seed_tot import Engine, SamplingParams
from seed_tot.engine.drafters import load_drafter

log = logging.getLogger("acceptance")


def gsm8k_prompts(engine: Engine, data: str, questions: int) -> dict[str, list[str]]:
    """Per kind, one rendered prompt per question (see the module docstring)."""
    from seed_tot.search.protocol import State
    from seed_tot.tasks.gsm8k import GSM8K, solution_steps

    task = GSM8K()
    thoughts, values = [], []
    for example in task.load(data, limit=questions):
        step = f"{task.prompts['step_header'].format(k=1)} {solution_steps(example.data['answer'])[0]}"
        for out, p in ((thoughts, task.thought_prompt(example, State())),
                       (values, task.value_prompt(example, State((step,))))):
            out.append(engine.render_prompt(p.user, p.assistant_prefix))
    return {"thought": thoughts, "value": values}


def bootstrap_ci(accepted: list[int], depth: list[int], draws: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% interval of pooled accepted / depth when questions are resampled with replacement."""
    rng, n = random.Random(seed), len(accepted)
    ratios = sorted(sum(accepted[i] for i in idx) / max(sum(depth[i] for i in idx), 1)
                    for idx in ([rng.randrange(n) for _ in range(n)] for _ in range(draws)))
    return ratios[int(0.025 * draws)], ratios[int(0.975 * draws) - 1]


def measure(engine: Engine, prompts: list[str], params: SamplingParams, depth: int, parallelspec: bool,
            options: dict[str, str] | None = None) -> dict:
    """options: more parallelspec policy options (passes, cut)."""
    policy = ({"draft_policy": "parallelspec", "policy_options": {"depth": str(depth), **(options or {})},
               "k_config": (1,)} if parallelspec else {"k_config": (1,) * depth})
    results = engine.generate(prompts, params, mode="sd", **policy)
    accepted = [r.stats.accepted for r in results]
    offered = [r.stats.draft_depth for r in results]
    tokens, rounds = sum(r.stats.new_tokens for r in results), sum(r.stats.verifications for r in results)
    drafted = sum(r.stats.drafted for r in results)  # tree nodes verified: above the depth when a tree branches
    low, high = bootstrap_ci(accepted, offered)
    return {"acceptance": sum(accepted) / max(sum(offered), 1), "ci95": [round(low, 4), round(high, 4)],
            "tau": tokens / max(rounds, 1), "tokens": tokens, "prompts": len(prompts),
            "accepted_per_node": sum(accepted) / max(drafted, 1), "nodes_per_round": drafted / max(rounds, 1),
            "token_ids": [r.token_ids for r in results]}


def option_sets(text: str) -> list[dict[str, str]]:
    """'passes=2,cut=cost;passes=1' -> [{'passes': '2', 'cut': 'cost'}, {'passes': '1'}]; '' -> [{}]."""
    sets = []
    for group in text.split(";") if text else [""]:
        pairs = [item.partition("=") for item in group.split(",") if item]
        bad = [key for key, eq, _ in pairs if not eq]
        if bad:
            raise SystemExit(f"--ps-options {text!r}: expected key=value, got {bad[0]!r}")
        sets.append({key: value for key, _, value in pairs})
    return sets


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    ap.add_argument("--drafter", action="append", default=[], metavar="NAME=DIR", required=True)
    ap.add_argument("--data", required=True, help="GSM8K jsonl (the test split: this evaluates, never trains)")
    ap.add_argument("--questions", type=int, default=40)
    ap.add_argument("--ps-k", default="1,2,3,4", help="ParallelSpec mask counts (depth k+1); others: chain k+1")
    ap.add_argument("--ps-options", default="", help="ParallelSpec option sets to run, ';'-separated, each "
                    "'key=value,key=value' (e.g. 'passes=1;passes=2;cut=cost'); empty: the drafter's defaults")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    base = Engine.from_pretrained(target=args.target, load_draft=False)
    prompts = gsm8k_prompts(base, args.data, args.questions)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0.0)
    reference = {kind: [r.token_ids for r in base.generate(p, params, mode="ar")] for kind, p in prompts.items()}
    rows = []
    for item in args.drafter:
        name, _, path = item.partition("=")
        if not path:
            ap.error(f"--drafter {item!r}: expected NAME=DIR")
        drafter = base.on_forward_thread(load_drafter, path, base.target, base.target_name)
        engine = Engine(base.target, drafter, base.tokenizer, target_name=base.target_name, draft_name=name,
                        forward_thread=base.forward_thread)
        n_masks = getattr(drafter, "n_masks", 0)
        for options in option_sets(args.ps_options) if n_masks else [{}]:
            for k in (int(k) for k in args.ps_k.split(",")):
                if n_masks and k > n_masks:
                    continue
                for kind, kind_prompts in prompts.items():
                    row = measure(engine, kind_prompts, params, k + 1, bool(n_masks), options)
                    if row.pop("token_ids") != reference[kind]:  # lossless: greedy sd writes what ar writes
                        raise RuntimeError(f"{name} depth {k + 1} {options} on {kind} prompts: tokens differ from ar")
                    label = ",".join(f"{key}={value}" for key, value in options.items()) or "-"
                    rows.append({"drafter": name, "depth": k + 1, "options": label, "kind": kind, **row})
                    log.info("%s depth %d %s %s: acceptance %.3f %s, tau %.2f", name, k + 1, label, kind,
                             row["acceptance"], row["ci95"], row["tau"])
    sys.stderr.write("| drafter | depth | options | kind | acceptance [95% CI over questions] | tokens / target fwd "
                     "| nodes / round | accepted / node |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n")
    sys.stderr.write("".join(f"| {r['drafter']} | {r['depth']} | {r['options']} | {r['kind']} | {r['acceptance']:.3f} "
                             f"[{r['ci95'][0]:.3f}-{r['ci95'][1]:.3f}] | {r['tau']:.2f} | {r['nodes_per_round']:.2f} "
                             f"| {r['accepted_per_node']:.3f} |\n" for r in rows))
    if args.json:
        payload = {"command": " ".join(["python"] + sys.argv), "target": base.target_name,
                   "questions": args.questions, "max_new_tokens": args.max_new_tokens, "rows": rows}
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
