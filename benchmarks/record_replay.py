"""Record a real ToT run's token streams for the synthetic engine's replay oracle (seed_tot/replay.py).

    .venv/bin/python benchmarks/record_replay.py            # writes benchmarks/replay/gsm8k-smollm2.jsonl.gz
    python benchmarks/record_replay.py --target $Q/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \
        --data ../shared/data/gsm8k/test.jsonl --limit 8 --output runs/gsm8k-qwen.jsonl.gz
                                                              # another target's text, for text_draft_replay.py
    python benchmarks/record_replay.py --workload tot-blocksworld --data ../shared/data/blocksworld/step_6.jsonl \
        --limit 4 --output runs/blocksworld-smollm2.jsonl.gz  # another task's text, for text_draft_replay.py

Runs the embedded SmolLM2-135M-Instruct target on the CPU, greedy, `parallel` mode (batched target
steps only: the tokens are the target's alone, whatever the mode). By default it records the two
workloads that `benchmarks/gpu.sh` replays, at the settings it replays them with:

  - `tot-gsm8k`: whole ToT-BFS solves of the problems of tests/fixtures/gsm8k_small.jsonl (the
    task's shipped config, temperature 0, REPLAY_TOKENS new tokens per call);
  - `tot-step`: the bench workload's thought and value calls on that file's first problem.

`--workload tot-blocksworld` or `tot-creative-writing` records that task's whole solves instead, as
`seed-tot bench` runs them at temperature 0 (the shipped config's own token caps unless
--max-new-tokens), for text_draft_replay.py's per-phase tables; the GPU replay reads GSM8K only.

Every engine call is written as one JSON line: its workload, search key, phase, max_new_tokens and
rows (each row's prompt ids and greedy output ids, the real tokenizer's). The first line is a
header (tokenizer, vocabulary size, end-of-sequence ids, settings). The tokenizer ships beside it
(SmolLM2's tokenizer files), so the replay needs neither the weights nor the Hub. Run once: the
recording is data, not a timing.
"""
from __future__ import annotations

import argparse
import datetime
import gzip
import json
import logging
import sys
import tempfile
from pathlib import Path

from seed_tot import Engine
from seed_tot.bench_workloads import ModeSpec, tot_step_workload, tot_workload
from seed_tot.engine.decode_spec import DecodeSpec
from seed_tot.engine.params import SamplingParams
from seed_tot.replay import (DEFAULT_RECORDING, FORMAT, REPLAY_DATA, REPLAY_LIMIT, REPLAY_TOKENS, TOKENIZER_FILE,
                             pack_tokenizer)

log = logging.getLogger("record_replay")

FIXTURES = REPLAY_DATA.parent
# the whole-solve workloads a recording can hold, each with the fixture it records by default
WORKLOAD_DATA = {"tot-gsm8k": REPLAY_DATA, "tot-blocksworld": FIXTURES / "blocksworld_small.jsonl",
                 "tot-creative-writing": FIXTURES / "creative_writing_small.txt"}


class RecordingEngine(Engine):
    """An Engine that keeps every scheduled call's prompt and output ids, with the call's search key
    and phase (the streams the replay oracle follows)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls: list[dict] = []
        self.workload = ""

    def _submit(self, prompts, params: SamplingParams, spec, on_tokens=None):
        seqs, future, start = super()._submit(prompts, params, spec, on_tokens)
        record = {"workload": self.workload, "search_key": params.search_key, "phase": params.phase,
                  "max_new_tokens": params.max_new_tokens}
        self.calls.append(record)  # in call order; the rows are filled in when the call is done
        future.add_done_callback(lambda _: record.update(rows=[{"prompt": s.prompt, "output": s.generated}
                                                               for s in seqs]))
        return seqs, future, start


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--output", type=Path, default=DEFAULT_RECORDING)
    ap.add_argument("--workload", choices=sorted(WORKLOAD_DATA), default="tot-gsm8k",
                    help="the task whose whole solves are recorded (tot-gsm8k also records tot-step, as gpu.sh replays both)")
    ap.add_argument("--data", help="the task's data file (default: its small fixture under tests/fixtures/)")
    ap.add_argument("--limit", type=int, default=REPLAY_LIMIT)
    ap.add_argument("--max-new-tokens", type=int,
                    help=f"cap of every call (default: {REPLAY_TOKENS} for tot-gsm8k, as gpu.sh replays it; "
                         f"the shipped config's for the other tasks)")
    ap.add_argument("--target", help="a Hub id, local directory or .gguf (default: the embedded SmolLM2-135M-Instruct, "
                                     "whose recording the replay-* presets read)")
    args = ap.parse_args(argv)
    gsm8k = args.workload == "tot-gsm8k"
    if (args.target or not gsm8k) and args.output.resolve() == DEFAULT_RECORDING.resolve():
        ap.error(f"--target, --workload: give --output too ({DEFAULT_RECORDING} is the embedded target's "
                 f"GSM8K recording, which the replay-* presets read)")
    data = args.data or str(WORKLOAD_DATA[args.workload])
    max_new_tokens = args.max_new_tokens or (REPLAY_TOKENS if gsm8k else None)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    engine = RecordingEngine.from_pretrained(args.target, device="cpu", dtype="float32", load_draft=False)
    parallel = ModeSpec("parallel", DecodeSpec(mode="parallel"))

    if gsm8k:
        engine.workload = "tot-step"
        run, _ = tot_step_workload(engine, data, SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0))
        run(engine, parallel, 0)

    engine.workload = args.workload
    with tempfile.TemporaryDirectory(prefix="seed-tot-record-") as tmp:
        # the bench's own whole-solve workload at temperature 0 (the task's shipped config otherwise)
        run, described = tot_workload(args.workload, data, args.limit, 0.0, max_new_tokens, 0, Path(tmp))
        run(engine, parallel, 0)
    log.info("%s: %s", args.workload, described)

    missing = [i for i, call in enumerate(engine.calls) if "rows" not in call]
    if missing:
        raise RuntimeError(f"calls {missing} never finished: the recording would be incomplete")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    # the tokenizer ships beside the recording; another target's gets a name of its own
    tokenizer_file = TOKENIZER_FILE if not args.target else args.output.name.split(".")[0] + "-tokenizer.tar.xz"
    header = {"format": FORMAT, "tokenizer": tokenizer_file, "target": Path(engine.target_name).name,
              "vocab_size": len(engine.tokenizer), "eos_token_ids": sorted(engine.eos_ids),
              "recorded": datetime.date.today().isoformat(), "temperature": 0.0, "workload": args.workload,
              "max_new_tokens": max_new_tokens, "data": Path(data).name, "limit": args.limit}
    with gzip.open(args.output, "wt", encoding="utf-8", compresslevel=9) as f:
        for line in [header] + engine.calls:
            f.write(json.dumps(line, separators=(",", ":")) + "\n")
    pack_tokenizer(engine.tokenizer, args.output.parent / tokenizer_file)
    tokens = sum(len(r["prompt"]) + len(r["output"]) for c in engine.calls for r in c["rows"])
    log.info("wrote %s: %d calls, %d tokens, %d bytes", args.output, len(engine.calls), tokens,
             args.output.stat().st_size)


if __name__ == "__main__":
    main()
