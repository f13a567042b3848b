"""The workloads `seed-tot bench` times: one thought batch, one ToT step, or whole ToT solves.

Each builder returns (run, description): `run(engine, spec, index)` does one timed run of one mode
spec (a ModeSpec) on an engine-like object and returns the ToT predictions, or None where
there are none to compare (thoughts, tot-step: bench compares their tokens instead).
"""
from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import click

from seed_tot.cli_options import DEFAULT_PROMPT
from seed_tot.engine.decode_spec import DecodeSpec
from seed_tot.engine.params import SamplingParams

BUILTIN_ANSWER = ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
                  "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72")


@dataclass(frozen=True)
class ModeSpec:
    """One --modes entry: its label, the DecodeSpec every engine call of its runs gets, and the
    run settings that are bench's own."""

    label: str
    decode: DecodeSpec
    concurrency: int | None = None  # tot-*: problems searched at once; None: --concurrency
    prefix_cache: bool = True  # @pc0: no prompt stretches kept across calls (shared_prefill.PrefixStore)

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, **self.decode.to_dict(), "concurrency": self.concurrency,
                "prefix_cache": self.prefix_cache}


# A workload runs once on an engine-like object for one mode and returns ToT predictions (or None).
Workload = Callable[[Any, ModeSpec, int], "list[str] | None"]


def _gsm8k_example(data: str | None):
    """The GSM8K task and the first problem of `data`, or the built-in question without data."""
    from seed_tot.search.protocol import Example
    from seed_tot.tasks.gsm8k import GSM8K

    task = GSM8K()
    return task, (task.load(data, limit=1)[0] if data else
                  Example("builtin", {"question": DEFAULT_PROMPT, "answer": BUILTIN_ANSWER}))


def thoughts_workload(engine, data: str | None, params: SamplingParams) -> tuple[Workload, str]:
    from seed_tot.search.protocol import State
    from seed_tot.tasks.gsm8k import solution_steps

    task, example = _gsm8k_example(data)
    prompt = task.thought_prompt(example, State())
    thought = engine.render_prompt(prompt.user, prompt.assistant_prefix)
    lines = solution_steps(example.data["answer"])
    lines += ["Let us check the previous step."] * 3  # three different states even for a one-line answer
    steps = [f"{task.prompts['step_header'].format(k=k + 1)} {line}" for k, line in enumerate(lines[:3])]
    values = [task.value_prompt(example, State(tuple(steps[:i]))) for i in (1, 2, 3)]
    value_prompts = [engine.render_prompt(v.user, v.assistant_prefix) for v in values]

    def run(eng, spec: ModeSpec, index: int) -> None:
        for batch in ([thought] * 3, value_prompts):
            eng.generate(batch, params, spec=spec.decode)
        return None

    return run, (f"1 thought batch (3 x the same GSM8K thought prompt, example {example.id}) + 1 value batch "
                 f"(3 different prompts), {params.max_new_tokens} new tokens each")


def tot_step_workload(engine, data: str | None, params: SamplingParams) -> tuple[Workload, str]:
    """One ToT-BFS step at breadth 3 and n_generate 3: the 3 frontier states' thought prompts, 3 copies
    each, in one call (9 sequences), then the 9 new states' value prompts in one call."""
    from seed_tot.search.protocol import State
    from seed_tot.tasks.gsm8k import solution_steps

    task, example = _gsm8k_example(data)
    lines = solution_steps(example.data["answer"])
    lines += ["Let us check the previous step.", "Now compute the total.", "Write the final answer."]
    steps = [f"{task.prompts['step_header'].format(k=1)} {line}" for line in lines[:3]]
    frontier = [State((step,)) for step in steps]  # three different one-step states
    thoughts = [engine.render_prompt(p.user, p.assistant_prefix)
                for p in (task.thought_prompt(example, s) for s in frontier) for _ in range(3)]
    seconds = [f"{task.prompts['step_header'].format(k=2)} {line}" for line in lines[-3:]]
    children = [State(s.thoughts + (second,)) for s in frontier for second in seconds]  # 9 different states
    values = [engine.render_prompt(v.user, v.assistant_prefix) for v in (task.value_prompt(example, c) for c in children)]

    def run(eng, spec: ModeSpec, index: int) -> None:
        for batch in (thoughts, values):
            eng.generate(batch, params, spec=spec.decode)
        return None

    return run, (f"1 ToT step at breadth 3 (GSM8K example {example.id}): 9 thought sequences (3 states x 3) + "
                 f"9 value prompts, {params.max_new_tokens} new tokens each")


def tot_workload(workload: str, data: str | None, limit: int, temperature: float, max_new_tokens: int | None,
                 seed: int, out_root: Path, concurrency: int = 1, draft_invariant: bool = False) -> tuple[Workload, str]:
    from seed_tot.search import apply_overrides, load_settings, shipped_config, solve_dataset
    from seed_tot.tasks import get_task

    task = get_task(workload.removeprefix("tot-"))
    if data is None and task.name != "blocksworld":
        raise click.UsageError(f"--workload {workload} needs --data PATH (bench does not download datasets)")
    settings = load_settings(shipped_config(task.name), base=task.config)
    settings = apply_overrides(settings, temperature=temperature, max_new_tokens=max_new_tokens, seed=seed,
                               draft_invariant=draft_invariant)
    examples = task.load(data, limit=limit)

    def run(eng, spec: ModeSpec, index: int) -> list[str]:
        s = dataclasses.replace(settings, decode=spec.decode)  # the mode's spec, not the config's decoding keys
        out = out_root / f"{re.sub(r'[^A-Za-z0-9]+', '_', spec.label)}-{index}"
        solve_dataset(eng, task, examples, settings=s, output_dir=out, concurrency=spec.concurrency or concurrency)
        lines = (out / "results.jsonl").read_text(encoding="utf-8").splitlines()
        by_id = {r["id"]: r["prediction"] for r in (json.loads(line) for line in lines if line.strip())}
        return [by_id[ex.id] for ex in examples]  # data order: concurrent runs write in finishing order

    at_once = f"{concurrency} at once unless a mode's @c says otherwise"
    return run, (f"ToT {settings.algorithm} on {len(examples)} {task.name} problem(s) ({at_once}), "
                 f"depth {settings.search.depth}, "
                 f"n_generate {settings.search.n_generate}, breadth {settings.search.breadth}, "
                 f"max_new_tokens {settings.search.max_new_tokens}")
