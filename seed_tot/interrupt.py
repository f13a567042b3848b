"""Ctrl-C for the `seed-tot` commands: one stops the command within seconds, a second one at once.

The first SIGINT raises KeyboardInterrupt in the main thread, as Python's own handler does; the
command unwinds (a solve closes results.jsonl, every line of it whole) and then `finish`:
  - stops the engines' threads (forward_thread.stop_all): their work ends at its next step, a model
    being loaded at the end of its load;
  - waits up to GRACE_S for them (drain_all), and for the other threads the command started;
  - prints one line for a person (what was kept, how to go on) and exits 130, as a shell does.
A thread still running after GRACE_S (a large model still loading) would keep the process alive, and
an interpreter that exits under a running torch thread aborts in C++ ("terminate called without an
active exception"): so then the process ends with os._exit, as it does on a second Ctrl-C.
"""
from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time
from typing import Callable

GRACE_S = 5.0  # how long stopped threads may take to reach their next step
EXIT_CODE = 130  # 128 + SIGINT, what a shell reports for a command Ctrl-C ended


class Interrupted(KeyboardInterrupt):
    """A Ctrl-C that knows what the command kept: `line()` words it once the threads have stopped
    (what a stopped thread wrote last counts), e.g. "3 of 10 problems are in ...; --resume finishes"."""

    def __init__(self, line: str | Callable[[], str]):
        super().__init__(line if isinstance(line, str) else "interrupted")
        self._line = line

    def line(self) -> str:
        return self._line if isinstance(self._line, str) else self._line()


class CtrlC:
    """The SIGINT handler while a command runs: the first raises KeyboardInterrupt, the second
    ends the process at once (a stuck stop must never need a third, or a kill)."""

    def __init__(self) -> None:
        self.seen = 0

    def __call__(self, signum, frame) -> None:
        self.seen += 1
        if self.seen > 1:
            _exit_now("seed-tot: interrupted again; stopped at once")
        raise KeyboardInterrupt

    def install(self) -> Callable[[], None]:
        """Handle SIGINT in this process (main thread only, as Python allows); returns the undo."""
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        previous = signal.getsignal(signal.SIGINT)
        if previous is signal.SIG_IGN:  # started with Ctrl-C ignored (nohup, a background job): so it stays
            return lambda: None
        signal.signal(signal.SIGINT, self)
        return lambda: signal.signal(signal.SIGINT, previous)


def _exit_now(line: str) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing more to say there
            pass
    os.write(2, (line + "\n").encode())
    os._exit(EXIT_CODE)


def finish(err: KeyboardInterrupt, default: str = "stopped before it finished") -> None:
    """After a Ctrl-C unwound the command: stop and wait for its threads, print one line, exit 130."""
    from seed_tot.engine.forward_thread import drain_all, stop_all

    stop_all()
    deadline = time.monotonic() + GRACE_S
    stopped = drain_all(GRACE_S)
    for thread in threading.enumerate():  # the command's own (solve's searches): they end on the stopped engine
        if thread is threading.current_thread() or thread.daemon or _forward_thread(thread):
            continue  # a drained forward thread idles until the interpreter ends its pool
        thread.join(max(deadline - time.monotonic(), 0.0))
        stopped = stopped and not thread.is_alive()
    try:
        what = err.line() if isinstance(err, Interrupted) else default
    except (OSError, ValueError):  # describing what was kept must not turn into a traceback
        what = default
    line = f"seed-tot: interrupted; {what}"
    if not stopped:
        _exit_now(line + " (a thread was still busy: ended at once)")
    # Not SystemExit: a Ctrl-C that landed inside exec() of a string (a dataclass or namedtuple being
    # built while a module imports) sets CPython's flag for an unhandled KeyboardInterrupt even though
    # it was handled here, and the interpreter then ends itself by SIGINT (-2, not 130) after its
    # finalisation. So the exit handlers (logging's flush, Ray's shutdown) run here, then the process ends.
    atexit._run_exitfuncs()
    _exit_now(line)


def _forward_thread(thread: threading.Thread) -> bool:
    from seed_tot.engine.forward_thread import ForwardThread

    return any(t.runs_on(thread) for t in list(ForwardThread._live))
