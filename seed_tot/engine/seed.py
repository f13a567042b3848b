"""SEED: scheduled speculative execution (the SEED paper's Algorithm 2).

    DraftWorker i (one per sequence, asyncio task)      Verifier (one asyncio task)
      loop: draft a tree            --push-->  VerifyQueue  --pop FCFS-->  target forward,
            wait until verified     <--release------------------------    accept, commit

Why threads under asyncio: the event loop only schedules; every model forward runs in an
executor thread, so the target really computes while other workers draft (torch releases the GIL
inside its kernels). Draft forwards get a pool of `n_workers` threads, the target one thread of
its own. On a GPU each thread also issues its kernels on its own CUDA stream, so draft and target
kernels can overlap on the device instead of queueing on the default stream.
The target never waits for a draft while work is queued: the verifier pops as soon as the queue
is non-empty, and only sleeps on an empty queue.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from .draft_tree import DraftTree
from .params import SamplingParams
from .sequence import Sequence
from .speculative import draft_round, verify_batch_round

log = logging.getLogger(__name__)
MAX_DRAFT_THREADS = 32  # workers beyond this share threads (each still is its own asyncio task)


class SeedError(RuntimeError):
    """A draft worker or the verifier failed; the message names the sequence."""


@dataclass
class VerifyJob:
    seq: Sequence
    tree: DraftTree
    node_entry: dict[int, int]
    enqueued: float
    verified: asyncio.Event = field(default_factory=asyncio.Event)  # the paper's draft label map
    error: BaseException | None = None


class VerifyQueue:
    """The FCFS deque between draft workers and the target."""

    def __init__(self) -> None:
        self._items: collections.deque[VerifyJob] = collections.deque()
        self._ready = asyncio.Condition()
        self._closed = False

    def __len__(self) -> int:
        return len(self._items)

    async def push(self, job: VerifyJob) -> None:
        async with self._ready:
            self._items.append(job)
            self._ready.notify()

    async def pop(self, max_jobs: int) -> list[VerifyJob] | None:
        """Up to max_jobs jobs in arrival order; None once closed and drained."""
        async with self._ready:
            await self._ready.wait_for(lambda: self._items or self._closed)
            if not self._items:
                return None
            return [self._items.popleft() for _ in range(min(max_jobs, len(self._items)))]

    async def close(self) -> None:
        async with self._ready:
            self._closed = True
            self._ready.notify_all()


class _Streams:
    """One CUDA stream per executor thread (no-op on CPU)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._local = threading.local()

    def run(self, fn, *args):
        if not self.cuda:
            return fn(*args)
        stream = getattr(self._local, "stream", None)
        if stream is None:
            stream = self._local.stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            out = fn(*args)
            stream.synchronize()  # results (q, KV) are read from other threads' streams next
        return out


class SeedScheduler:
    def __init__(self, engine, params: SamplingParams, k_config: tuple[int, ...],
                 n_workers: int | None = None, verify_batch: int = 1):
        if n_workers is not None and n_workers <= 0:
            raise ValueError(f"n_workers must be positive, got {n_workers}")
        if verify_batch <= 0:
            raise ValueError(f"verify_batch must be positive, got {verify_batch}")
        self.engine, self.params, self.k_config = engine, params, k_config
        self.n_workers, self.verify_batch = n_workers, verify_batch
        self.events: list[dict] = []
        self._t0 = 0.0

    def _now(self) -> float:
        return time.perf_counter() - self._t0

    async def run(self, seqs: list[Sequence]) -> None:
        self._t0 = time.perf_counter()
        # event times are relative to this instant; its absolute clock lets a trace place them exactly
        self.events.append({"type": "start", "t": 0.0, "clock": self._t0})
        n_workers = min(self.n_workers or len(seqs), len(seqs))
        n_threads = min(n_workers, MAX_DRAFT_THREADS)
        streams = _Streams(self.engine.target.device)
        queue = VerifyQueue()
        slots = asyncio.Semaphore(n_workers)
        with ThreadPoolExecutor(n_threads, thread_name_prefix="seed-draft") as draft_pool, \
                ThreadPoolExecutor(1, thread_name_prefix="seed-target") as target_pool:
            workers = [asyncio.create_task(self._draft_worker(seq, queue, slots, draft_pool, streams),
                                           name=f"draft-worker-{seq.index}") for seq in seqs]
            verifier = asyncio.create_task(self._verifier(queue, target_pool, streams), name="verifier")
            try:
                await asyncio.gather(*workers)
            except BaseException:
                for task in workers + [verifier]:
                    task.cancel()
                await asyncio.gather(*workers, verifier, return_exceptions=True)
                raise
            await queue.close()
            await verifier
        for seq in seqs:
            seq.stats.events = self.events

    async def _draft_worker(self, seq: Sequence, queue: VerifyQueue, slots: asyncio.Semaphore,
                            pool: ThreadPoolExecutor, streams: _Streams) -> None:
        loop = asyncio.get_running_loop()
        engine = self.engine
        async with slots:
            while not seq.done:
                start = self._now()
                try:
                    tree, node_entry = await loop.run_in_executor(
                        pool, streams.run, draft_round, engine.draft, seq, self.k_config, self.params,
                        engine.vocab_size)
                except Exception as err:
                    raise SeedError(f"draft worker for sequence {seq.index} failed: {err!r}") from err
                end = self._now()
                self.events.append({"type": "draft", "worker": seq.index, "start": start, "end": end,
                                    "tokens": len(tree)})
                job = VerifyJob(seq, tree, node_entry, end)
                await queue.push(job)
                self.events.append({"type": "enqueue", "worker": seq.index, "t": self._now(), "queue_len": len(queue)})
                await job.verified.wait()
                if job.error is not None:
                    raise SeedError(f"verification of sequence {seq.index} failed: {job.error!r}") from job.error

    async def _verifier(self, queue: VerifyQueue, pool: ThreadPoolExecutor, streams: _Streams) -> None:
        loop = asyncio.get_running_loop()
        engine = self.engine
        while True:
            jobs = await queue.pop(self.verify_batch)
            if jobs is None:
                return
            self.events.append({"type": "queue", "t": self._now(), "queue_len": len(queue)})
            start = self._now()
            try:
                accepted = await loop.run_in_executor(
                    pool, streams.run, verify_batch_round, engine.target,
                    [(j.seq, j.tree, j.node_entry) for j in jobs], self.params, engine.vocab_size)
            except Exception as err:  # hand the failure to the waiting workers, who raise it
                for job in jobs:
                    job.error = err
                    job.verified.set()
                continue
            end = self._now()
            for job, acc in zip(jobs, accepted):
                self.events.append({"type": "verify", "worker": job.seq.index, "start": start, "end": end,
                                    "enqueued": job.enqueued, "accepted": len(acc.path),
                                    "resampled": acc.resampled, "batch": len(jobs)})
                job.verified.set()

