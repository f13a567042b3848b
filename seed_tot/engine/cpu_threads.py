"""How many intra-op threads an engine's CPU forwards run on: chosen for the work and the machine,
and chosen again while a run goes on.

torch runs a forward's kernels on an OpenMP team, and every parallel region ends at a barrier that
waits for the team's slowest thread. With another busy process on the cores, the OS parks one of
our threads for a whole time slice now and then, and the region waits for it: on a 2-core machine
beside one PyTorch process multiplying 256x256 matrices, a decode of the embedded SmolLM2-135M ran
8x slower with torch's default 2 threads, and 1.3x with one (docs/engine.md, "CPU threads"). So the
engine runs as many threads as there are cores nobody else is using, and never more than the work
can use:

- cores: those this process may run on (`os.sched_getaffinity`), and no more than a cgroup CPU quota
  allows (a container's `cpu.max`);
- others' use: CPU time spent on those cores by every other process, from /proc/stat's counters less
  this process's own time, over the stretch since the last look (the first look, with no stretch
  behind it yet, reads the 1-minute load average instead);
- the work: a parallel region has to carry more arithmetic than it costs to wake a second thread and
  meet it at the barrier (microseconds), or a second thread only adds that cost. A decode step's
  matmuls carry about (parameters x query tokens) multiply-adds; below `MIN_WORK_PER_THREAD` per
  thread (the tests' models with a hidden size of 64) one thread is faster; SmolLM2-135M at one
  token carries about 135M, where two threads beat one by 20% on an idle 2-core machine.

Pinning: `--threads N` (the CLI sets $SEED_TOT_THREADS, which child processes, pipeline stages and a
local Ray cluster's actors, inherit) fixes the count. $OMP_NUM_THREADS, set by a user or by Ray for
an actor (its num_cpus), caps it: the automatic choice stays within it.

`torch.set_num_threads` sets the calling thread's OpenMP team size, so the choice is applied on the
thread that runs the forwards: the engine's `ForwardThread` asks `CpuThreads.update` before each
piece of work it runs (a step of the step loop), which looks at the machine at most every `recheck_s`
seconds (reading /proc/stat takes microseconds).
"""
from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

PIN_ENV = "SEED_TOT_THREADS"
CAP_ENV = "OMP_NUM_THREADS"
# multiply-adds per forward that a second thread needs before it pays (see the module docstring):
# about 0.2-0.5 ms of one core's arithmetic, against the few microseconds of waking a thread
MIN_WORK_PER_THREAD = 8_000_000
# others' CPU use below this (in cores) is background noise (daemons, a shell) that does not park a thread
BACKGROUND = 0.2
RECHECK_S = 2.0
MIN_WINDOW_S = 0.05  # the shortest stretch /proc/stat's 10 ms ticks measure a load over
PROC_STAT = Path("/proc/stat")
CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


def choose_threads(cores: int, others_busy: float, work: int | None = None, cap: int | None = None) -> int:
    """Intra-op threads for forwards of `work` multiply-adds (None: not known yet) on `cores` cores
    of which other processes keep `others_busy` busy, at most `cap`: the cores left free (noise of
    up to BACKGROUND cores ignored), no more than the work can use, and never fewer than one."""
    free = math.floor(cores - max(others_busy - BACKGROUND, 0.0) + 1e-9)
    threads = min(cores, free)
    if work is not None:
        threads = min(threads, work // MIN_WORK_PER_THREAD)
    if cap is not None:
        threads = min(threads, cap)
    return max(1, threads)


def share(cores: int, processes: int) -> int:
    """One process's threads when `processes` engines on one machine split its `cores` evenly
    (pipeline stages, Ray actors): none spins against another."""
    return max(1, cores // max(processes, 1))


def _cgroup_cores() -> int | None:
    """A cgroup v2 CPU quota in whole cores (rounded up), or None where none is set or readable."""
    try:
        quota, period = CPU_MAX.read_text(encoding="ascii").split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    return max(1, math.ceil(int(quota) / int(period)))


def usable_cores() -> list[int]:
    """The CPUs this process may run on (all of them where affinity is unknown)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return list(range(os.cpu_count() or 1))


def _busy_jiffies(cpus: list[int]) -> float | None:
    """Busy time (seconds) of `cpus` since boot from /proc/stat, or None where it cannot be read."""
    try:
        lines = PROC_STAT.read_text(encoding="ascii").splitlines()
    except OSError:
        return None
    wanted, busy = {f"cpu{c}" for c in cpus}, 0
    for line in lines:
        if not line.startswith("cpu"):  # the per-CPU lines come first; the rest (intr: thousands of counters) is not needed
            break
        name, *values = line.split()
        if name in wanted:
            numbers = [int(v) for v in values]
            # user nice system idle iowait irq softirq steal guest guest_nice: guest time is already in user
            busy += sum(numbers[:8]) - numbers[3] - numbers[4]
            wanted.discard(name)
    if wanted:
        return None
    return busy / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    times = os.times()
    return times.user + times.system


def _int_env(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"${name}={value!r}: expected a whole number of threads") from None
    if number < 1:
        raise ValueError(f"${name}={value!r}: expected at least 1 thread")
    return number


@dataclass
class CpuLoad:
    """Other processes' CPU use on this process's cores, measured between successive `sample` calls."""

    cpus: list[int] = field(default_factory=usable_cores)
    _last: tuple[float, float, float] | None = None  # (wall, busy of the cpus, own cpu)
    _estimate: float | None = None  # the last sample's

    @property
    def cores(self) -> int:
        quota = _cgroup_cores()
        return min(len(self.cpus), quota) if quota else len(self.cpus)

    def sample(self) -> float:
        """Cores kept busy by other processes since the last sample. The first (no stretch behind it
        yet), and every one where /proc/stat cannot be read, reads the 1-minute load average; one
        within MIN_WINDOW_S of the last repeats it (the counters tick every 10 ms)."""
        now, busy, own = time.monotonic(), _busy_jiffies(self.cpus), _own_cpu_s()
        if busy is None or self._last is None:
            self._last = (now, busy, own) if busy is not None else None
            self._estimate = _load_average()
        elif now - self._last[0] >= MIN_WINDOW_S:
            last, self._last = self._last, (now, busy, own)
            # rounding of the ticks can put it a little outside [0, cores]
            self._estimate = min(max((busy - last[1] - (own - last[2])) / (now - last[0]), 0.0), float(len(self.cpus)))
        return self._estimate


def _load_average() -> float:
    try:
        return max(0.0, os.getloadavg()[0])
    except (AttributeError, OSError):  # no load average (Windows)
        return 0.0


@dataclass
class CpuThreads:
    """The intra-op thread count of one engine's forwards (its `ForwardThread` applies it).

    pinned: a fixed count (None: $SEED_TOT_THREADS, else automatic). work: multiply-adds of the
    smallest forward that matters (a decode step's: parameters x 1 token), set once the models load."""

    pinned: int | None = None
    work: int | None = None
    recheck_s: float = RECHECK_S
    load: CpuLoad = field(default_factory=CpuLoad)
    threads: int | None = None  # the count applied last (None: none applied yet)
    others_busy: float = 0.0
    changes: int = 0
    low: int | None = None
    high: int | None = None
    cap: int | None = field(init=False, default=None)  # $OMP_NUM_THREADS
    _checked: float = -math.inf

    def __post_init__(self):
        if self.pinned is None:
            self.pinned = _int_env(PIN_ENV)
        elif self.pinned < 1:
            raise ValueError(f"threads must be at least 1, got {self.pinned}")
        self.cap = _int_env(CAP_ENV)

    @property
    def setting(self) -> str:
        if self.pinned is not None:
            return f"pinned {self.pinned}"
        return f"auto (at most {self.cap}, ${CAP_ENV})" if self.cap is not None else "auto"

    def choose(self) -> int:
        if self.pinned is not None:
            return self.pinned
        self.others_busy = self.load.sample()
        return choose_threads(self.load.cores, self.others_busy, self.work, self.cap)

    def update(self, set_threads) -> None:
        """Apply the count on the calling thread (`set_threads`: torch.set_num_threads) when it is due
        for a look and differs from the one in effect."""
        now = time.monotonic()
        if now - self._checked < self.recheck_s:
            return
        self._checked = now
        threads = self.choose()
        if threads == self.threads:
            return
        if self.threads is not None:
            self.changes += 1
            log.info("CPU threads %d -> %d (other processes busy on %.1f of %d cores)", self.threads, threads,
                     self.others_busy, self.load.cores)
        set_threads(threads)
        self.threads = threads
        self.low, self.high = min(self.low or threads, threads), max(self.high or threads, threads)

    def recheck(self) -> None:
        """Look at the machine again at the next `update` (the work changed: models loaded)."""
        self._checked = -math.inf

    def report(self) -> dict:
        """For summaries and `bench`: the setting, the count now, the range used and how often it moved."""
        return {"setting": self.setting, "threads": self.threads, "min": self.low, "max": self.high,
                "changes": self.changes, "cores": self.load.cores}

    def describe(self) -> str:
        """One phrase for a person, e.g. "2 (auto, 1-2 used, 3 changes, 2 cores)"."""
        used = f"{self.low}-{self.high} used, " if self.low != self.high else ""
        return f"{self.threads} ({self.setting}, {used}{self.changes} changes, {self.load.cores} cores)"


def model_work(model) -> int:
    """A decode step's multiply-adds on `model`: about one per parameter for one query token."""
    return sum(p.numel() for p in model.parameters())
