"""Replay a recording's greedy rows through the text draft sources, with no model: what `lookup` and
`suffix` (with any of their options) would accept, per phase, on real text.

    python benchmarks/text_draft_replay.py                      # the shipped SmolLM2 recording
    python benchmarks/text_draft_replay.py --recording R.jsonl.gz --drafters lookup,lookup:depth=8,suffix:share=off \
        --json replay.jsonl

A recording (seed_tot/replay.py's format, made by benchmarks/record_replay.py) holds every engine call
of a greedy run: its search key, phase and rows (prompt ids, output ids). Calls replay in recording
order and each call's rows advance in lockstep rounds, as the engine's step advances them: in a round
every unfinished row drafts from the source (the real `SuffixSource` with its row, search and run
scopes, or `lookup_continuation`), the verification accepts the longest drafted path that equals the
recorded output (the greedy target's own tokens) and adds the next recorded token. So each scope holds
at each round what it would have held in the recorded run: the row's prompt and output so far, its
siblings' live text, the search's and the run's finished outputs.

Why: a live bench's figures mix what the text offers with the target's forward cost and `choose`'s
pricing; this isolates the first, in seconds, for any drafter setting. It prices nothing: on a GPU
a drafted token costs little beside a row, on a CPU about a row (docs/engine.md).
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch

from seed_tot.engine.decode_spec import DecodeSpec
from seed_tot.engine.params import SamplingParams
from seed_tot.engine.policies import parse_policy_options
from seed_tot.engine.policies.prompt_lookup import PromptLookupPolicy, lookup_continuation
from seed_tot.engine.policies.suffix import SuffixSource
from seed_tot.engine.sequence import Sequence, StopRule
from seed_tot.engine.suffix_index import DraftNode
from seed_tot.replay import DEFAULT_RECORDING, Recording, load_recording

log = logging.getLogger("text_draft_replay")

DEFAULT_DRAFTERS = "lookup,lookup:depth=8,suffix,suffix:unigram=0,suffix:share=off"


@dataclass
class Tally:
    """One drafter's record over the rows of one phase."""

    rows: int = 0
    verifications: int = 0  # rounds: one target verification each
    tokens: int = 0  # new tokens written (the recorded outputs' lengths)
    drafted: int = 0  # draft nodes offered
    accepted: int = 0  # draft nodes the target took
    fallback_rounds: int = 0  # rounds whose draft came from a one-token match (DraftNode.fallback)
    fallback_accepted: int = 0
    draft_s: float = 0.0  # host time spent drafting and indexing

    def figures(self) -> dict:
        v = max(1, self.verifications)
        return {"rows": self.rows, "verifications": self.verifications, "tokens": self.tokens,
                "drafted": self.drafted, "accepted": self.accepted,
                "acceptance": round(self.accepted / self.drafted, 4) if self.drafted else 0.0,
                "tokens_per_verification": round(self.tokens / v, 4),
                "drafted_per_verification": round(self.drafted / v, 4),
                "fallback_rounds": self.fallback_rounds, "fallback_accepted": self.fallback_accepted,
                "draft_ms_per_verification": round(1e3 * self.draft_s / v, 4)}


class Drafter:
    """A text draft source as the engine's policy would run it on a row's round."""

    def __init__(self, label: str):
        name, _, options = label.partition(":")
        opts = parse_policy_options(kv for kv in options.split(":") if kv)
        self.label = label
        allowed = {"lookup": ("ngram", "depth"), "suffix": SuffixSource.OPTIONS}.get(name, ())
        unknown = sorted(set(opts) - set(allowed))
        if allowed and unknown:
            raise ValueError(f"drafter {label!r}: {', '.join(unknown)} is not an option of {name!r} "
                             f"(it takes {', '.join(allowed)})")
        if name == "lookup":
            # built as the engine builds it for the default spec (depth: len(k_config) unless given)
            policy = PromptLookupPolicy.from_options(None, DecodeSpec().k_config, None, **opts)
            self.ngram, self.depth, self.source = policy.ngram, policy.depth, None
        elif name == "suffix":
            self.source = SuffixSource(**{k: v for k, v in SuffixSource.parse("suffix", **opts).items()
                                          if v is not None})
        else:
            raise ValueError(f"drafter {label!r}: the text sources are 'lookup' and 'suffix' "
                             f"(with :KEY=VALUE options, as in --modes)")

    def draft(self, seq: Sequence, limit: int) -> list[DraftNode]:
        if self.source is not None:
            return self.source.draft(seq, limit)
        chain = lookup_continuation(seq.tokens, self.ngram, min(self.depth, limit))
        return [DraftNode(i - 1, token, 1.0) for i, token in enumerate(chain)]

    def observe(self, seq: Sequence) -> None:
        if self.source is not None:
            self.source.observe(seq)


def accepted_path(nodes: list[DraftNode], truth: list[int]) -> list[int]:
    """The nodes the greedy verification takes: from the root, the child whose token is the next
    recorded token, while there is one (a chain is a tree of one child per node)."""
    path, parent = [], -1
    for token in truth:
        child = next((i for i, n in enumerate(nodes) if n.parent == parent and n.token == token), None)
        if child is None:
            break
        path.append(child)
        parent = child
    return path


@dataclass
class _Row:
    seq: Sequence
    output: list[int]  # the recorded (greedy target's) output
    tally: Tally


def replay(recording: Recording, drafter: Drafter) -> dict[str, Tally]:
    """Every call of `recording` through `drafter`; its record per phase ("" for calls without one)."""
    eos = frozenset(recording.header.get("eos_token_ids", []))
    tallies: dict[str, Tally] = defaultdict(Tally)
    for call in recording.calls:
        params = SamplingParams(max_new_tokens=int(call.get("max_new_tokens") or 1 << 20), temperature=0.0,
                                search_key=call.get("search_key", ""), phase=call.get("phase", ""))
        rule = StopRule(params, eos, None)  # one per call, as the engine makes it (a search's call boundary)
        rows = [_Row(Sequence(i, list(r["prompt"]), rule, torch.Generator()), list(r["output"]), tallies[params.phase])
                for i, r in enumerate(call["rows"])]
        for row in rows:
            row.tally.rows += 1
            row.tally.tokens += len(row.output)
        live = [row for row in rows if row.output]
        while live:
            # every row drafts before any verifies, as in one engine step: a sibling's text of this
            # round is not in the search scope until the verification has written it
            drafts = []
            for row in live:
                start = time.perf_counter()
                drafts.append(drafter.draft(row.seq, params.max_new_tokens - len(row.seq.generated)))
                row.tally.draft_s += time.perf_counter() - start
            for row, nodes in zip(live, drafts):
                seq, t, at = row.seq, row.tally, len(row.seq.generated)
                taken = len(accepted_path(nodes, row.output[at:]))
                t.verifications += 1
                t.drafted += len(nodes)
                t.accepted += taken
                if nodes and nodes[0].fallback:
                    t.fallback_rounds += 1
                    t.fallback_accepted += taken
                seq.append(row.output[at: at + taken + 1])
                if len(seq.generated) >= len(row.output) and not seq.done:
                    seq.finish_reason = "stop"  # the recording ended here (a stop string the replay cannot see)
                start = time.perf_counter()
                drafter.observe(seq)
                t.draft_s += time.perf_counter() - start
            live = [row for row in live if not row.seq.done]
    return dict(tallies)


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recording", type=Path, default=DEFAULT_RECORDING)
    ap.add_argument("--drafters", default=DEFAULT_DRAFTERS,
                    help=f"comma-separated text sources with options, as in --modes (default {DEFAULT_DRAFTERS})")
    ap.add_argument("--workload", default="", help="replay only the calls of this workload (e.g. tot-gsm8k)")
    ap.add_argument("--json", type=Path, help="write one JSON line per drafter and phase")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    try:
        drafters = [Drafter(label.strip()) for label in args.drafters.split(",") if label.strip()]
    except ValueError as err:
        ap.error(f"--drafters: {err}")
    recording = load_recording(args.recording)
    if args.workload:
        calls = [c for c in recording.calls if c.get("workload") == args.workload]
        if not calls:
            ap.error(f"--workload {args.workload!r}: {args.recording} holds "
                     f"{sorted({c.get('workload', '') for c in recording.calls})}")
        recording = Recording(recording.path, recording.header, calls)
    lines = []
    for drafter in drafters:
        for phase, tally in sorted(replay(recording, drafter).items()):
            line = {"recording": str(args.recording), "drafter": drafter.label, "phase": phase or "-",
                    **tally.figures()}
            lines.append(line)
            log.info("%-28s %-8s tokens/verification %.2f  acceptance %.3f  drafted/verification %.2f  "
                     "draft ms/verification %.3f  (%d rows, %d verifications)", drafter.label, line["phase"],
                     line["tokens_per_verification"], line["acceptance"], line["drafted_per_verification"],
                     line["draft_ms_per_verification"], line["rows"], line["verifications"])
    if args.json:
        args.json.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return lines


if __name__ == "__main__":
    main()
