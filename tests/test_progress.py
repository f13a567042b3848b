"""The progress bar shows the problem in flight: its ToT step of the depth and its tokens/s."""
from __future__ import annotations

import re
from pathlib import Path

from seed_tot.engine.params import GenerationResult, GenerationStats
from seed_tot.search import RunSettings, SearchConfig, apply_overrides, solve_dataset
from seed_tot.tasks import get_task

FIXTURES = Path(__file__).parent / "fixtures"


class SlowFixedEngine:
    """Fixed replies of 5 tokens each, with no model."""

    def render_prompt(self, user: str, assistant_prefix: str = "") -> str:
        return user + assistant_prefix

    def generate(self, prompts, params, *, spec):
        return [GenerationResult(token_ids=[1] * 5, text="Sub-question: x? Sub-answer: 2. Rating 6",
                                 stats=GenerationStats(new_tokens=5, wall_s=0.01), finish_reason="length")
                for _ in prompts]


def _bar_frames(text: str) -> list[str]:
    return [frame for frame in re.split(r"[\r\n]", text) if frame.strip()]


def test_bar_shows_tot_step_and_tokens_per_second_inside_a_one_problem_run(tmp_path: Path, capsys):
    task = get_task("gsm8k")
    settings = apply_overrides(RunSettings(search=SearchConfig(depth=3, n_generate=2, max_new_tokens=5,
                                                               extra=dict(task.config.extra))), algorithm="bfs")
    solve_dataset(SlowFixedEngine(), task, task.load(str(FIXTURES / "gsm8k_small.jsonl"), limit=1),
                  settings=settings, output_dir=tmp_path)
    frames = _bar_frames(capsys.readouterr().err)
    in_flight = [f for f in frames if " 0/1 " in f]  # before the only problem is done
    for step in ("1/3", "2/3"):
        assert any(f"step={step}" in f and "phase=thought" in f for f in in_flight), frames
    assert any("phase=value" in f for f in in_flight)
    rates = [float(m) for f in in_flight for m in re.findall(r"problem tok/s=([\d.]+)", f)]
    assert rates and max(rates) > 0  # tokens/s of the problem in flight, not only after it ends
