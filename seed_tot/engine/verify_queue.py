"""What SEED's step loop (seed.py) keeps between steps: each generate call's rows and timeline, and
the FCFS queue of drafts waiting for the target."""
from __future__ import annotations

import collections
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable

from .draft_tree import DraftTree
from .policies import DraftPolicy
from .sequence import Sequence


@dataclass
class Call:
    """One generate call's rows, settings and timeline (events are relative to its own start)."""

    seqs: list[Sequence]
    policy: DraftPolicy | None  # None: draft nothing (plain target steps)
    verify_batch: int | None  # the call's DecodeSpec limits: None is every one
    draft_batch: int | None
    n_workers: int  # rows of this call live at once
    prepare: Callable[[], None] | None  # its prefill, run on the step thread when it is admitted
    future: Future = field(default_factory=Future)
    t0: float = field(default_factory=time.perf_counter)
    events: list[dict] = field(default_factory=list)
    waiting: collections.deque = field(default_factory=collections.deque)  # rows not started yet
    live: int = 0

    def now(self) -> float:
        return time.perf_counter() - self.t0

    @property
    def over(self) -> bool:
        """Finished, failed or cancelled by its caller: its rows are dropped wherever they wait."""
        return self.future.done()


@dataclass
class VerifyJob:
    seq: Sequence
    tree: DraftTree
    node_entry: dict[int, int]
    enqueued: float
    call: Call


class VerifyQueue:
    """The FCFS deque between the draft workers and the target (the step thread's alone: no lock)."""

    def __init__(self) -> None:
        self._items: collections.deque[VerifyJob] = collections.deque()

    def __len__(self) -> int:
        return len(self._items)

    def push(self, job: VerifyJob) -> None:
        self._items.append(job)

    def drop_ended(self) -> None:
        """Drop the jobs of calls that are over."""
        self._items = collections.deque(job for job in self._items if not job.call.over)

    def pop(self, at_most: int) -> list[VerifyJob]:
        """The head job and the jobs behind it, up to the head's call's verify_batch and `at_most`."""
        limit = self._items[0].call.verify_batch
        n = min(at_most, len(self._items) if limit is None else limit, len(self._items))
        return [self._items.popleft() for _ in range(n)]
