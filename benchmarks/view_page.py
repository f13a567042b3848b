"""The tree page at GSM8K test scale: a synthetic 1,319-problem run, its page's size and the time
headless Chromium takes to make it usable (issue 41).

    python benchmarks/view_page.py --output /tmp/view-bench [--problems 1319] [--runs 2] [--repeats 3]

The run is made up, not solved: each record has the shape `seed-tot solve` writes (steps,
node_work, stats) with the GSM8K config's tree (4 steps, 3 thoughts per kept state, 1 kept) and
thoughts of about a full thought budget of text, so the page holds what a real run's would. Prints
one JSON object: page bytes, the seconds `seed-tot view` took to write it, and per load (medians
over --repeats fresh loads): the in-page time to a usable list (navigation start to the script's
end), opening the last problem, and filtering the list. Needs chromium + chromedriver.
"""
from __future__ import annotations

import argparse
import json
import logging
import random
import statistics
import time
from pathlib import Path

from seed_tot.view.browser import headless_chromium, open_page
from seed_tot.view.page import write_page

log = logging.getLogger("view_page")

WORDS = ("the apples cost dollars each so she pays total of which remain after giving away half more than "
         "twice many per day week hours minutes left how much does he have in all then we subtract add").split()


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def _work(rng: random.Random, tokens: int) -> dict[str, float]:
    accepted = rng.randint(0, tokens)
    return {"new_tokens": tokens, "accepted": accepted, "draft_depth": tokens + 3, "verifications": tokens // 2 + 1,
            "target_forwards": tokens / 3, "draft_forwards": tokens, "wall_s": tokens / 40}


def synthetic_record(i: int, rng: random.Random, depth: int, n_generate: int, breadth: int) -> dict:
    frontier: list[list[str]] = [[]]
    steps, node_work = [], []
    for s in range(depth):
        parents = [p for p in range(len(frontier)) for _ in range(n_generate)]
        thoughts = [f"Question 1.{s + 1}: {_text(rng, 25)}? Answer 1.{s + 1}: {_text(rng, 45)}. "
                    f"The answer is {rng.randint(1, 99)}." for _ in parents]
        states = [frontier[p] + [t] for p, t in zip(parents, thoughts)]
        values = [float(rng.randint(1, 10)) for _ in states]
        kept = sorted(range(len(states)), key=lambda k: -values[k])[:breadth]
        steps.append({"step": s, "frontier": frontier, "thoughts": thoughts, "parents": parents,
                      "new_states": states, "values": values, "kept": kept})
        node_work.append({"value_replies": [f"{int(v)} {_text(rng, 6)}" for v in values],
                          "thought_work": [_work(rng, 100) for _ in thoughts],
                          "value_work": [_work(rng, 8) for _ in states],
                          "call_work": {"thought": _work(rng, 100 * len(thoughts)),
                                        "value": _work(rng, 8 * len(states))}})
        frontier = [states[k] for k in kept]
    gold = str(rng.randint(1, 500))
    prediction = gold if rng.random() < 0.5 else str(rng.randint(1, 500))
    phase = {"new_tokens": 1200, "accepted": 500, "draft_depth": 1100, "verifications": 400, "target_forwards": 420.0,
             "draft_forwards": 1200.0, "wall_s": 30.0}
    return {"id": str(i), "input": {"question": _text(rng, 60) + "?", "answer": f"#### {gold}"},
            "prediction": prediction, "answer": prediction, "gold": gold, "correct": prediction == gold,
            "answer_completion": f"The answer is {prediction}.", "best_state": frontier[0],
            "best_value": steps[-1]["values"][steps[-1]["kept"][0]], "expanded": depth * breadth, "steps": steps,
            "node_work": node_work, "stats": {"thought": phase, "value": phase, "answer": phase},
            "max_new_tokens": {"thought": 128, "value": 16, "answer": 128}, "wall_s": 90.0}


def write_run(directory: Path, problems: int, seed: int, mode: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    with (directory / "results.jsonl").open("w", encoding="utf-8") as fh:
        for i in range(problems):
            fh.write(json.dumps(synthetic_record(i, rng, depth=4, n_generate=3, breadth=1)) + "\n")
    summary = {"task": "gsm8k", "algorithm": "bfs", "mode": mode, "k_config": [1, 1, 1], "target": "synthetic-target",
               "draft": "synthetic-draft", "settings": {"search": {"depth": 4, "n_generate": 3, "breadth": 1,
                                                                   "temperature": 1.0}}}
    (directory / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    return directory


def measure(page: Path, repeats: int) -> dict:
    loads, opens, filters = [], [], []
    for _ in range(repeats):  # a fresh browser each time: nothing cached between loads
        with headless_chromium() as driver:
            start = time.perf_counter()
            open_page(driver, page)
            wall = time.perf_counter() - start
            ready_ms = float(driver.execute_script("return document.body.dataset.readyMs"))
            loads.append((ready_ms / 1000, wall))
            opens.append(driver.execute_script(
                "const t = performance.now(); const li = document.querySelector('#problems li:last-child');"
                "li.click(); return (performance.now() - t) / 1000;"))
            filters.append(driver.execute_script(
                "const t = performance.now(); const f = document.getElementById('filter'); f.value = 'wrong';"
                "f.dispatchEvent(new Event('change')); return (performance.now() - t) / 1000;"))
    return {"load_in_page_s": statistics.median(x[0] for x in loads),
            "load_wall_s": statistics.median(x[1] for x in loads),
            "open_last_problem_s": statistics.median(opens), "filter_s": statistics.median(filters)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--output", type=Path, required=True)
    ap.add_argument("--problems", type=int, default=1319)
    ap.add_argument("--runs", type=int, default=1, help="runs side by side on the page (2: an ar/seed comparison)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO)
    modes = ("seed", "ar")
    runs = [write_run(args.output / f"run-{modes[r % 2]}-{r}", args.problems, seed=r, mode=modes[r % 2])
            for r in range(args.runs)]
    start = time.perf_counter()
    page = write_page(runs, args.output / "page.html")
    written = time.perf_counter() - start
    result = {"problems": args.problems, "runs": args.runs, "page_bytes": page.stat().st_size,
              "results_bytes": sum((r / "results.jsonl").stat().st_size for r in runs), "write_s": written,
              **measure(page, args.repeats)}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
