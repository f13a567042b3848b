"""On a CPU, one thread runs every model forward of an engine, and loads its models too.

torch runs a forward's kernels on a libgomp (OpenMP) team that belongs to the calling thread, and the
team's workers spin between the thousands of small parallel regions of a decode step. libgomp counts
the workers of every team in the process, idle ones included, and once they outnumber the CPUs it
cuts that spinning to about 100 iterations ("throttled"), so every region pays a futex wake-up. So a
second thread that has ever run a parallel region slows the first one down, even while it sleeps,
and loading counts too: it dequantizes and copies tensors in parallel regions, which leaves the
loading thread a team. On the 2-core CPU either one made a decode forward more than twice as slow
(docs/benchmarks.md, "Figures behind the code's design choices").

So an engine whose target is on the CPU owns one `ForwardThread`, and everything that runs torch
work on its models goes through it: loading (`Engine.from_pretrained`, synthetic engines), prefill,
the scheduler's step loop (seed.py: drafting and verification of every mode), and drafter training
(`engine.on_forward_thread`). Engines over the same models share it (`Engine(..., forward_thread=)`).
An Engine built from models the caller loaded on its own thread still works, only slower. On a GPU
the step loop gets a thread of its own (seed.py says why drafting and verification share it there too).

Stopping (Ctrl-C, seed_tot/interrupt.py): `stop()` refuses new work, and the work running on the
thread ends at its next step: the step loop fails its calls (seed.py) and long jobs call `stop_point()`
between their steps (drafter training). A signal belongs to the process, so `stop_all()` reaches every
forward thread it has; `drain_all()` waits for them to finish what they run, so that the interpreter
never exits (and destroys torch's threads) while a forward still runs.

The thread also owns the intra-op thread count of those forwards (cpu_threads.py): before each piece
of work it runs, it applies `CpuThreads`' choice, which looks at the machine every few seconds.
"""
from __future__ import annotations

import threading
import time
import weakref
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import ClassVar


from .cpu_threads import CpuThreads


class EngineStopped(RuntimeError):
    """The process is stopping (Ctrl-C): work on an engine's threads ended at its next step."""


class ForwardThread(Executor):
    """A one-thread executor that runs a call inline when it is already on its thread (no deadlock
    when a forward-running function calls another)."""

    # every forward thread of the process, for stop_all: a Ctrl-C stops them all (weak: an engine
    # that is gone takes its thread along)
    _live: ClassVar[weakref.WeakSet] = weakref.WeakSet()

    def __init__(self, name: str = "seed-tot-forward", threads: CpuThreads | None = None, cpu: bool = True):
        self._name = name
        # cpu=False: a GPU engine's step thread, whose forwards run on the device (torch's default stays)
        self.threads = (threads or CpuThreads()) if cpu else None
        self._pool: ThreadPoolExecutor | None = None
        self._ident: int | None = None
        self._lock = threading.Lock()
        self._waiting = 0  # submitted and not started yet
        self._stopped = threading.Event()
        ForwardThread._live.add(self)

    @property
    def pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                # the pool's thread keeps its initializer for its whole life: a bound method there would keep
                # this object, and so the pool, alive for good, and with them the OS thread and its OpenMP
                # team; a weak reference lets the thread end once the engine that owns this is gone
                self._pool = ThreadPoolExecutor(1, thread_name_prefix=self._name, initializer=_mark,
                                                initargs=(weakref.ref(self),))
            return self._pool

    def runs_on(self, thread: threading.Thread) -> bool:
        return self._ident is not None and thread.ident == self._ident

    def on_thread(self) -> bool:
        return self._ident is not None and threading.get_ident() == self._ident

    def submit(self, fn, /, *args, **kwargs) -> Future:
        if self.on_thread():
            future: Future = Future()
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as err:  # handed to the caller through the future, as a pool would
                future.set_exception(err)
            return future
        return self._queue(fn, *args, **kwargs)

    def defer(self, fn, /, *args) -> Future:
        """fn(*args) queued behind the work submitted so far, even from the thread itself: a step loop
        queues its next step this way, so other work on the thread (another engine's steps, a load)
        takes its turn in between instead of waiting for the loop to end."""
        return self._queue(fn, *args)

    def waiting(self) -> int:
        """Work submitted to the thread that has not started yet."""
        return self._waiting

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    def stop(self) -> None:
        """Refuse new work from now on; what runs ends at its next step (the step loop and
        `stop_point` read this). Work already queued still runs: a queued step must run to fail the
        calls that wait on it."""
        self._stopped.set()

    def drain(self, timeout: float) -> bool:
        """Wait up to `timeout` s for the work queued so far to end; whether it did."""
        with self._lock:
            pool = self._pool
        if pool is None:
            return True
        try:
            pool.submit(lambda: None).result(timeout=max(timeout, 0.0))  # FIFO: behind everything queued
        except FutureTimeout:
            return False
        except RuntimeError:  # the pool is shut down already: its thread ended or is ending
            return True
        return True

    def _queue(self, fn, /, *args, **kwargs) -> Future:
        if self._stopped.is_set():
            raise EngineStopped(f"{self._name} is stopping: no new work")
        with self._lock:
            self._waiting += 1
        try:
            return self.pool.submit(self._started, fn, *args, **kwargs)
        except BaseException:
            with self._lock:
                self._waiting -= 1
            raise

    def _started(self, fn, /, *args, **kwargs):
        with self._lock:
            self._waiting -= 1
        import torch  # here, not at import: this module is light

        if self.threads is not None:  # on this thread: torch's count is the calling thread's OpenMP team size
            self.threads.update(torch.set_num_threads)
        return fn(*args, **kwargs)

    def call(self, fn, *args, **kwargs):
        """fn(*args) on the forward thread; blocks until it returns (or raises) here."""
        return self.submit(fn, *args, **kwargs).result()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """The engine's thread lives as long as the engine; schedulers that borrow it must not stop it."""


def _mark(ref: "weakref.ref[ForwardThread]") -> None:
    """The pool thread's initializer: its ForwardThread learns which thread it runs on."""
    thread = ref()
    if thread is not None:
        thread._ident = threading.get_ident()


def stop_all() -> None:
    """Stop every forward thread of the process (Ctrl-C): see `ForwardThread.stop`."""
    for thread in list(ForwardThread._live):
        thread.stop()


def drain_all(timeout: float) -> bool:
    """Wait up to `timeout` s in all for every forward thread to end its work; whether all did."""
    deadline = time.monotonic() + timeout
    return all([thread.drain(deadline - time.monotonic()) for thread in list(ForwardThread._live)])


def stop_point() -> None:
    """Raise EngineStopped when called on a forward thread that was stopped: long work running on the
    thread (drafter training) calls it between steps, so a Ctrl-C ends it there."""
    for thread in list(ForwardThread._live):
        if thread.on_thread() and thread.stopped:
            raise EngineStopped("stopped")
