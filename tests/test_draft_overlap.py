"""The overlapped step schedule (seed.py, draft_stream.py): drafting beside verification.

On the CPU there are no streams, but the schedule itself runs there (forced on): these tests prove it
keeps every mode lossless, keeps the counters true, and has the property it exists for, a target
that verifies in every steady-state step while the other rows draft."""
from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from conftest import noisy_copy, reference_greedy, tiny_model
from test_sampling_lossless import PROMPT, SAMPLES, SETTINGS, exact_distribution, pair, tv, tv_bound  # noqa: F401 (pair: a fixture)
from seed_tot import Engine, SamplingParams
from seed_tot.engine import draft_stream
from seed_tot.engine import seed as seed_module
from seed_tot.engine import speculative
from seed_tot.engine.policies.auto import Costs

MAX_NEW = 24


@pytest.fixture(scope="module")
def models():
    target = tiny_model("qwen2", seed=7)
    return target, noisy_copy(target, 0.005)


def _engine(target, draft, overlap: bool = True) -> Engine:
    engine = Engine(target, draft)
    engine.scheduler.overlap = overlap
    return engine


def _choose():
    from seed_tot.engine.policies.choose import ChoosePolicy
    from seed_tot.engine.policies.suffix import SuffixSource
    return ChoosePolicy(Costs(0.1, 0.0, 0.001), SuffixSource(depth=2, factor=2, share="all"), max_len=2,
                        costs_at="calibrated")


POLICIES = {
    "chain": dict(k_config=(1, 1, 1)),
    "tree": dict(k_config=(2, 2, 1)),
    "lookup": dict(draft_policy="lookup"),
    "suffix": dict(draft_policy="suffix"),
    "choose": dict(draft_policy=None),  # built per test: a ChoosePolicy holds its run's suffix source
}


def _kwargs(name: str) -> dict:
    return dict(draft_policy=_choose()) if name == "choose" else dict(POLICIES[name])


def test_the_overlapped_schedule_is_off_by_default_on_every_device(monkeypatch):
    """In turn by default; a setting or $SEED_TOT_OVERLAP_DRAFTING turns the overlap on, and a bad value is refused by name."""
    monkeypatch.delenv(draft_stream.ENV, raising=False)
    assert not draft_stream.overlap_default("cuda") and not draft_stream.overlap_default("cpu")
    assert draft_stream.overlap_default("cpu", True) and not draft_stream.overlap_default("cuda", False)
    monkeypatch.setenv(draft_stream.ENV, "1")
    assert draft_stream.overlap_default("cpu")
    monkeypatch.setenv(draft_stream.ENV, "maybe")
    with pytest.raises(ValueError, match="SEED_TOT_OVERLAP_DRAFTING='maybe'"):
        draft_stream.overlap_default("cpu")


def test_the_cpu_gets_no_streams_but_the_schedule(models):
    """No CUDA stream is made on the CPU: the no-op stand-in takes the step loop's calls."""
    engine = _engine(*models)
    assert engine.scheduler.overlap
    assert isinstance(engine.scheduler._streams, draft_stream.NoStreams)
    assert not engine.scheduler._streams.streams


@pytest.mark.parametrize("verify_batch", [1, None])
@pytest.mark.parametrize("policy", list(POLICIES))
def test_overlapped_greedy_equals_the_target_alone(models, policy, verify_batch):
    """Greedy tokens of seed with the overlapped schedule forced on, every row at once, are the target's own."""
    target, draft = models
    prompts = [[4, 4, 2, 4, 4, 2], [7, 1], [2, 9, 9, 4], [5, 5, 3], [3, 1, 3, 1]]
    refs = [reference_greedy(target, p, MAX_NEW) for p in prompts]
    results = _engine(target, draft).generate(prompts, SamplingParams(max_new_tokens=MAX_NEW, temperature=0),
                                              mode="seed", verify_batch=verify_batch, **_kwargs(policy))
    assert [r.token_ids for r in results] == refs


def test_overlapped_greedy_at_concurrency_equals_the_target_alone(models):
    """Concurrent calls of different policies share the overlapped steps; each call's tokens are the target's."""
    target, draft = models
    engine = _engine(target, draft)
    calls = [([[4, 4, 2], [7, 1, 7, 1]], "chain"), ([[2, 9, 9, 4]] * 3, "tree"), ([[5, 5, 3, 5, 5]], "lookup"),
             ([[3, 1, 3], [6, 2]], "suffix"), ([[1, 2, 1, 2]] * 2, "choose")]
    params = SamplingParams(max_new_tokens=MAX_NEW, temperature=0)

    async def run():
        return await asyncio.gather(*(engine.agenerate(p, params, mode="seed", **_kwargs(name)) for p, name in calls))

    for (prompts, _), results in zip(calls, asyncio.run(run())):
        assert [r.token_ids for r in results] == [reference_greedy(target, p, MAX_NEW) for p in prompts]


def test_overlapped_tree_samples_follow_the_target_distribution(pair):
    """Sampled seed with trees under the overlapped schedule keeps the target's distribution (TV test)."""
    target, draft = pair
    params = SETTINGS["top_k"]
    exact = exact_distribution(target, params)
    results = _engine(target, draft).generate([PROMPT] * SAMPLES, params, mode="seed", k_config=(2, 1), n_workers=8)
    assert sum(r.stats.accepted for r in results) > 0.05 * SAMPLES  # drafts were really accepted
    assert tv(Counter(tuple(r.token_ids) for r in results), exact, SAMPLES) < tv_bound(exact, SAMPLES)


class _Trace:
    """Per step of the loop, in launch order: ("verify", rows) for each target forward of a
    verification and ("draft", rows) for each draft round, rows by sequence index; `forwards` counts
    every forward of each model, the draft's one per step of a round."""

    def __init__(self, monkeypatch):
        self.steps: list[list[tuple[str, frozenset]]] = []
        self.seqs: dict[int, object] = {}
        self.first_done: int | None = None  # the first step after which some row had ended
        self.forwards = Counter()
        real_step, real_score = seed_module.SeedScheduler._guarded_step, seed_module.score_rows
        real_draft, real_forward = seed_module.draft_rows, speculative.forward_rows
        trace = self

        def step(scheduler):
            trace.steps.append([])
            real_step(scheduler)
            if trace.first_done is None and any(seq.done for seq in trace.seqs.values()):
                trace.first_done = len(trace.steps) - 1

        def score(runtime, rows, *args):
            trace.steps[-1].append(("verify", frozenset(seq.index for seq, _, _ in rows)))
            trace.seqs.update({seq.index: seq for seq, _, _ in rows})
            return real_score(runtime, rows, *args)

        def draft(runtime, rows, *args, **kwargs):
            trace.steps[-1].append(("draft", frozenset(seq.index for seq, _ in rows)))
            return real_draft(runtime, rows, *args, **kwargs)

        def forward(runtime, *args, **kwargs):
            trace.forwards["draft" if runtime is draft_runtime[0] else "target"] += 1
            return real_forward(runtime, *args, **kwargs)

        draft_runtime: list = [None]
        self.draft_runtime = draft_runtime
        monkeypatch.setattr(seed_module.SeedScheduler, "_guarded_step", step)
        monkeypatch.setattr(seed_module, "score_rows", score)
        monkeypatch.setattr(seed_module, "draft_rows", draft)
        monkeypatch.setattr(speculative, "forward_rows", forward)  # draft_rows' and score_rows' forwards

    def steady(self) -> list[list[tuple[str, frozenset]]]:
        """The steps from the second to the last one before any row ended (every row in them)."""
        return self.steps[1: self.first_done]


@pytest.mark.parametrize("overlap", [True, pytest.param(False, marks=pytest.mark.xfail(strict=True, reason=(
    "in turn, each step verifies the drafts it made itself: the target waits for them")))])
def test_every_steady_step_verifies_earlier_drafts_while_the_other_rows_draft(models, monkeypatch, overlap):
    """The schedule's point: in steady state each step launches a target verification of rows drafted
    in earlier steps before its draft round of the other rows, so the target never waits for a draft
    made in its own step. In turn (the setting off) it fails: each step verifies its own drafts."""
    target, draft = models
    engine = _engine(target, draft, overlap)
    trace = _Trace(monkeypatch)
    prompts = [[4, 4, 2], [7, 1], [2, 9, 9, 4], [5, 5, 3], [3, 1, 3, 1], [6, 2]]
    engine.generate(prompts, SamplingParams(max_new_tokens=40, temperature=0), mode="seed", k_config=(1, 1),
                    draft_policy="fixed")
    steady = trace.steady()
    assert len(steady) >= 5  # enough steady steps for the property to mean something
    for launches in steady:
        kinds = [kind for kind, _ in launches]
        assert "verify" in kinds and "draft" in kinds, launches
        assert kinds.index("verify") < kinds.index("draft"), launches  # launched before the host waits on it
        verified = frozenset().union(*(rows for kind, rows in launches if kind == "verify"))
        drafted = frozenset().union(*(rows for kind, rows in launches if kind == "draft"))
        assert not verified & drafted, launches  # no row's verification waits on this step's own draft


@pytest.mark.parametrize("overlap", [True, False])
def test_the_counters_count_each_models_real_forwards(models, monkeypatch, overlap):
    """target_forwards and draft_forwards, summed over the rows, are the forwards each model ran."""
    target, draft = models
    engine = _engine(target, draft, overlap)
    trace = _Trace(monkeypatch)
    trace.draft_runtime[0] = engine.draft_runtime
    prompts = [[4, 4, 2], [7, 1], [2, 9, 9, 4], [5, 5, 3]]
    results = engine.generate(prompts, SamplingParams(max_new_tokens=MAX_NEW, temperature=0), mode="seed",
                              k_config=(2, 1))
    verifications = sum(kind == "verify" for launches in trace.steps for kind, _ in launches)
    assert sum(r.stats.target_forwards for r in results) == pytest.approx(verifications)
    assert sum(r.stats.draft_forwards for r in results) == pytest.approx(trace.forwards["draft"])
    assert trace.forwards["target"] == verifications  # every target forward of the steps is a verification
