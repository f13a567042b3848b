"""`--trace DIR`: a Chrome / Perfetto timeline of engine calls, GPU counters and a utilization plot.

DIR/trace.json   Chrome trace-event JSON (open in https://ui.perfetto.dev or chrome://tracing):
                 one track per SEED draft worker, one for the target verifier, one with every
                 generate call (a ToT step's thought or value batch), one for sections a caller
                 marks (bench modes), the verify-queue length and the GPU counters.
DIR/gpu.csv      t_s, util_percent, mem_used_mib sampled through NVML (header only without a GPU)
DIR/utilization.png  one panel per mode, like the SEED paper's Fig. 4

Times are seconds since `start()`. SEED events carry times relative to the scheduler's own start,
whose `time.perf_counter()` the scheduler records in its "start" event, so they are placed exactly;
the gap between the call's start and the scheduler's is drawn as "call setup". Prompt scoring is
the engine's "prefill" events, timed around the prefill forwards themselves: the target's on the
verifier track (it is the target's work, and counts in its busy time), the draft's on its own track.
(Events without that clock are aligned so the last one ends when the call returned.)
A verify span is the scheduler's view: from taking the batch off the queue until its rows are
accepted and committed (the step loop runs both on one thread).

A utilization.png panel's title and curve come from the same spans (`_busy_intervals`): the title's
target busy is the curve's mean; bench's figure over every run of the mode sits beside it.
"""
from __future__ import annotations

import contextlib
import csv
import json
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from seed_tot.engine.params import GenerationResult, GenerationStats

log = logging.getLogger(__name__)

SAMPLE_HZ = 40  # NVML polling rate (the brief asks for >= 20 Hz)
BIN_S = 0.05  # bin width of the busy-fraction plot when there are no GPU samples
PID = 1
TID_SECTIONS, TID_CALLS, TID_TARGET, TID_DRAFT_PREFILL, TID_WORKER0 = 1, 2, 3, 4, 100
NO_GPU_LABEL = "target busy (engine events), no GPU"


@dataclass
class _Call:
    label: str
    start: float
    end: float
    prompts: list | None  # as passed to generate: strings or token-id lists
    stats: GenerationStats
    events: list[dict] = field(default_factory=list)


class GpuSampler:
    """Polls GPU utilization and memory through NVML on a daemon thread. NVML's utilization is
    the fraction of its own sample period (1/6 s to 1 s, GPU dependent) in which a kernel ran, so
    polling faster than that shows steps, not more detail."""

    def __init__(self, t0: float, hz: float = SAMPLE_HZ):
        self.t0, self.interval = t0, 1.0 / hz
        self.samples: list[tuple[float, float, float]] = []  # (t_s, util %, memory used MiB)
        self.unavailable: str | None = None
        self.device_name: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        import torch

        # asked first: on a machine without a GPU, installing nvidia-ml-py would change nothing
        if not torch.cuda.is_available():
            self.unavailable = "no CUDA device"
            return
        try:
            import pynvml
        except ImportError:
            self.unavailable = "pynvml is not installed (pip install nvidia-ml-py)"
            return
        try:
            pynvml.nvmlInit()
            handle = _nvml_handle(pynvml, torch)
            self.device_name = str(pynvml.nvmlDeviceGetName(handle))
        except pynvml.NVMLError as err:
            self.unavailable = f"NVML failed: {err}"
            return
        self._nvml = pynvml
        self._thread = threading.Thread(target=self._run, args=(pynvml, handle), name="gpu-sampler", daemon=True)
        self._thread.start()

    def _run(self, pynvml, handle) -> None:
        while not self._stop.is_set():
            try:
                util = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
                mem = pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20
            except pynvml.NVMLError as err:
                log.warning("GPU sampling stopped: %s", err)
                return
            self.samples.append((time.perf_counter() - self.t0, float(util), mem))
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
            self._thread = None
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError as err:
                log.debug("nvmlShutdown failed: %s", err)


def _nvml_handle(pynvml, torch):
    """The NVML handle of torch's current GPU: matched by PCI bus id, because NVML numbers the
    physical GPUs while torch numbers the ones CUDA_VISIBLE_DEVICES leaves visible."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    bus = getattr(props, "pci_bus_id", None)
    if bus is not None:
        bus_id = f"{getattr(props, 'pci_domain_id', 0):08X}:{bus:02X}:{getattr(props, 'pci_device_id', 0):02X}.0"
        try:
            return pynvml.nvmlDeviceGetHandleByPciBusId(bus_id)
        except pynvml.NVMLError:
            log.debug("no NVML device at PCI bus id %s; using NVML device 0", bus_id)
    return pynvml.nvmlDeviceGetHandleByIndex(0)


class TracedEngine:
    """Forwards to an engine and records every `generate` call, with its wall-clock span."""

    def __init__(self, engine, recorder: "TraceRecorder", label: str | None = None):
        self._engine, self._recorder, self._label = engine, recorder, label

    def render_prompt(self, *args, **kwargs) -> str:
        return self._engine.render_prompt(*args, **kwargs)

    def generate(self, prompts, params=None, *args, spec=None, **decode) -> list[GenerationResult]:
        """Engine.generate's arguments, passed on as given (a DecodeSpec or the keyword settings)."""
        start = self._recorder.now()
        results = self._engine.generate(prompts, params, *args, spec=spec, **decode)
        end = self._recorder.now()
        mode = spec.mode if spec is not None else (args[0] if args else decode.get("mode", "ar"))
        self._recorder.add_call(self._label or mode, results, start=start, end=end, prompts=list(prompts))
        return results

    def __getattr__(self, name: str) -> Any:  # target_name, tokenizer, encode, ...
        return getattr(self._engine, name)


class TraceRecorder:
    def __init__(self, dir: Path, name: str):
        self.dir, self.name = Path(dir), name
        self.t0 = time.perf_counter()
        self.calls: list[_Call] = []
        self.sections: list[tuple[str, float, float]] = []
        self.sampler = GpuSampler(self.t0)

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def start(self) -> None:
        self.t0 = self.sampler.t0 = time.perf_counter()
        self.sampler.start()
        if self.sampler.unavailable:
            log.warning("GPU sampling unavailable: %s; the trace has engine events only", self.sampler.unavailable)

    def wrap(self, engine, label: str | None = None) -> TracedEngine:
        """An engine-like object recording each generate call under `label` (default: its mode)."""
        return TracedEngine(engine, self, label)

    def add_call(self, mode: str, results: list[GenerationResult], start: float | None = None,
                 end: float | None = None, prompts: list | None = None) -> None:
        """Record one generate call. Without start/end (a caller that timed nothing) the call is
        taken to have just ended, lasting its measured wall time."""
        from seed_tot.engine import summarize

        stats = summarize(results)
        end = self.now() if end is None else end
        start = end - stats.wall_s if start is None else start
        self.calls.append(_Call(mode, start, end, prompts, stats, list(stats.events)))

    @contextlib.contextmanager
    def section(self, name: str) -> Iterator[None]:
        """Mark a named span (a benchmark mode, a repeat) on its own track."""
        start = self.now()
        try:
            yield
        finally:
            self.sections.append((name, start, self.now()))

    # ------------------------------------------------------------------ output
    def finish(self) -> Path:
        self.sampler.stop()
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / "trace.json"
        trace = {"traceEvents": self.trace_events(), "displayTimeUnit": "ms",
                 "otherData": {"name": self.name, "gpu_sampling": self._gpu_status(),
                               "gpu": self.sampler.device_name or "none"}}
        path.write_text(json.dumps(trace), encoding="utf-8")
        with (self.dir / "gpu.csv").open("w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh)
            writer.writerow(["t_s", "util_percent", "mem_used_mib"])
            writer.writerows((f"{t:.4f}", f"{u:.0f}", f"{m:.1f}") for t, u, m in self.sampler.samples)
        self._plot(self.dir / "utilization.png")
        log.info("trace written to %s (%d calls, %d GPU samples)", path, len(self.calls), len(self.sampler.samples))
        return path

    def written(self) -> str:
        """After finish(): one line naming every file written, and why gpu.csv is empty when it is."""
        files = [self.dir / "trace.json", self.dir / "utilization.png"]
        line = "trace written: " + ", ".join(str(f) for f in files if f.is_file())
        if self.sampler.samples:
            return f"{line}, {self.dir / 'gpu.csv'}"
        reason = self.sampler.unavailable or "no samples were taken"
        return f"{line}, {self.dir / 'gpu.csv'} (header only: no GPU sampled, {reason})"

    def target_busy_fraction(self, label: str) -> float:
        """The target's busy fraction of `label`'s runs, as bench's table and generate's stats line
        define it (GenerationStats.target_busy_fraction: the calls' target_busy_s over the runs' wall
        time). A run is a section a caller marked around it (bench: each timed run), else the span
        from the label's first call to its last."""
        mine = [c for c in self.calls if c.label == label]
        windows = [(start, end) for _, start, end in self.sections
                   if any(start <= c.start and c.end <= end for c in mine)]
        if not windows:
            windows = [(mine[0].start, max(c.end for c in mine))]
        total = GenerationStats()
        for call in mine:
            if any(start <= call.start and call.end <= end for start, end in windows):
                total.add(call.stats)
        total.wall_s = sum(end - start for start, end in windows)
        return total.target_busy_fraction

    def _gpu_status(self) -> str:
        if self.sampler.unavailable:
            return f"unavailable: {self.sampler.unavailable}"
        return f"sampled at {SAMPLE_HZ} Hz ({len(self.sampler.samples)} samples)"

    def trace_events(self) -> list[dict]:
        events: list[dict] = [_meta("process_name", 0, f"seed-tot {self.name}")]
        workers = sorted({e["worker"] for c in self.calls for e in c.events if "worker" in e})
        names = [(TID_SECTIONS, "sections"), (TID_CALLS, "generate calls (ToT steps)"),
                 (TID_TARGET, "target verifier"), (TID_DRAFT_PREFILL, "draft prompt scoring")] + [
                     (TID_WORKER0 + w, f"draft worker {w}") for w in workers]
        for tid, name in names:
            events += [_meta("thread_name", tid, name), _meta("thread_sort_index", tid, sort_index=tid)]
        if self.sampler.unavailable:
            events.append({"ph": "i", "s": "g", "name": "GPU sampling unavailable", "ts": 0, "pid": PID,
                           "tid": TID_CALLS, "args": {"reason": self.sampler.unavailable}})
        for name, start, end in self.sections:
            events.append(_span(TID_SECTIONS, name, start, end))
        for call in self.calls:
            events += self._call_events(call)
        for t, util, mem in self.sampler.samples:
            events.append(_counter("GPU utilization (%)", t, util=util))
            events.append(_counter("GPU memory used (MiB)", t, MiB=round(mem, 1)))
        return events

    def _call_events(self, call: _Call) -> list[dict]:
        n = len(call.prompts) if call.prompts else None
        shape = ""
        if call.prompts is not None:  # a thought batch repeats one prompt, an evaluation batch does not
            same = len({p if isinstance(p, str) else tuple(p) for p in call.prompts}) == 1
            shape = f" ({len(call.prompts)} prompts, {'same prompt' if same else 'different prompts'})"
        args = {"mode": call.label, **call.stats.to_dict()}
        out = [_span(TID_CALLS, f"{call.label}{shape}", call.start, call.end, args)]
        if not call.events:  # a call outside the step loop (static parallel on ALiBi, PipeDec): one span
            out.append(_span(TID_TARGET, f"{call.label} call", call.start, call.end,
                             {"target_busy_fraction": call.stats.target_busy_fraction, "prompts": n}))
            return out
        offset = _event_offset(call, self.t0)
        if offset > call.start:
            out.append(_span(TID_TARGET, "call setup", call.start, offset))
        queue = [(call.start, 0)]
        for e in call.events:
            if e["type"] == "prefill":  # prompt scoring, timed around its forwards
                tid = TID_TARGET if e["model"] == "target" else TID_DRAFT_PREFILL
                out.append(_span(tid, f"{e['model']} prefill ({e['prompts']} prompts)", offset + e["start"],
                                 offset + e["end"]))
            elif e["type"] == "draft":
                out.append(_span(TID_WORKER0 + e["worker"], "draft", offset + e["start"], offset + e["end"],
                                 {"tokens": e["tokens"]}))
            elif e["type"] in ("enqueue", "queue"):
                queue.append((offset + e["t"], e["queue_len"]))
        for (start, end), group in _verify_groups(call.events):
            out.append(_span(TID_TARGET, f"verify x{len(group)}", offset + start, offset + end,
                             {"workers": [g["worker"] for g in group], "accepted": [g["accepted"] for g in group]}))
        queue.append((call.end, 0))
        out += [_counter("verify queue length", t, jobs=length) for t, length in sorted(queue)]
        return out

    # ------------------------------------------------------------------ figure
    def curve_busy(self, calls: list[_Call]) -> float:
        """The target busy fraction a panel's curve shows: the mean of `busy_series` over its calls'
        window, bins weighted by their width (the last one may be cut short)."""
        xs, busy = self.busy_series(calls)
        stop = max(c.end for c in calls) - calls[0].start
        widths = [min(BIN_S, stop - x) for x in xs]
        return sum(b * w for b, w in zip(busy, widths)) / stop if stop > 0 else 0.0

    def busy_series(self, calls: list[_Call]) -> tuple[list[float], list[float]]:
        """(bin start times relative to the first call, target busy fraction per BIN_S bin)."""
        origin, stop = calls[0].start, max(c.end for c in calls)
        n_bins = max(1, math.ceil((stop - origin) / BIN_S - 1e-9))
        busy = [0.0] * n_bins
        for start, end, weight in _busy_intervals(calls, self.t0):
            for b in range(int((start - origin) / BIN_S), min(n_bins, int((end - origin) / BIN_S) + 1)):
                lo, hi = origin + b * BIN_S, origin + (b + 1) * BIN_S
                busy[b] += max(0.0, min(hi, end) - max(lo, start)) * weight / BIN_S
        # the last bin is cut by the window's end: a fraction of the part inside, not of BIN_S
        busy[-1] *= BIN_S / max(1e-9, stop - origin - (n_bins - 1) * BIN_S)
        return [b * BIN_S for b in range(n_bins)], [min(1.0, x) for x in busy]

    def _plot(self, path: Path) -> None:
        try:
            from matplotlib.backends.backend_agg import FigureCanvasAgg
            from matplotlib.figure import Figure
        except ImportError:
            log.warning("matplotlib is not installed: skipping %s (pip install 'seed-tot[trace]')", path)
            return
        labels = list(dict.fromkeys(c.label for c in self.calls))
        if not labels:
            log.warning("no generate calls were recorded: skipping %s", path)
            return
        fig = Figure(figsize=(9, 2.2 * len(labels)), constrained_layout=True)
        FigureCanvasAgg(fig)
        axes = fig.subplots(len(labels), 1, squeeze=False)[:, 0]
        gpu = bool(self.sampler.samples)
        for ax, label in zip(axes, labels):
            calls = _first_stretch(self.calls, label)
            origin, stop = calls[0].start, max(c.end for c in calls)
            if gpu:
                pts = [(t - origin, u) for t, u, _ in self.sampler.samples if origin <= t <= stop]
                xs, ys = [p[0] for p in pts], [p[1] for p in pts]
                ax.set_ylabel("GPU utilization (%)")
            else:
                xs, fractions = self.busy_series(calls)
                ys = [100 * f for f in fractions]
                ax.set_ylabel(NO_GPU_LABEL, fontsize=7)
            ax.step(xs, ys, where="post", linewidth=1)
            # the title's target busy is the curve's (the same spans, the same run); bench's table figure,
            # over every run of the mode, is named beside it
            busy = (f"target busy {self.curve_busy(calls):.0%} in the run drawn, "
                    f"{self.target_busy_fraction(label):.0%} over every run")
            if gpu:
                busy = f"GPU utilization mean {sum(ys) / len(ys) if ys else 0.0:.0f}%, {busy}"
            ax.set_title(f"{label}: {busy}; curve: its first run, {stop - origin:.2f} s", fontsize=9)
            ax.set_ylim(0, 105)
        axes[-1].set_xlabel("time since the mode's first call (s); each panel: the mode's first stretch of calls")
        fig.suptitle(f"{self.name}: " + (f"GPU utilization ({self.sampler.device_name})" if gpu else NO_GPU_LABEL))
        fig.savefig(path, dpi=110)


def _first_stretch(calls: list[_Call], label: str) -> list[_Call]:
    """The label's calls up to the first call of another label after them: bench times its modes
    in rounds, so a mode's later runs sit between other modes' and a panel spanning them all would
    show the other modes' GPU samples."""
    out: list[_Call] = []
    for call in calls:
        if call.label == label:
            out.append(call)
        elif out:
            break
    return out


def _event_offset(call: _Call, clock_origin: float) -> float:
    """Where the call's event time 0 falls on the recorder's clock (which started at clock_origin)."""
    clock = next((e["clock"] for e in call.events if e["type"] == "start" and "clock" in e), None)
    if clock is not None:
        return clock - clock_origin
    last = max(max(e.get("end", e.get("t", 0.0)) for e in call.events), 0.0)
    return max(call.start, call.end - last)


def _verify_groups(events: list[dict]) -> list[tuple[tuple[float, float], list[dict]]]:
    """((start, end), its events) per target forward. One forward verifies a whole batch: its events
    share their start, but each row's end is read as that row is committed, so grouping by (start,
    end) drew one overlapping "verify x1" per row; the span ends when the last row is committed."""
    groups: dict[float, list[dict]] = {}
    for e in events:
        if e["type"] == "verify":
            groups.setdefault(e["start"], []).append(e)
    return [((start, max(e["end"] for e in group)), group) for start, group in groups.items()]


def _busy_intervals(calls: list[_Call], clock_origin: float) -> list[tuple[float, float, float]]:
    """(start, end, busy fraction) of the target, so that each call adds up to its measured
    target_busy_s (the number the bench table reports). Step-loop calls: the target's prompt
    scoring spans at its measured target_prefill_s, the verify spans at the rest; each group scaled
    down to its measured time (the verify spans are the scheduler's view and also hold the hand-off
    to and from the target thread, which on a CPU, GIL shared with the draft threads, can be most
    of the span). Calls whose events carry no prefill: the verify spans hold all of target_busy_s.
    Other modes: the whole call at target_busy_s / wall_s."""
    out = []
    for call in calls:
        if call.events:
            offset = _event_offset(call, clock_origin)
            verify = [(offset + s, offset + e) for (s, e), _ in _verify_groups(call.events)]
            prefill = [(offset + e["start"], offset + e["end"]) for e in call.events
                       if e["type"] == "prefill" and e["model"] == "target"]
            verify_s = call.stats.target_busy_s - (call.stats.target_prefill_s if prefill else 0.0)
            for spans, measured in ((prefill, call.stats.target_prefill_s), (verify, verify_s)):
                occupied = sum(e - s for s, e in spans)
                scale = min(1.0, max(0.0, measured) / occupied) if occupied > 0 else 0.0
                out += [(s, e, scale) for s, e in spans]
        else:
            out.append((call.start, call.end, call.stats.target_busy_fraction))
    return out


def _meta(kind: str, tid: int, name: str | None = None, sort_index: int | None = None) -> dict:
    args = {"name": name} if sort_index is None else {"sort_index": sort_index}
    return {"ph": "M", "name": kind, "pid": PID, "tid": tid, "args": args}


def _span(tid: int, name: str, start: float, end: float, args: dict | None = None) -> dict:
    return {"ph": "X", "name": name, "pid": PID, "tid": tid, "ts": round(start * 1e6, 1),
            "dur": round(max(0.0, end - start) * 1e6, 1), "args": args or {}}


def _counter(name: str, t: float, **values: float) -> dict:
    return {"ph": "C", "name": name, "pid": PID, "ts": round(t * 1e6, 1), "args": values}
