"""The server's counters in Prometheus' text exposition format (version 0.0.4).

Engine counters are summed from each finished call's per-sequence stats (params.GenerationStats):
a forward shared by m rows adds 1/m to each, so the sums are the forwards the models ran, and
rows / target forward above 1 is rows of different requests (or choices) sharing forwards."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from seed_tot.engine.params import GenerationResult


@dataclass
class ServerMetrics:
    started: float = field(default_factory=time.monotonic)
    running: int = 0  # requests whose rows are in the engine
    waiting: int = 0  # requests queued for a place (--max-running)
    finished: int = 0
    rejected: int = 0  # 429: past --max-waiting
    cancelled: int = 0  # their client went away first
    prompt_tokens: int = 0
    completion_tokens: int = 0
    draft_depth: int = 0  # draft tokens a round could accept, summed
    accepted: int = 0
    rows: int = 0  # row verifications (decode steps of a row)
    target_forwards: float = 0.0
    target_prefills: float = 0.0
    draft_forwards: float = 0.0
    target_busy_s: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add_results(self, results: list[GenerationResult]) -> None:
        with self._lock:
            for r in results:
                s = r.stats
                self.completion_tokens += len(r.token_ids)
                self.draft_depth += s.draft_depth
                self.accepted += s.accepted
                self.rows += s.verifications
                self.target_forwards += s.target_forwards
                self.target_prefills += s.target_prefills
                self.draft_forwards += s.draft_forwards
                self.target_busy_s += s.target_busy_s

    def add_prompt_tokens(self, n: int) -> None:
        with self._lock:
            self.prompt_tokens += n

    def render(self, engine_gauges: dict[str, tuple[str, float]]) -> str:
        """The text body of GET /metrics; `engine_gauges`: name -> (help, value) read from the engine now."""
        with self._lock:
            uptime = time.monotonic() - self.started
            forwards = self.target_forwards
            series = [
                ("requests_running", "gauge", "Requests whose rows are in the engine.", self.running),
                ("requests_waiting", "gauge", "Requests queued for a place (past --max-running).", self.waiting),
                ("requests_finished_total", "counter", "Requests answered.", self.finished),
                ("requests_rejected_total", "counter", "Requests refused with 429 (queue full).", self.rejected),
                ("requests_cancelled_total", "counter", "Requests whose client went away first.", self.cancelled),
                ("prompt_tokens_total", "counter", "Prompt tokens of the rows handed to the engine (a prompt once per choice).", self.prompt_tokens),
                ("completion_tokens_total", "counter", "Tokens generated.", self.completion_tokens),
                ("draft_tokens_offered_total", "counter", "Draft tokens rounds could accept (tree depth).",
                 self.draft_depth),
                ("draft_tokens_accepted_total", "counter", "Draft tokens accepted.", self.accepted),
                ("acceptance_rate", "gauge", "Accepted over offered draft tokens.",
                 self.accepted / self.draft_depth if self.draft_depth else 0.0),
                ("target_forwards_total", "counter", "Target decode forwards.", forwards),
                ("target_prefills_total", "counter", "Target prompt forwards.", self.target_prefills),
                ("draft_forwards_total", "counter", "Draft decode forwards.", self.draft_forwards),
                ("target_rows_total", "counter", "Rows verified (a row's decode step), summed over forwards.",
                 self.rows),
                ("rows_per_target_forward", "gauge", "Rows per target decode forward (above 1: shared forwards).",
                 self.rows / forwards if forwards else 0.0),
                ("tokens_per_target_forward", "gauge", "Generated tokens per target decode forward.",
                 self.completion_tokens / forwards if forwards else 0.0),
                ("target_busy_seconds_total", "counter", "Seconds the target ran forwards.", self.target_busy_s),
                ("target_busy_fraction", "gauge", "Target busy seconds over the server's uptime.",
                 min(1.0, self.target_busy_s / uptime) if uptime else 0.0),
            ]
        series += [(name, "gauge", text, value) for name, (text, value) in engine_gauges.items()]
        lines = []
        for name, kind, text, value in series:
            lines += [f"# HELP seed_tot_{name} {text}", f"# TYPE seed_tot_{name} {kind}",
                      f"seed_tot_{name} {float(value):.17g}"]
        return "\n".join(lines) + "\n"
