"""SEED: scheduled speculative execution (the SEED paper's Algorithm 2), as one step loop for every mode.

    callers (any thread, any event loop)     the step loop (one thread: the engine's forward thread)
      submit(seqs, policy, spec) ──────────>   admit:  prefill each new call, start up to n_workers rows
      wait for the call's future <──────────   draft:  every row ready to draft, one batched draft round
                                               verify: the FCFS VerifyQueue, one target forward per
                                                       verify_batch jobs: accept, commit, observe

Every row is one of the paper's draft workers: it drafts a tree, pushes it into the one FCFS
VerifyQueue, waits for its verification and drafts again. One `SeedScheduler` per engine serves every
concurrent call, so rows of different calls (different ToT problems) share draft and target forwards
up to the head job's draft_batch / verify_batch. A row joins when its call starts and leaves when it
stops; each keeps its own generator and sampling params, so what it generates never depends on what
shares its forwards.

Every mode is a setting of this loop, a batch of one being a batch:
    parallel  policy None: each round is an empty tree, one plain decode step; rows share forwards
    ar        policy None, one row of the call at a time (n_workers = verify_batch = 1)
    sd, mcsd  a chain / tree policy, one row at a time
    seed      any policy, every row at once; `seed@db1@vb1` is the paper's one draft and one
              verification per forward
A policy that drafts without the draft model (`lookup`) drafts inline when its row becomes ready.

Two schedules of a step (`SeedScheduler.overlap`):
    in turn      draft every ready row, then verify every queued job, this step's drafts included:
                 the target waits for the draft model's round (the default on the CPU)
    overlapped   launch the verification of the jobs queued before this step, then draft the ready
                 rows, then read the decisions back: the rows split into two halves, one verified while
                 the other drafts, and the target verifies back to back (SEED's rounds; the default
                 on CUDA, where the draft model's forwards run on a stream of their own:
                 draft_stream.py). A step that finds nothing queued drafts, then verifies the first half
                 of its drafts and keeps the rest queued for the next step, which is how the halves form.
Both read the device once per verification; per row the order of draws (draft, then verify) and so
every row's output is the same in both.

Why one thread and no event loop in between: each step would otherwise cross threads twice (a
forward thread hands its results to an event loop, which wakes the workers, which queue the next
forward), and that hand-off is host time paid on every step while the device waits. Here steps follow
each other on the thread while nothing else waits for it; when something does, the next step queues
behind it (`ForwardThread.defer`), so other work still takes its turn. On a CPU the thread is the engine's forward thread (forward_thread.py says why
one thread must run every forward there). On a GPU it is a thread of the scheduler's own, which
issues both models' launches one at a time: an eager forward there is bound by the host's launches,
so one thread gains nothing from more of them. What the overlapped schedule adds is order, not
threads: the target's verification is launched before the draft round and read back after it, the
draft's forwards on a stream of their own, so the device runs both at once; with CUDA graphs each is
one replay, and the host's cost of a step is the two replays and the one read.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
import warnings
from concurrent.futures import Future, InvalidStateError
from typing import Callable

from . import row_attention
from .decode_spec import DecodeSpec
from .draft_stream import NoStreams, overlap_default, step_streams
from .draft_tree import DraftTree
from .forward_thread import EngineStopped, ForwardThread
from .policies import DraftPolicy, FixedPolicy
from .sequence import Sequence
from .speculative import accept_rows, draft_rows, score_rows
from .verify_queue import Call, VerifyJob, VerifyQueue

log = logging.getLogger(__name__)


class SeedError(RuntimeError):
    """A draft round or a verification failed; the message names the sequence."""


class SeedScheduler:
    """An engine's step loop. `submit` is thread-safe; everything else runs on the step thread."""

    def __init__(self, engine, executor: ForwardThread | None = None, overlap: bool | None = None):
        self.engine = engine
        self._executor = executor or engine.forward_thread or ForwardThread("seed-step", cpu=False)
        self._lock = threading.Lock()
        self._incoming: list[Call] = []
        self._step_queued = False  # a step is queued or running: a kick need not queue another
        self._calls: list[Call] = []  # from here on, the step thread's state
        self._queue = VerifyQueue()
        self._to_draft: collections.deque[tuple[Sequence, Call]] = collections.deque()
        self._in_step = False
        self._held: list = []  # model runtimes whose config names row attention while this loop has calls
        self._empty_tree = DraftTree.empty(engine.vocab_size)  # every plain step's draft (never changed)
        self._streams: NoStreams = NoStreams()
        self.overlap = overlap_default(_device(getattr(engine, "target", None)), overlap)

    @property
    def overlap(self) -> bool:
        """Whether a step verifies the jobs queued before it while the ready rows draft (the module doc)."""
        return self._overlap

    @overlap.setter
    def overlap(self, on: bool) -> None:
        """Set between steps (a call in flight goes on in the other schedule from its next step)."""
        self._streams.before_verify()  # nothing launched on the old draft stream is left unordered
        self._overlap = bool(on)
        draft = getattr(self.engine, "draft", None)
        # a drafter that reads the target's hidden states reads what the target's stream writes in the
        # same step (target_features.py): it keeps one stream, the schedule alone
        if getattr(self.engine, "target_hidden", None) is not None:
            draft = None
        self._streams = step_streams(_device(getattr(self.engine, "target", None)),
                                     None if draft is None else _device(draft), self._overlap)

    @property
    def active_calls(self) -> int:
        """Calls submitted and not over yet."""
        with self._lock:
            return sum(not call.over for call in self._incoming + self._calls)

    @property
    def executor(self) -> ForwardThread:
        return self._executor

    def submit(self, seqs: list[Sequence], policy: DraftPolicy | tuple[int, ...] | None, spec: DecodeSpec,
               prepare: Callable[[], None] | None = None) -> Future:
        """Start generating every sequence of one call; the future's result is the call's event timeline.
        policy None: no drafting, one target step per round (the sequences need no draft cache); a
        k_config is the `fixed` policy of that shape. spec: the call's DecodeSpec with its batch sizes
        decided (Engine._resolved); its n_workers, verify_batch and draft_batch are what this loop reads.
        prepare: run on the step thread before the call's first round (its prefill)."""
        if policy is not None and not isinstance(policy, DraftPolicy):
            policy = FixedPolicy(policy)
        call = Call(seqs, policy, spec.verify_limit, spec.draft_limit, min(spec.n_workers or len(seqs), len(seqs)),
                     prepare)
        call.waiting.extend(seqs)
        # event times are relative to this instant; its absolute clock lets a trace place them exactly
        call.events.append({"type": "start", "t": 0.0, "clock": call.t0})
        with self._lock:
            self._incoming.append(call)
        self._kick()
        return call.future

    async def run(self, seqs: list[Sequence], policy, spec: DecodeSpec | None = None, *,
                  prepare: Callable[[], None] | None = None, **batches) -> list[dict]:
        """`submit`, awaited (cancelling the awaiting task cancels the call). The older keywords
        n_workers=, verify_batch=, draft_batch= (default 1) still build a spec."""
        import asyncio
        if spec is None:
            warnings.warn("SeedScheduler.run(n_workers=, verify_batch=, draft_batch=) is deprecated: pass spec=DecodeSpec(...)",
                          DeprecationWarning, stacklevel=2)
            spec = DecodeSpec(**{"verify_batch": 1, "draft_batch": 1, **batches})
        elif batches:
            raise TypeError(f"pass the batch settings in spec, not as {', '.join(batches)}")
        return await asyncio.wrap_future(self.submit(seqs, policy, spec, prepare))

    def wait(self, future: Future) -> list[dict]:
        """The call's result, for a synchronous caller. On the step thread itself (work running there
        calls generate: drafter training) no queued step could run before this returns, so the steps
        run here until the call is over."""
        if self._executor.on_thread():
            if self._in_step:
                raise RuntimeError("generate was called from inside a decoding step")
            while not future.done():
                self._guarded_step()
            self._kick()  # other calls' steps go on behind this thread's work
        try:
            return future.result()
        except BaseException:  # Ctrl-C in the waiting caller: cancel its call, not the others
            future.cancel()
            raise

    # ------------------------------------------------------------------ the loop
    def _kick(self) -> None:
        """Queue a step unless one is queued or running (that one queues the next when it ends)."""
        with self._lock:
            if self._step_queued or not (self._incoming or self._calls):
                return
            self._step_queued = True
        try:
            self._executor.defer(self._step)
        except Exception as err:  # the executor refuses work (the interpreter is exiting): every caller gets it
            with self._lock:
                self._step_queued = False
            self._fail_all(err)

    def _step(self) -> None:
        """Steps, one after another while nothing else waits for the thread (queueing each step behind
        the last would cost a hand-off per step for nothing); then the next step queues behind that work."""
        while True:
            self._guarded_step()
            with self._lock:
                if not (self._incoming or self._calls) or self._executor.waiting():
                    self._step_queued = False
                    break
        self._kick()

    def _guarded_step(self) -> None:
        if self._executor.stopped:  # Ctrl-C (forward_thread.stop_all): every call ends here, none hangs
            self._fail_all(EngineStopped("the engine stopped (interrupted)"))
            return
        self._in_step = True
        try:
            self._admit()
            self._streams.begin_step()
            if self._overlap:
                self._overlapped_round()
            else:
                self._draft_phase()
                self._verify_phase(len(self._queue))
            live = [c for c in self._calls if not c.over]
            if len(live) < len(self._calls):
                self._drop_rows_of_ended_calls()
            self._calls = live
        except Exception as err:  # a fault of the loop itself, outside any row's round: no caller may hang on it
            log.exception("the SEED step loop failed")
            self._fail_all(err)
        finally:
            self._in_step = False
            if not self._calls:
                self._hold_models(False)

    def _drop_rows_of_ended_calls(self) -> None:
        """Forget the queued rows of calls that are over (one failed in another row, or its caller
        cancelled it after this step queued them): they would hold their sequences, and so their KV
        slots, until some later call's step came to skip them, or for good if none came."""
        self._to_draft = collections.deque(row for row in self._to_draft if not row[1].over)
        self._queue.drop_ended()

    def _admit(self) -> None:
        with self._lock:
            new, self._incoming = self._incoming, []
        if new:
            self._streams.before_admit()
        for call in new:
            if call.over:  # cancelled before it started
                continue
            try:
                if call.prepare is not None:
                    # its prompt scoring, on the call's clock: a trace draws it as the target's work it is
                    for mark in call.prepare() or ():
                        call.events.append({"type": "prefill", "model": mark["model"], "start": mark["start"] - call.t0,
                                            "end": mark["end"] - call.t0, "prompts": len(call.seqs)})
            except Exception as err:
                self._end(call, err)
                continue
            self._calls.append(call)
            self._hold_models(True)
            for _ in range(call.n_workers):
                self._start_next(call)

    def _hold_models(self, hold: bool) -> None:
        """Keep row attention named in the models' configs while there are calls (row_attention.hold):
        naming it once per call, not twice per forward."""
        if hold and not self._held:
            runtimes = (self.engine.target_runtime, self.engine.draft_runtime)
            self._held = [r for r in runtimes if r is not None and row_attention.serves(r.model)]
            for runtime in self._held:
                row_attention.hold(runtime.config)
        elif not hold:
            for runtime in self._held:
                row_attention.release(runtime.config)
            self._held = []

    def _start_next(self, call: Call) -> None:
        if call.waiting and not call.over:
            call.live += 1
            self._ready(call.waiting.popleft(), call)

    def _ready(self, seq: Sequence, call: Call) -> None:
        """`seq` (just admitted or just verified) needs its next round, or leaves."""
        if call.over:
            return
        if seq.done:
            call.live -= 1
            self._start_next(call)
            if call.live == 0:
                self._end(call, None)
            return
        policy = call.policy
        if policy is None:  # a plain target step: nothing to draft, no draft model
            self._push(seq, call, self._empty_tree, {})
        elif policy.uses_draft_model:
            self._to_draft.append((seq, call))
        else:  # prompt lookup: no forward, so it drafts now
            start = call.now()
            try:
                tree, node_entry = draft_rows(None, [(seq, policy)], self.engine.vocab_size,
                                              load=self._verified_beside(call))[0]
            except Exception as err:
                self._end(call, SeedError(f"draft worker for sequence {seq.index} failed: {err!r}"), err)
                return
            self._push(seq, call, tree, node_entry, start)

    def _verified_beside(self, call: Call) -> int:
        """The rows a draft made now is expected to share its target forward with, itself included:
        every row of the step's calls that runs or is about to (a call's n_workers at most), up to
        `call`'s verify_batch. A cost-aware policy prices a drafted token against that forward's plain
        rate; a row drafted on its own (prompt lookup, the suffix source) would otherwise be priced as
        a lone row's step, where any draft looks free."""
        rows = sum(min(c.n_workers, c.live + len(c.waiting)) for c in self._calls if not c.over)
        return max(1, rows if call.verify_batch is None else min(rows, call.verify_batch))

    def _push(self, seq: Sequence, call: Call, tree: DraftTree, node_entry: dict[int, int],
              draft_start: float | None = None) -> None:
        end = call.now()
        if draft_start is not None:
            call.events.append({"type": "draft", "worker": seq.index, "start": draft_start, "end": end,
                                "tokens": len(tree)})
        self._queue.push(VerifyJob(seq, tree, node_entry, end, call))
        call.events.append({"type": "enqueue", "worker": seq.index, "t": call.now(), "queue_len": len(self._queue)})

    def _draft_phase(self) -> None:
        """Every row ready to draft, in batched rounds of the head row's call's draft_batch, FCFS."""
        while self._to_draft:
            limit = self._to_draft[0][1].draft_batch
            n = len(self._to_draft) if limit is None else min(limit, len(self._to_draft))
            batch = [row for row in (self._to_draft.popleft() for _ in range(n)) if not row[1].over]
            if not batch:
                continue
            starts = [call.now() for _, call in batch]
            with self._streams.drafting():
                outcomes = _draft_isolated(self.engine.draft_runtime, batch, self.engine.vocab_size,
                                           self._verified_beside(batch[0][1]))
            for (seq, call), start, outcome in zip(batch, starts, outcomes):
                if isinstance(outcome, Exception):  # confined to this row's call, which raises it naming the row
                    self._end(call, SeedError(f"draft worker for sequence {seq.index} failed: {outcome!r}"), outcome)
                    continue
                self._push(seq, call, *outcome, start)

    def _overlapped_round(self) -> None:
        """The overlapped schedule's step (the module doc): the target's work is launched before the
        draft round, and the decisions are read back after it."""
        queued = len(self._queue)
        if not queued:  # nothing drafted earlier waits: this step's drafts are the target's work
            self._draft_phase()
            fresh = len(self._queue)
            self._verify_phase(fresh - fresh // 2)  # the rest verifies next step, beside the first half's drafts
            return
        launched = self._launch_verifications(queued)
        self._draft_phase()
        self._finish_verifications(launched)

    def _verify_phase(self, count: int) -> None:
        """The first `count` queued jobs, one target forward per head's verify_batch; rows requeued
        meanwhile (plain target steps) wait for the next step."""
        self._finish_verifications(self._launch_verifications(count))

    def _launch_verifications(self, count: int) -> list[tuple[list[VerifyJob], dict[int, float], object]]:
        """Pop `count` queued jobs and launch their target forwards, reading nothing back: per forward
        its jobs, their calls' start times and score_rows' result (or the exception it raised)."""
        launched = []
        remaining = count
        while remaining:
            jobs = self._queue.pop(remaining)
            remaining -= len(jobs)
            jobs = [job for job in jobs if not job.call.over]
            if not jobs:
                continue
            calls = {id(job.call): job.call for job in jobs}.values()
            starts = {id(c): c.now() for c in calls}
            for c in calls:
                c.events.append({"type": "queue", "t": starts[id(c)], "queue_len": len(self._queue)})
            self._streams.before_verify()
            launched.append((jobs, starts, _score_isolated(self.engine.target_runtime, jobs)))
        return launched

    def _finish_verifications(self, launched: list[tuple[list[VerifyJob], dict[int, float], object]]) -> None:
        """Decide, commit and observe each launched forward's jobs (one host read per forward)."""
        for jobs, starts, scored in launched:
            accept_start = time.perf_counter()
            outcomes = _accept_isolated(self.engine.target_runtime, jobs, scored, self.engine.vocab_size)
            if not isinstance(scored, Exception):
                self._report_forward(jobs, scored, time.perf_counter() - accept_start)
            for job, outcome in zip(jobs, outcomes):
                call = job.call
                if isinstance(outcome, Exception):  # confined to this job's call
                    self._end(call, SeedError(f"verification of sequence {job.seq.index} failed: {outcome!r}"),
                              outcome)
                    continue
                if call.over:
                    continue
                if call.policy is not None:
                    try:
                        call.policy.observe(job.seq, job.tree, outcome)
                    except Exception as err:  # the policy's own fault: its call's alone
                        self._end(call, SeedError(f"the draft policy failed after verifying sequence "
                                                  f"{job.seq.index}: {err!r}"), err)
                        continue
                call.events.append({
                    "type": "verify", "worker": job.seq.index, "start": starts[id(call)], "end": call.now(),
                    "enqueued": job.enqueued, "accepted": len(outcome.path), "resampled": outcome.resampled,
                    "batch": len(jobs)})
                self._ready(job.seq, call)

    def _report_forward(self, jobs: list[VerifyJob], scored: list, accept_s: float) -> None:
        """Tell each policy with rows in a verification forward what it cost: rows, query tokens, and
        the seconds of its launch and of deciding (which on a GPU waits for the forward itself)."""
        tokens = sum(row.n_pending + len(job.tree) for job, row in zip(jobs, scored))
        seconds = scored[0].busy_s + accept_s
        # one report per policy state: a declined call's policy shares its owner's (base.DraftPolicy.owner)
        owners = {id(job.call.policy.owner): job.call for job in jobs if job.call.policy is not None}
        for call in owners.values():
            try:
                call.policy.owner.observe_forward(len(jobs), tokens, seconds)
            except Exception as err:  # the policy's own fault: its call's alone
                self._end(call, SeedError(f"the draft policy failed after a verification: {err!r}"), err)

    def _end(self, call: Call, error: BaseException | None, cause: BaseException | None = None) -> None:
        if not any(not c.over for c in self._calls if c is not call):
            self._hold_models(False)  # before the caller wakes: it gets its models back as it gave them
        try:
            if error is None:
                for seq in call.seqs:
                    seq.stats.events = call.events
                call.future.set_result(call.events)
            else:
                error.__cause__ = cause
                call.future.set_exception(error)
        except InvalidStateError:  # its caller cancelled it meanwhile
            pass

    def _fail_all(self, err: BaseException) -> None:
        with self._lock:
            calls, self._incoming = self._incoming + self._calls, []
        self._calls = []
        self._queue = VerifyQueue()
        self._to_draft.clear()
        self._hold_models(False)
        for call in calls:
            self._end(call, err)


def _draft_isolated(runtime, batch: list[tuple[Sequence, Call]], vocab_size: int, load: int | None = None) -> list:
    """One batched draft round of the rows; if it fails, each call's rows are drafted again on their
    own (their draft caches back to where the round began), so one call's fault (its policy, its row)
    cannot end the other calls that shared the round. Per row: (tree, node_entry) or the exception."""
    marks = [len(seq.draft.parents) if seq.draft is not None else 0 for seq, _ in batch]  # no draft model: lookup
    try:
        # picks left on the device are read by the verification's one transfer (verify.py)
        return draft_rows(runtime, [(seq, call.policy) for seq, call in batch], vocab_size, defer_tokens=True,
                          load=load)
    except Exception as err:
        by_call: dict[int, list[int]] = {}
        for i, (_, call) in enumerate(batch):
            by_call.setdefault(id(call), []).append(i)
        if len(by_call) == 1:
            return [err] * len(batch)
        log.warning("a batched draft round of %d calls failed (%r); drafting each call's rows on their own",
                    len(by_call), err)
        for (seq, _), mark in zip(batch, marks):  # what the round fed before it failed is not the rows'
            kv = seq.draft
            if kv is not None and len(kv.parents) > mark:
                kv.keep_entries(list(range(mark)))
                kv.parents = kv.parents[:mark]
        outcomes: list = [None] * len(batch)
        for rows in by_call.values():
            for i, outcome in zip(rows, _draft_isolated(runtime, [batch[i] for i in rows], vocab_size, load)):
                outcomes[i] = outcome
        return outcomes


def _device(model) -> str:
    return str(getattr(model, "device", "cpu"))


def _verify_isolated(runtime, jobs: list[VerifyJob], vocab_size: int) -> list:
    """Verify the jobs in one target forward; a failure ends only the sequences it belongs to.
    Returns an Acceptance or the exception, per job."""
    return _accept_isolated(runtime, jobs, _score_isolated(runtime, jobs), vocab_size)


def _score_isolated(runtime, jobs: list[VerifyJob]):
    """The jobs' target forward (score_rows), or the exception it raised (nothing is committed then)."""
    try:
        return score_rows(runtime, [(j.seq, j.tree, j.node_entry) for j in jobs])
    except Exception as err:
        return err


def _accept_isolated(runtime, jobs: list[VerifyJob], scored, vocab_size: int) -> list:
    """Accept the jobs from their forward's `scored` rows. If the shared forward failed, each job is
    retried alone, so one bad row cannot take down other callers' rows."""
    if isinstance(scored, Exception):
        if len(jobs) == 1:
            return [scored]
        log.warning("a batched verification of %d sequences failed (%r); verifying them one by one", len(jobs), scored)
        return [outcome for job in jobs for outcome in _verify_isolated(runtime, [job], vocab_size)]
    # every row decided at once (one transfer of the decisions), each row's failure its own
    return accept_rows([(j.seq, j.tree, j.node_entry) for j in jobs], scored, vocab_size)
