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

The thread also owns the intra-op thread count of those forwards (cpu_threads.py): before each piece
of work it runs, it applies `CpuThreads`' choice, which looks at the machine every few seconds.
"""
from __future__ import annotations

import threading
from concurrent.futures import Executor, Future, ThreadPoolExecutor

from .cpu_threads import CpuThreads


class ForwardThread(Executor):
    """A one-thread executor that runs a call inline when it is already on its thread (no deadlock
    when a forward-running function calls another)."""

    def __init__(self, name: str = "seed-tot-forward", threads: CpuThreads | None = None, cpu: bool = True):
        self._name = name
        # cpu=False: a GPU engine's step thread, whose forwards run on the device (torch's default stays)
        self.threads = (threads or CpuThreads()) if cpu else None
        self._pool: ThreadPoolExecutor | None = None
        self._ident: int | None = None
        self._lock = threading.Lock()
        self._waiting = 0  # submitted and not started yet

    def _mark(self) -> None:
        self._ident = threading.get_ident()

    @property
    def pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix=self._name, initializer=self._mark)
            return self._pool

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

    def _queue(self, fn, /, *args, **kwargs) -> Future:
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
