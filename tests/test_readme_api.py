"""The README's Python API example runs as written (on tiny models), and what it prints is short."""
from __future__ import annotations

import re
from pathlib import Path

from conftest import CharTokenizer, noisy_copy, tiny_model
from seed_tot import Engine
from seed_tot.engine.params import GenerationStats

README = Path(__file__).resolve().parents[1] / "README.md"


def _api_example() -> str:
    section = README.read_text().split("## Python API", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_api_example_renders_prompts_and_runs(monkeypatch, capsys):
    code = _api_example()
    assert "engine.render_prompt(" in code  # a chat model gets its template
    target = tiny_model("llama", seed=3)
    engine = Engine(target, noisy_copy(target, 0.01), CharTokenizer())
    rendered = []
    render = engine.render_prompt
    monkeypatch.setattr(engine, "render_prompt", lambda *a, **k: rendered.append(a) or render(*a, **k))
    monkeypatch.setattr(Engine, "from_pretrained", classmethod(lambda cls, **kwargs: engine))
    namespace: dict = {}
    exec(compile(code, str(README), "exec"), namespace)
    assert len(namespace["results"]) == len(namespace["questions"]) == len(rendered)
    printed = capsys.readouterr().out
    assert "GenerationStats(" in printed


def test_stats_repr_is_one_short_line_and_events_stay_in_their_field():
    events = [{"kind": "verify", "worker": i % 3, "start": i * 0.01, "end": i * 0.01 + 0.005} for i in range(400)]
    stats = GenerationStats(new_tokens=12, accepted=5, draft_depth=9, wall_s=1.5, events=events)
    text = repr(stats)
    assert "\n" not in text and len(text) < 300 and "400" in text
    assert stats.events is events and "events" not in stats.to_dict()
