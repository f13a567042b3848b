"""Load on `seed-tot serve` from K concurrent ToT-shaped clients, against the same calls in process.

Each client does what one BFS step of one problem sends (search/bfs.py through solve --api-base):
one thought request with n=3 (three samples of the problem's thought prompt), then, once it is
answered, one value request per thought, all three at once. Client k works on problem k (GSM8K:
the built-in question with its first number changed per client, so no two clients send one prompt;
or `--task` / `--data`). Prompts, stop strings and budgets are the task's own, capped by
--max-new-tokens; thoughts and values are sampled at --temperature with per-request seeds, so every
repeat does the same work.

Per decoding mode (`--modes`, default parallel,seed) the script starts `seed-tot serve --mode MODE`
on a free loopback port (the embedded default model unless --target), runs one untimed round, then
--repeats timed rounds of all K clients at once, and reports per round: requests/s, completion
tokens/s (from the responses' usage), the p50 and p95 request latency, and rows per target forward
(from the server's /metrics: rows verified over target decode forwards in that round). Then, the
server stopped, the very same calls in this process through `Engine.agenerate` on one event loop
(what the server does under its HTTP layer), so the difference is the HTTP layer's cost: request
parsing, tokenization, JSON, loopback sockets and the client. Figures are medians over the repeats.

Run it alone on the machine (other work on the cores changes every figure):
    python benchmarks/serve_load.py --clients 1,4,8 --repeats 3 --modes parallel,seed --json serve_load.json
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

log = logging.getLogger("serve_load")

N_THOUGHTS = 3  # ToT's n_generate: samples of one thought prompt per request


# ---------------------------------------------------------------------------- the server process
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serve_subprocess(*args: str, timeout_s: float = 300.0, log_dir: str | Path | None = None,
                     env: dict[str, str] | None = None):
    """`seed-tot serve ARGS` on a free loopback port until the block ends (stopped, then killed if it
    lingers); yields its OpenAI base URL once /health answers. Its output goes to a log file, shown
    when it exits early; `env` adds to this process's environment."""
    port = free_port()
    log_path = Path(log_dir or tempfile.mkdtemp(prefix="serve-")) / f"serve-{port}.log"
    with log_path.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "seed_tot.cli", "serve", "--port", str(port), *args],
                                stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + timeout_s
            while not _healthy(base):
                if proc.poll() is not None:
                    raise RuntimeError(f"seed-tot serve exited with {proc.returncode}:\n"
                                       f"{log_path.read_text()[-3000:]}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"seed-tot serve did not answer {base}/health in {timeout_s:.0f} s "
                                       f"(log: {log_path})")
                time.sleep(0.3)
            yield base + "/v1"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _healthy(base: str) -> bool:
    try:
        with urllib.request.urlopen(base + "/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def read_metrics(base_url: str) -> dict[str, float]:
    """The server's /metrics counters (search/endpoint.py reads them for solve --api-base too)."""
    from seed_tot.search.endpoint import server_counters

    counters = server_counters(base_url)
    if counters is None:
        raise RuntimeError(f"{base_url}: no seed-tot counters on /metrics")
    return counters


# ---------------------------------------------------------------------------- the workload
@dataclass(frozen=True)
class Call:
    """One request: a rendered prompt, its choices and its sampling settings."""

    prompt: str
    n: int
    max_tokens: int
    stop: tuple[str, ...]
    seed: int


@dataclass
class Done:
    latency_s: float
    completion_tokens: int
    texts: list[str]


@dataclass
class Round:
    """What one round of all clients did."""

    wall_s: float
    latencies_s: list[float] = field(default_factory=list)
    completion_tokens: int = 0
    rows: float = 0.0
    target_forwards: float = 0.0

    def figures(self) -> dict[str, float]:
        lat = sorted(self.latencies_s)
        return {"requests_per_s": len(lat) / self.wall_s, "completion_tokens_per_s": self.completion_tokens / self.wall_s,
                "p50_ms": 1000 * quantile(lat, 0.50), "p95_ms": 1000 * quantile(lat, 0.95),
                "rows_per_target_forward": self.rows / self.target_forwards if self.target_forwards else 0.0,
                "requests": len(lat), "wall_s": self.wall_s}


def quantile(sorted_values: list[float], q: float) -> float:
    """The nearest-rank quantile (no interpolation: with few requests it is one of them)."""
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))]


class Workload:
    """The clients' problems and the task that writes their prompts."""

    def __init__(self, task_name: str, data: str | None, clients: int, max_new_tokens: int, render):
        from seed_tot.search.protocol import Example
        from seed_tot.tasks import get_task

        self.task = get_task(task_name)
        if data is not None:
            examples = self.task.load(data)
        elif self.task.name == "gsm8k":
            from seed_tot.cli_options import DEFAULT_PROMPT
            examples = [Example(f"builtin-{k}", {"question": DEFAULT_PROMPT.replace("48", str(48 + k), 1), "answer": ""})
                        for k in range(clients)]
        else:
            raise SystemExit(f"--task {task_name} needs --data PATH")
        self.examples = [examples[k % len(examples)] for k in range(clients)]
        self.cap = max_new_tokens
        self.render = render

    def _call(self, prompt, n: int, seed: int) -> Call:
        budget = self.cap if prompt.max_new_tokens is None else min(prompt.max_new_tokens, self.cap)
        return Call(self.render(prompt.user, prompt.assistant_prefix), n, budget, tuple(prompt.stop), seed)

    async def client(self, k: int, send: Callable[[Call], Awaitable[Done]]) -> list[Done]:
        """Problem k's BFS step: the thought request, then its thoughts' value requests at once."""
        from seed_tot.search.protocol import State

        example = self.examples[k]
        thoughts = await send(self._call(self.task.thought_prompt(example, State()), N_THOUGHTS, seed=1000 * k))
        values = [self._call(self.task.value_prompt(example, self.task.extend(State(), text)), 1, seed=1000 * k + 1 + i)
                  for i, text in enumerate(thoughts.texts)]
        return [thoughts, *await asyncio.gather(*(send(call) for call in values))]


async def run_round(workload: Workload, clients: int, send: Callable[[Call], Awaitable[Done]]) -> Round:
    start = time.perf_counter()
    done = await asyncio.gather(*(workload.client(k, send) for k in range(clients)))
    result = Round(wall_s=time.perf_counter() - start)
    for d in (d for client in done for d in client):
        result.latencies_s.append(d.latency_s)
        result.completion_tokens += d.completion_tokens
    return result


# ---------------------------------------------------------------------------- the two paths
def http_sender(client, model: str, temperature: float) -> Callable[[Call], Awaitable[Done]]:
    async def send(call: Call) -> Done:
        start = time.perf_counter()
        response = await client.completions.create(model=model, prompt=call.prompt, n=call.n, max_tokens=call.max_tokens,
                                                   temperature=temperature, seed=call.seed,
                                                   stop=list(call.stop) or None)
        texts = [c.text for c in sorted(response.choices, key=lambda c: c.index)]
        return Done(time.perf_counter() - start, response.usage.completion_tokens, texts)
    return send


def engine_sender(engine, spec, temperature: float, counted: Round) -> Callable[[Call], Awaitable[Done]]:
    from seed_tot.engine.params import SamplingParams

    async def send(call: Call) -> Done:
        params = SamplingParams(max_new_tokens=call.max_tokens, temperature=temperature, stop=call.stop, seed=call.seed)
        start = time.perf_counter()
        results = await engine.agenerate([call.prompt] * call.n, params, spec=spec)
        latency = time.perf_counter() - start
        for r in results:  # each row's share of the forwards it rode (they sum to the forwards run)
            counted.rows += r.stats.verifications
            counted.target_forwards += r.stats.target_forwards
        return Done(latency, sum(len(r.token_ids) for r in results), [r.text or "" for r in results])
    return send


def measure_http(base_url: str, workload: Workload, clients: int, repeats: int, temperature: float) -> list[Round]:
    from openai import AsyncOpenAI

    async def main() -> list[Round]:
        async with AsyncOpenAI(base_url=base_url, api_key="EMPTY", max_retries=0, timeout=3600) as client:
            model = (await client.models.list()).data[0].id
            send = http_sender(client, model, temperature)
            await run_round(workload, clients, send)  # warm-up: untimed
            rounds = []
            for _ in range(repeats):
                before = read_metrics(base_url)
                r = await run_round(workload, clients, send)
                after = read_metrics(base_url)
                r.rows = after["target_rows_total"] - before["target_rows_total"]
                r.target_forwards = after["target_forwards_total"] - before["target_forwards_total"]
                rounds.append(r)
            return rounds
    return asyncio.run(main())


def measure_in_process(engine, spec, workload: Workload, clients: int, repeats: int, temperature: float) -> list[Round]:
    async def main() -> list[Round]:
        await run_round(workload, clients, engine_sender(engine, spec, temperature, Round(0.0)))  # warm-up
        rounds = []
        for _ in range(repeats):
            counted = Round(0.0)
            r = await run_round(workload, clients, engine_sender(engine, spec, temperature, counted))
            r.rows, r.target_forwards = counted.rows, counted.target_forwards
            rounds.append(r)
        return rounds
    return asyncio.run(main())


# ---------------------------------------------------------------------------- report
FIGURES = ("requests_per_s", "completion_tokens_per_s", "p50_ms", "p95_ms", "rows_per_target_forward")


def median_row(mode: str, clients: int, path: str, rounds: list[Round]) -> dict[str, Any]:
    figures = [r.figures() for r in rounds]
    row: dict[str, Any] = {"mode": mode, "clients": clients, "path": path, "repeats": len(rounds)}
    row.update({key: statistics.median(f[key] for f in figures) for key in FIGURES})
    row["rounds"] = figures
    return row


def markdown(rows: list[dict[str, Any]]) -> str:
    head = "| mode | clients | path | requests/s | completion tok/s | p50 ms | p95 ms | rows / target fwd |"
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for r in rows:
        lines.append(f"| {r['mode']} | {r['clients']} | {r['path']} | {r['requests_per_s']:.2f} | "
                     f"{r['completion_tokens_per_s']:.1f} | {r['p50_ms']:.0f} | {r['p95_ms']:.0f} | "
                     f"{r['rows_per_target_forward']:.2f} |")
    return "\n".join(lines)


def _ints(text: str) -> list[int]:
    values = [int(v) for v in text.split(",") if v.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers like 1,4,8, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default="parallel,seed", help="Decoding modes, one server each.")
    parser.add_argument("--clients", type=_ints, default=[8], help="K: concurrent clients, e.g. 1,4,8.")
    parser.add_argument("--repeats", type=int, default=3, help="Timed rounds per mode and K (median reported).")
    parser.add_argument("--target", default=None, help="Target model (default: the embedded one).")
    parser.add_argument("--draft", default=None, help="Draft model (default: the target's).")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--task", default="gsm8k", help="Task writing the prompts (a name or FILE.py:Class).")
    parser.add_argument("--data", default=None, help="The task's problems (gsm8k: the built-in question).")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="Caps every request's budget.")
    parser.add_argument("--temperature", type=float, default=0.7, help="Of every request (seeded).")
    parser.add_argument("--json", dest="json_path", default=None, help="Write every figure and round here.")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    modes = [m for m in args.modes.split(",") if m]

    from seed_tot.engine import Engine
    from seed_tot.engine.decode_spec import DRAFTING_MODES, DecodeSpec

    engine = Engine.from_pretrained(target=args.target, draft=args.draft, device=args.device, dtype=args.dtype,
                                    load_draft=any(m in DRAFTING_MODES for m in modes))
    model_args = [f"--{name}={value}" for name, value in (("target", args.target), ("draft", args.draft),
                                                          ("device", args.device), ("dtype", args.dtype)) if value]
    rows: list[dict[str, Any]] = []
    for mode in modes:
        for clients in args.clients:
            workload = Workload(args.task, args.data, clients, args.max_new_tokens, engine.render_prompt)
            with serve_subprocess(*model_args, "--mode", mode, "--max-running", str(4 * clients)) as url:
                http = measure_http(url, workload, clients, args.repeats, args.temperature)
            here = measure_in_process(engine, DecodeSpec(mode=mode), workload, clients, args.repeats, args.temperature)
            rows += [median_row(mode, clients, "http", http), median_row(mode, clients, "in process", here)]
            log.info("%s, %d clients: done", mode, clients)
    table = markdown(rows)
    print(table)
    if args.json_path:
        meta = {"target": engine.target_name, "draft": engine.draft_name, "device": args.device,
                "task": args.task, "max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
                "n_thoughts": N_THOUGHTS, "command": " ".join(["benchmarks/serve_load.py", *(argv or sys.argv[1:])])}
        Path(args.json_path).write_text(json.dumps({"settings": meta, "rows": rows}, indent=2) + "\n")
    return rows


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    main()
