"""Drafting beside verification: the draft model's forwards on a CUDA stream of their own.

In the overlapped schedule (seed.py, `SeedScheduler.overlap`) one step launches the target's
verification of the rows whose drafts were queued in earlier steps, then the draft round of the rows
verified in earlier steps, and only then reads the verification's decisions back (the step's one host
read). On CUDA the two launches go to two streams, so the device runs the draft model's round while
the target verifies; with CUDA graphs (graphed_forward.py) both are replays, launched before the host
waits. Two events order the streams:

  drafted    recorded on the draft stream after each draft round; the target's stream waits for it
             before a verification, which reads the round's picks (DraftTree.device_tokens) and draft
             probabilities, and before an admission's prefill, which may replay the draft model's
             graph buffers the round used.
  released   recorded on the target's stream when a step begins, after the admissions' prefills and
             the last step's commits (a drafter's target features included); the draft stream waits
             for it before a round, so a row's next draft follows its verification's commit and
             nothing the round reads is still being written.

One event each way per step covers every row: the schedule never has a row's draft and its
verification in flight in the same step. Commits move slot ids on the host only (kv_pool.py), so the
target's stream never touches the draft model's storage. The host read syncs the target's stream
alone: the draft round runs on while the host commits.

On the CPU there are no streams: `NoStreams` takes the same calls and does nothing, so the schedule
itself (seed.py) runs and is tested there.
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator

import torch

ENV = "SEED_TOT_OVERLAP_DRAFTING"  # "1" / "0": the default where the engine names none
_VALUES = {"1": True, "on": True, "true": True, "0": False, "off": False, "false": False}


def overlap_default(device: torch.device, setting: bool | None = None) -> bool:
    """Whether the step loop overlaps drafting with verification: `setting` when given, else
    $SEED_TOT_OVERLAP_DRAFTING, else off on every device. The overlapped schedule splits the rows
    into two verifications per round; on the CPU there is nothing to run beside the target (one
    thread runs every forward, forward_thread.py), and on a memory-bound GPU target a verification
    of half the rows costs about what one of all of them does, so the split lost there too (the H200
    tot-step and replay rows of docs/benchmarks.md, 2026-11-28). It stays for the A/B and for a pair
    whose draft round costs about a verification."""
    if setting is not None:
        return bool(setting)
    value = os.environ.get(ENV, "").strip().lower()
    if value:
        if value not in _VALUES:
            raise ValueError(f"${ENV}={os.environ[ENV]!r}: expected one of {', '.join(_VALUES)}")
        return _VALUES[value]
    return False


class NoStreams:
    """The CPU's (and any non-CUDA device's) stand-in: one stream, nothing to order."""

    streams = False

    def before_admit(self) -> None:
        pass

    def begin_step(self) -> None:
        pass

    @contextlib.contextmanager
    def drafting(self) -> Iterator[None]:
        yield

    def before_verify(self) -> None:
        pass


class DraftStream(NoStreams):
    """The draft model's CUDA stream and the two events that order it with the target's stream
    (whichever stream is current on the step thread: torch's default)."""

    streams = True

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self.stream = torch.cuda.Stream(self.device)
        self._drafted: torch.cuda.Event | None = None
        self._released: torch.cuda.Event | None = None

    def _target(self) -> torch.cuda.Stream:
        return torch.cuda.current_stream(self.device)

    def begin_step(self) -> None:
        """Once a step, after its admissions and before its first launch: `released` covers every
        prefill and commit issued so far on the target's stream."""
        self._released = torch.cuda.Event()
        self._released.record(self._target())

    def before_admit(self) -> None:
        """An admission's prefills run on the target's stream and may use the draft model's buffers."""
        if self._drafted is not None:
            self._target().wait_event(self._drafted)

    @contextlib.contextmanager
    def drafting(self) -> Iterator[None]:
        """A draft round's launches, on the draft stream, after the step's `released` event."""
        if self._released is not None:
            self.stream.wait_event(self._released)
        with torch.cuda.stream(self.stream):
            yield
        self._drafted = torch.cuda.Event()
        self._drafted.record(self.stream)

    def before_verify(self) -> None:
        """The target's stream waits for the last draft round before a verification reads its picks."""
        if self._drafted is not None:
            self._target().wait_event(self._drafted)


def step_streams(target_device, draft_device, overlap: bool) -> NoStreams:
    """A DraftStream where the overlapped schedule runs with both models on one CUDA device, else the
    no-op stand-in (no draft model, the CPU, models on two devices: the schedule alone)."""
    if overlap and draft_device is not None:
        target_device, draft_device = torch.device(target_device), torch.device(draft_device)
        if target_device.type == "cuda" and draft_device == target_device and torch.cuda.is_available():
            return DraftStream(target_device)
    return NoStreams()
