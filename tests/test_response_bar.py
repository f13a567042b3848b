"""The trainers' data-generation bar says what runs before its first batch ends, then tokens/s, and
each update is where a Ctrl-C stops the generation."""
from __future__ import annotations

import pytest

from seed_tot.engine.forward_thread import EngineStopped, ForwardThread
from seed_tot.training.response_bar import ResponseBar


def test_the_bar_says_the_first_batch_runs_then_counts_responses_and_tokens_per_second():
    with ResponseBar(100, 16) as bar:
        assert "first batch of 16 running" in bar.bar.postfix
        bar.done(16, 320)
        assert bar.bar.n == 16 and "tokens/s" in bar.bar.postfix


def test_an_update_on_a_stopped_forward_thread_ends_the_work_there():
    thread = ForwardThread("test-forward")

    def generate() -> int:
        with ResponseBar(3, 1) as bar:
            bar.done(1, 5)
            thread.stop()  # Ctrl-C arrives during the second batch
            bar.done(1, 5)
            bar.done(1, 5)  # never reached
        return bar.bar.n

    with pytest.raises(EngineStopped):
        thread.call(generate)


def test_generate_samples_reports_each_batchs_responses_and_new_tokens(tiny_model_dirs):
    from seed_tot import Engine, SamplingParams
    from seed_tot.training.drafter_data import generate_samples

    engine = Engine.from_pretrained(target=tiny_model_dirs[0], device="cpu", load_draft=False)
    calls = []
    samples = engine.on_forward_thread(generate_samples, engine, engine.encode(["a", "b", "c"]),
                                       SamplingParams(max_new_tokens=4, temperature=0), 2, 32,
                                       lambda n, tokens: calls.append((n, tokens)))
    assert [n for n, _ in calls] == [2, 1]
    assert sum(t for _, t in calls) == sum(len(s.tokens) - s.start for s in samples)
