"""`seed-tot bench`'s runs as they go: which mode, which run of how many, the time so far and about
how long the rest will take. On a terminal a tqdm bar; elsewhere (a log file, CI) one line per run,
since a bar redrawn with carriage returns is noise in a file. A bench on a loaded machine can take
half an hour; without this it said nothing between its first line and its table."""
from __future__ import annotations

import statistics
import sys
import time

import click
from tqdm import tqdm


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 else \
        f"{seconds // 60}:{seconds % 60:02d}"


class RunProgress:
    """The planned runs, (mode label, "warm-up k of n" / "run k of n") in order, and their progress.
    The estimate: each run left at the mean of its mode's runs so far (warm-ups included: a mode's
    first run may be slower), a mode not run yet at the mean of every run so far."""

    def __init__(self, plan: list[tuple[str, str]], stream=None):
        self.plan, self.stream = plan, stream or sys.stderr
        self.durations: dict[str, list[float]] = {}
        self.done = 0
        self.start = time.perf_counter()
        self._run_start = self.start
        is_terminal = getattr(self.stream, "isatty", lambda: False)()
        self.bar = tqdm(total=len(plan), unit="run", file=self.stream, dynamic_ncols=True,
                        bar_format="{desc}: {n}/{total} runs |{bar}| {elapsed} so far{postfix}") if is_terminal else None

    def begin(self) -> None:
        """The next planned run starts."""
        self._run_start = time.perf_counter()
        if self.bar is not None:
            label, what = self.plan[self.done]
            self.bar.set_description_str(f"bench {label} {what}")

    def left_s(self) -> float | None:
        """About how long the runs not finished yet will take (None before any finished)."""
        every = [d for runs in self.durations.values() for d in runs]
        if not every:
            return None
        overall = statistics.mean(every)
        return sum(statistics.mean(self.durations[label]) if label in self.durations else overall
                   for label, _ in self.plan[self.done:])

    def end(self) -> None:
        """The run begun last has finished."""
        now = time.perf_counter()
        label, what = self.plan[self.done]
        took = now - self._run_start
        self.durations.setdefault(label, []).append(took)
        self.done += 1
        left = self.left_s()
        about = f", about {_clock(left)} left" if left is not None and self.done < len(self.plan) else ""
        if self.bar is not None:
            self.bar.set_postfix_str(about.lstrip(", "))
            self.bar.update(1)
        else:
            click.echo(f"bench: {label} {what}: {took:.1f} s ({self.done} of {len(self.plan)} runs, "
                       f"{_clock(now - self.start)} so far{about})", file=self.stream)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def bench_plan(labels: list[str], repeats: int, warmup: int) -> list[tuple[str, str]]:
    """bench_modes' order: rounds of every mode, each mode's warm-ups just before its first timed run."""
    plan = []
    for i in range(1, repeats + 1):
        for label in labels:
            if i == 1:
                plan += [(label, f"warm-up {k} of {warmup}") for k in range(1, warmup + 1)]
            plan.append((label, f"run {i} of {repeats}"))
    return plan


def few_repeats_warning(repeats: int) -> str | None:
    """Under the table when the medians rest on fewer than 3 timed runs per mode."""
    if repeats >= 3:
        return None
    return (f"note: {repeats} timed run{'s' * (repeats != 1)} per mode: on a machine busy with other work one slow "
            f"stretch sets a mode's figure, so the ratios above are load-sensitive; --repeats 3 or more "
            f"(medians) for figures to compare")
