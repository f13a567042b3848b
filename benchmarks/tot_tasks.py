"""Issue-4 table: whole ToT solves of each task in several engine modes, models loaded once.

    python benchmarks/tot_tasks.py --target DIR/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \
        --draft DIR/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf --shared ../shared/data --limit 3 --output runs/tot

Each (task, mode) writes OUTPUT/TASK-MODE/results.jsonl and summary.json exactly as
`seed-tot solve TASK --mode MODE --output OUTPUT/TASK-MODE` would (same configs, same per-problem
seeds). Problems are interleaved -- problem 1 of every task in every mode, then problem 2, ... --
so a run cut short still compares the modes on the same problems, and re-running resumes.
Loading the models once per process instead of once per (task, mode) saves about 2 minutes a
pair on a CPU. Ends with a table on stderr.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from seed_tot import Engine
from seed_tot.engine.params import DRAFTING_MODES
from seed_tot.search import apply_overrides, load_settings, solve_dataset
from seed_tot.tasks import get_task

REPO = Path(__file__).resolve().parent.parent
DATA_FILES = {"gsm8k": "gsm8k/test.jsonl", "blocksworld": "blocksworld/step_6.jsonl",
              "creative_writing": "creative_writing/data_100_random_text.txt"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--shared", required=True, help="the ../shared/data directory")
    ap.add_argument("--tasks", default="gsm8k,blocksworld,creative_writing")
    ap.add_argument("--modes", default="ar,seed")
    ap.add_argument("--limit", type=int, default=3)
    ap.add_argument("--output", required=True)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    tasks, modes = args.tasks.split(","), args.modes.split(",")
    engine = Engine.from_pretrained(args.target, args.draft)
    setups = {}  # name -> (task, its first `limit` examples, its config)
    for name in tasks:
        task = get_task(name)
        setups[name] = (task, task.load(str(Path(args.shared) / DATA_FILES[name]), limit=args.limit),
                        load_settings(REPO / "configs" / f"{name}.yaml", base=task.config))
    summaries = {}
    for i in range(1, args.limit + 1):  # the first i problems; resume skips those already solved
        for name, (task, examples, base) in setups.items():
            for mode in modes:
                out = Path(args.output) / f"{name}-{mode}"
                summaries[name, mode] = solve_dataset(engine, task, examples[:i], settings=apply_overrides(base, mode=mode),
                                                      output_dir=out, resume=True)
    print_table(summaries)


def print_table(summaries: dict) -> None:
    lines = ["| task | mode | n | accuracy / score | wall s / problem | acceptance: thought | acceptance: value "
             "| tokens/target call: thought | tokens/target call: value |", "|---" * 9 + "|"]
    for (name, mode), s in summaries.items():
        if "accuracy" in s:
            quality = f"accuracy {s['accuracy']:.3f}"
        else:  # creative writing: endings score, and the target's coherency judgement (1-10)
            quality = f"endings {s.get('mean_score', 0):.3f}, judge {s.get('mean_judge_score', 0):.2f}"
        phases = s.get("phases", {})
        cells = [name, mode, str(s["n"]), quality, f"{s['mean_wall_s']:.1f}"]
        for key in ("acceptance_rate", "tokens_per_target_forward"):
            for phase in ("thought", "value"):
                value = phases.get(phase, {}).get(key)
                cells.append("-" if mode not in DRAFTING_MODES or value is None else f"{value:.3f}")
        lines.append("| " + " | ".join(cells) + " |")
    print("\n".join(lines), file=sys.stderr)
    print(json.dumps({f"{n}-{m}": {k: v for k, v in s.items() if k != "settings"} for (n, m), s in summaries.items()},
                     default=str))


if __name__ == "__main__":
    main()
