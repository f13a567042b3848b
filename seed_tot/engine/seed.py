"""SEED: scheduled speculative execution (the SEED paper's Algorithm 2), shared by concurrent callers.

    DraftWorker i (one per sequence, asyncio task)      Verifier (one asyncio task per engine)
      loop: draft a tree            --push-->  VerifyQueue  --pop FCFS-->  target forward,
            wait until verified     <--release------------------------    accept, commit

One `SeedScheduler` per engine and event loop serves every concurrent `agenerate` call: all their
workers push into one FCFS VerifyQueue, so drafts of different calls (different ToT problems)
share target forwards (up to the head job's verify_batch), and workers that are ready together
share draft forwards (batched_draft.DraftBatcher, up to the head request's draft_batch). A
sequence joins when its call starts and leaves when it stops; each keeps its own generator and
sampling params, so what it generates never depends on what else shares its forwards.

A call with policy None drafts nothing: each of its rounds is an empty tree verified by the target,
i.e. one plain decode step per row. That is the `parallel` baseline under continuous batching: its
rows share target forwards with every other queued row (verify_batch None) and never touch a draft
model or draft cache, so an engine without a draft model serves it. A policy that drafts without
the draft model (`lookup`: prompt lookup) is run inline by its worker, which then requeues at once
like a `parallel` row.

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
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from .batched_draft import DraftBatcher
from .decode_spec import DecodeSpec
from .draft_tree import DraftTree
from .forward_thread import after_queued_work
from .policies import DraftPolicy, FixedPolicy
from .sequence import Sequence
from .speculative import accept_row, draft_round, score_rows

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
    call: "_Call"
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

    async def pop(self) -> list[VerifyJob] | None:
        """The head job and the jobs behind it, up to the head's call's verify_batch (None: all),
        in arrival order; None once closed and drained."""
        async with self._ready:
            await self._ready.wait_for(lambda: self._items or self._closed)
            if not self._items:
                return None
            limit = self._items[0].call.verify_batch
            n = len(self._items) if limit is None else min(limit, len(self._items))
            return [self._items.popleft() for _ in range(n)]

    def take_more(self, jobs: list[VerifyJob]) -> list[VerifyJob]:
        """`jobs` (just popped), extended in place with the jobs queued behind them since, up to the
        head's verify_batch (the verifier fails exactly this list if the forward cannot run)."""
        limit = jobs[0].call.verify_batch
        while self._items and (limit is None or len(jobs) < limit):
            jobs.append(self._items.popleft())
        return jobs

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


@dataclass
class _Call:
    """One agenerate call's settings and timeline (events are relative to its own start)."""

    policy: DraftPolicy | None  # None: draft nothing (plain target steps, the parallel baseline)
    verify_batch: int | None  # the call's DecodeSpec limits: None is every one
    draft_batch: int | None
    t0: float = field(default_factory=time.perf_counter)
    events: list[dict] = field(default_factory=list)

    def now(self) -> float:
        return time.perf_counter() - self.t0


class SeedScheduler:
    """The engine's SEED scheduler on one event loop; it runs while at least one call is active."""

    def __init__(self, engine):
        self.engine = engine
        self._active = 0
        self._queue: VerifyQueue | None = None
        self._tasks: list[asyncio.Task] = []

    def _start(self) -> None:
        engine = self.engine
        self._streams = _Streams(engine.target.device)
        self._queue = VerifyQueue()
        # draft_batch=1 workers draft on their own threads (the paper's execution); batched rounds
        # run on one more thread, the target on its own. On a CPU all of them are the engine's one
        # forward thread (forward_thread.py: a second thread's forwards slow both down there).
        shared = engine.forward_thread
        self._draft_pool = shared or ThreadPoolExecutor(MAX_DRAFT_THREADS, thread_name_prefix="seed-draft")
        self._batch_pool = shared or ThreadPoolExecutor(1, thread_name_prefix="seed-draft-batch")
        self._target_pool = shared or ThreadPoolExecutor(1, thread_name_prefix="seed-target")
        self._one_thread = shared is not None
        self._verifying: asyncio.Event | None = None  # set once the verification running now has released its rows
        self._batcher = DraftBatcher(engine.draft, engine.vocab_size, self._batch_pool, self._streams.run,
                                     wait_turn=self._one_thread,
                                     settle=self._verification_settled if self._one_thread else None)
        self._tasks = [asyncio.create_task(self._verifier(self._queue), name="seed-verifier"),
                       asyncio.create_task(self._batcher.run(), name="seed-draft-batcher")]

    def _detach(self) -> tuple[list[asyncio.Task], tuple]:
        """Hand over this run's tasks and pools for `_stop`, leaving the scheduler clean at once (no
        await in between): a call that starts while they wind down builds its own."""
        tasks, self._tasks, self._queue = self._tasks, [], None
        return tasks, (self._draft_pool, self._batch_pool, self._target_pool)

    @staticmethod
    async def _stop(detached: tuple[list[asyncio.Task], tuple]) -> None:
        tasks, pools = detached
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for pool in pools:
            pool.shutdown(wait=False)

    async def run(self, seqs: list[Sequence], policy: DraftPolicy | tuple[int, ...] | None,
                  spec: DecodeSpec | None = None, **batches) -> list[dict]:
        """Generate every sequence of one call; returns the call's event timeline.
        policy None: no drafting, one target step per round (the sequences need no draft cache).
        spec: the call's DecodeSpec with its batch sizes decided (Engine._resolved), checked when it
        was built; its n_workers, verify_batch and draft_batch are what this scheduler reads.
        The older keywords n_workers=, verify_batch=, draft_batch= (default 1) still build one."""
        if spec is None:
            warnings.warn("SeedScheduler.run(n_workers=, verify_batch=, draft_batch=) is deprecated: pass spec=DecodeSpec(...)",
                          DeprecationWarning, stacklevel=2)
            spec = DecodeSpec(**{"verify_batch": 1, "draft_batch": 1, **batches})
        elif batches:
            raise TypeError(f"pass the batch settings in spec, not as {', '.join(batches)}")
        # a k_config is the `fixed` policy of that shape
        if policy is not None and not isinstance(policy, DraftPolicy):
            policy = FixedPolicy(policy)
        call = _Call(policy, spec.verify_limit, spec.draft_limit)
        # event times are relative to this instant; its absolute clock lets a trace place them exactly
        call.events.append({"type": "start", "t": 0.0, "clock": call.t0})
        if self._active == 0:
            self._start()
        self._active += 1
        slots = asyncio.Semaphore(min(spec.n_workers or len(seqs), len(seqs)))
        workers = [asyncio.create_task(self._draft_worker(seq, call, slots), name=f"draft-worker-{seq.index}")
                   for seq in seqs]
        try:
            await asyncio.gather(*workers)
        except BaseException:
            for task in workers:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            raise
        finally:
            self._active -= 1
            if self._active == 0:
                await self._stop(self._detach())
        for seq in seqs:
            seq.stats.events = call.events
        return call.events

    async def _draft_worker(self, seq: Sequence, call: _Call, slots: asyncio.Semaphore) -> None:
        loop = asyncio.get_running_loop()
        engine, queue = self.engine, self._queue  # this run's queue (see _detach)
        async with slots:
            while not seq.done:
                start = call.now()
                try:
                    if call.policy is None:  # a plain target step: nothing to draft, no draft model
                        tree, node_entry = DraftTree.empty(engine.vocab_size), {}
                    elif not call.policy.uses_draft_model:  # prompt lookup: no forward, so no wait for one
                        tree, node_entry = draft_round(None, seq, call.policy, seq.rule.params, engine.vocab_size)
                    elif call.draft_batch == 1:
                        tree, node_entry = await loop.run_in_executor(
                            self._draft_pool, self._streams.run, draft_round, engine.draft, seq, call.policy,
                            seq.rule.params, engine.vocab_size)
                    else:
                        tree, node_entry = await self._batcher.draft(seq, call.policy, call.draft_batch)
                except Exception as err:
                    raise SeedError(f"draft worker for sequence {seq.index} failed: {err!r}") from err
                end = call.now()
                if call.policy is not None:
                    call.events.append({"type": "draft", "worker": seq.index, "start": start, "end": end,
                                        "tokens": len(tree)})
                job = VerifyJob(seq, tree, node_entry, end, call)
                await queue.push(job)
                call.events.append({"type": "enqueue", "worker": seq.index, "t": call.now(),
                                    "queue_len": len(queue)})
                await job.verified.wait()
                if job.error is not None:
                    raise SeedError(f"verification of sequence {seq.index} failed: {job.error!r}") from job.error

    async def _verification_settled(self) -> None:
        """Return once the verification running now (if any) has released its rows (one forward
        thread only). There draft and target forwards cannot overlap, and a batched draft round that
        started while some rows were being verified would split the rows into two groups that then
        alternate for good (A drafts while B verifies, then B drafts while A verifies), each forward
        carrying half the rows. Waiting for that one verification merges them: the rows it frees
        join this draft round. Only the running one: rows that never draft (`parallel` calls)
        requeue at once, and waiting for an empty queue would starve the drafting rows."""
        running = self._verifying
        if running is not None:
            await running.wait()

    async def _verifier(self, queue: VerifyQueue) -> None:
        while True:
            jobs = await queue.pop()
            if jobs is None:
                return
            done = self._verifying = asyncio.Event()
            try:
                await self._verify(jobs, queue)
                await asyncio.sleep(0)  # the released workers run first and queue their next drafts
            except Exception as err:  # outside the forward (e.g. its executor refused the work, as at
                # interpreter exit): the jobs' workers must raise it, or their callers wait forever
                for job in jobs:  # `_verify` extends this list in place with the jobs it took (take_more)
                    if not job.verified.is_set():
                        job.error = err
                        job.verified.set()
            finally:
                if self._verifying is done:  # not a later run's (this task may be winding down)
                    self._verifying = None
                done.set()

    async def _verify(self, jobs: list[VerifyJob], queue: VerifyQueue) -> None:
        """One target forward for `jobs` (and, on one forward thread, the drafts queued while it waited)."""
        if self._one_thread:  # wait for the forward thread: drafts running before us join this forward
            await after_queued_work(self._target_pool)
            jobs = queue.take_more(jobs)
        calls = {id(j.call): j.call for j in jobs}.values()
        starts = {id(c): c.now() for c in calls}
        for c in calls:
            c.events.append({"type": "queue", "t": starts[id(c)], "queue_len": len(queue)})
        outcomes = await asyncio.get_running_loop().run_in_executor(
            self._target_pool, self._streams.run, _verify_isolated, self.engine.target, jobs, self.engine.vocab_size)
        for job, outcome in zip(jobs, outcomes):
            if isinstance(outcome, Exception):  # confined to this job's sequence
                job.error = outcome
            else:
                if job.call.policy is not None:
                    job.call.policy.observe(job.seq, job.tree, outcome)  # on the event loop: no locks needed
                job.call.events.append({
                    "type": "verify", "worker": job.seq.index, "start": starts[id(job.call)],
                    "end": job.call.now(), "enqueued": job.enqueued, "accepted": len(outcome.path),
                    "resampled": outcome.resampled, "batch": len(jobs)})
            job.verified.set()


def _verify_isolated(model, jobs: list[VerifyJob], vocab_size: int) -> list:
    """Verify the jobs in one target forward; a failure ends only the sequences it belongs to.
    If the shared forward fails (nothing is committed then), each job is retried alone, so one bad
    row cannot take down other callers' rows. Returns an Acceptance or the exception, per job."""
    rows = [(j.seq, j.tree, j.node_entry) for j in jobs]
    try:
        scored = score_rows(model, rows, vocab_size)
    except Exception as err:
        if len(jobs) == 1:
            return [err]
        log.warning("a batched verification of %d sequences failed (%r); verifying them one by one", len(jobs), err)
        return [outcome for job in jobs for outcome in _verify_isolated(model, [job], vocab_size)]
    outcomes = []
    for row, score in zip(rows, scored):
        try:
            outcomes.append(accept_row(row, score, None, vocab_size))
        except Exception as err:
            outcomes.append(err)
    return outcomes
