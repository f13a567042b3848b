"""Recorded token streams of a real ToT run, replayed by the synthetic engine's target oracle.

Why: random-weight synthetic models (synthetic.py) write no text, so a draft source that reads the
search's own text (prompt lookup, the suffix trees, `choose`) has nothing to find on them. The
`replay-*` presets keep the real shapes (every forward costs a 7B's) but make the target's greedy
token follow a real run, recorded once on the CPU by benchmarks/record_replay.py with SmolLM2-135M
and its tokenizer: prompts rendered and encoded by that tokenizer are the recorded prompts, so the
replayed search makes the recorded calls and writes the recorded text.

The oracle is a table from (token t at position n) to the recorded next token, built from every
recorded row (prompt + output; the entries that matter are the prompt's last token and the
output's tokens). The synthetic oracle is already a function of (token, position) only, since a
forward sees no more of a row than its new tokens; a row whose prompt is a recorded prompt is at
the recorded positions, so its greedy output is the recorded output. Where two streams disagree on
the same (t, n), the earlier recorded one wins (the later row drifts onto it: still real text). A
row off the recorded positions (a prompt the recording never saw, or a row that drifted) takes the
next token of t's nearest recorded occurrence, so it keeps writing recorded text; only a token the
recording never holds falls back to the hash oracle. The lookup is a `searchsorted` over the
sorted keys on the model's device: a few tensor ops per forward, no host sync.
"""
from __future__ import annotations

import gzip
import io
import json
import logging
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

log = logging.getLogger(__name__)

FORMAT = "seed-tot replay 1"
_BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
DEFAULT_RECORDING = _BENCHMARKS / "replay" / "gsm8k-smollm2.jsonl.gz"
TOKENIZER_FILE = "smollm2-tokenizer.tar.xz"
# what benchmarks/gpu.sh replays must be what was recorded: the same problems, greedy, this many
# new tokens per call (a call cut shorter would build prompts the recording never saw)
REPLAY_DATA = _BENCHMARKS.parent / "tests" / "fixtures" / "gsm8k_small.jsonl"
REPLAY_LIMIT = 3
REPLAY_TOKENS = 64
_POSITIONS = 1 << 24  # key = token * _POSITIONS + position: unique below 2^24 positions, fits int64


class ReplayError(ValueError):
    """A recording that cannot be replayed: which file, which line, what was expected."""


@dataclass
class Recording:
    path: Path
    header: dict
    calls: list[dict]

    @property
    def vocab_size(self) -> int:
        return int(self.header["vocab_size"])

    def streams(self):
        """(prompt ids, output ids) of every recorded row, in recording order."""
        for call in self.calls:
            for row in call["rows"]:
                yield row["prompt"], row["output"]


def load_recording(path: str | Path = DEFAULT_RECORDING) -> Recording:
    path = Path(path)
    if not path.is_file():
        raise ReplayError(f"replay recording {path} not found: the replay-* synthetic presets read the recording "
                          f"shipped in the checkout (benchmarks/replay/; made by benchmarks/record_replay.py)")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        lines = [line for line in f if line.strip()]
    try:
        records = [json.loads(line) for line in lines]
    except json.JSONDecodeError as e:
        raise ReplayError(f"{path}: line {e.doc.count(chr(10)) + 1} is not JSON: {e}") from None
    header = records[0] if records else {}
    if header.get("format") != FORMAT:
        raise ReplayError(f"{path}: line 1 must be the header with format {FORMAT!r}, got {header.get('format')!r}")
    vocab = int(header.get("vocab_size", 0))
    for number, call in enumerate(records[1:], start=2):
        rows = call.get("rows") if isinstance(call, dict) else None
        if not isinstance(rows, list) or not all(_is_row(r) for r in rows):
            raise ReplayError(f"{path}: line {number}: 'rows' must be a list of {{prompt, output}} token lists")
        for row in rows:
            ids = row["prompt"] + row["output"]
            if not row["prompt"] or any(not isinstance(t, int) or not 0 <= t < vocab for t in ids):
                raise ReplayError(f"{path}: line {number}: a row has an empty prompt or a token outside "
                                  f"[0, {vocab}) (the header's vocab_size)")
    return Recording(path, header, records[1:])


def _is_row(row) -> bool:
    return isinstance(row, dict) and all(isinstance(row.get(k), list) for k in ("prompt", "output"))


class ReplayTable(nn.Module):
    """(token, position) -> the recorded next token, as sorted int64 keys and their values (buffers,
    so they live on the model's device); `lookup` answers a whole batch with tensor ops."""

    def __init__(self, recording: Recording, device: torch.device | str = "cpu"):
        super().__init__()
        table: dict[int, int] = {}
        conflicts = 0
        self.exact: list[bool] = []  # per recorded row: does the table replay it without a drift?
        for prompt, output in recording.streams():
            ids, exact = prompt + output, True
            for n in range(len(prompt) - 1, len(ids) - 1):  # the predictions a row's greedy decode reads
                key, nxt = ids[n] * _POSITIONS + n, ids[n + 1]
                if table.setdefault(key, nxt) != nxt:
                    conflicts, exact = conflicts + 1, False  # the earlier stream keeps the entry
            self.exact.append(exact)
        keys = sorted(table)
        log.info("replay table: %d entries from %s; %d of %d rows replay exactly (%d later disagreements kept "
                 "the earlier token)", len(keys), recording.path.name, sum(self.exact), len(self.exact), conflicts)
        self.register_buffer("keys", torch.tensor(keys, dtype=torch.long, device=device), persistent=False)
        self.register_buffer("values", torch.tensor([table[k] for k in keys], dtype=torch.long, device=device),
                             persistent=False)
        self.entries, self.conflicts = len(keys), conflicts

    def lookup(self, tokens: torch.Tensor, positions: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
        """The recorded next token after each (token, position); where the recording has the token
        but not at that position, the next token of its nearest recorded occurrence (below, else
        above); `fallback`'s for a token the recording never saw. Elementwise, on the device."""
        if self.entries == 0:
            return fallback
        tokens, query = tokens.long(), tokens.long() * _POSITIONS + positions.long()
        above = torch.searchsorted(self.keys, query).clamp_(max=self.entries - 1)  # first key >= query
        below = (above - 1).clamp_(min=0)
        exact = self.keys[above] == query
        below_ok = (self.keys[below] // _POSITIONS == tokens) & (self.keys[below] < query)
        above_ok = self.keys[above] // _POSITIONS == tokens
        near = torch.where(below_ok, self.values[below], torch.where(above_ok, self.values[above], fallback))
        return torch.where(exact, self.values[above], near)


def pack_tokenizer(tokenizer, path: Path) -> None:
    """The tokenizer's files (save_pretrained) as one xz tar: the replay encodes prompts with it."""
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        with tarfile.open(path, "w:xz") as tar:
            for f in sorted(Path(tmp).iterdir()):
                tar.add(f, arcname=f.name)


def load_tokenizer(recording: Recording):
    """The recorded run's tokenizer, from the file shipped beside the recording (offline)."""
    from transformers import AutoTokenizer

    path = recording.path.parent / recording.header["tokenizer"]
    if not path.is_file():
        raise ReplayError(f"{recording.path}: its tokenizer {path} is missing "
                          f"(benchmarks/record_replay.py writes both)")
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(fileobj=io.BytesIO(path.read_bytes()), mode="r:xz") as tar:
            tar.extractall(tmp, filter="data")
        tokenizer = AutoTokenizer.from_pretrained(tmp)
    if len(tokenizer) > recording.vocab_size:
        raise ReplayError(f"{path}: {len(tokenizer)} tokens, more than the recording's vocab_size "
                          f"{recording.vocab_size}")
    return tokenizer
