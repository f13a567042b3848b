"""Faults inside the shared step loop (seed.py): a call that fails mid-step gives its KV slots back at
once, a fault of one call's policy fails that call only, and a shared forward that fails half-way is
retried row by row on exactly the history each row had before it."""
from __future__ import annotations

import asyncio
import gc

import pytest
import torch

from conftest import noisy_copy, reference_greedy, tiny_model
from seed_tot import Engine, SamplingParams
from seed_tot.engine import seed as seed_module
from seed_tot.engine.kv_pool import KVPool
from seed_tot.engine.policies import FixedPolicy, TreeBuilder
from seed_tot.engine.policies.fixed import FixedRound
from seed_tot.engine.seed import SeedError

MAX_NEW = 16
PROMPTS = [[5, 6, 7, 8], [9, 3, 2, 1], [4, 4, 1, 2]]  # one length: a decode step of them needs no mask


@pytest.fixture(scope="module")
def models():
    target = tiny_model("llama", seed=0)
    return target, noisy_copy(target, 0.005)


def held_slots(pool: KVPool) -> int:
    """Slots some row still holds (the scratch slot is never a row's)."""
    gc.collect()  # rows free their slots when collected
    pool.collect()
    return pool.capacity - 1 - pool.n_free if pool.capacity else 0


def settled(engine: Engine) -> None:
    """Wait for the step the loop may still be finishing: a failing call's caller wakes inside it, while
    the step's own locals still hold the rows it verified."""
    engine.scheduler.executor.call(lambda: None)


def _held(engine: Engine) -> dict[str, int]:
    settled(engine)
    runtimes = {"target": engine.target_runtime, "draft": engine.draft_runtime}
    return {role: held_slots(rt.pool) for role, rt in runtimes.items() if rt is not None and rt._pool is not None}


@pytest.mark.parametrize("mode", ["parallel", "seed"])
def test_a_call_failing_in_one_row_mid_step_holds_no_kv_slot_once_it_has_returned(models, monkeypatch, mode):
    """Before: the call's other rows, verified in the same step before the failing one, stayed queued in
    the step loop (holding their KV slots and sequences) until some later call ran a step."""
    target, draft = models
    real = seed_module.accept_rows
    rounds = {"n": 0}

    def failing_row(jobs, *args, **kwargs):
        outcomes = real(jobs, *args, **kwargs)
        rounds["n"] += 1
        if rounds["n"] == 3:  # the third verification: its last row fails, the others went through
            outcomes[-1] = RuntimeError("injected row fault")
        return outcomes

    monkeypatch.setattr(seed_module, "accept_rows", failing_row)
    engine = Engine(target, draft)
    engine.clear_prefix_cache(keep=False)  # nothing kept across calls: every slot must come back
    with pytest.raises(SeedError, match="injected row fault"):
        engine.generate(PROMPTS, SamplingParams(max_new_tokens=MAX_NEW, temperature=0), mode=mode)
    assert engine.scheduler.active_calls == 0
    assert _held(engine) and set(_held(engine).values()) == {0}


class _ObserveFails(FixedPolicy):
    """A policy whose bookkeeping after a verification raises (its second one)."""

    name = "observe-fails"

    def observe(self, seq, tree, acceptance) -> None:
        super().observe(seq, tree, acceptance)
        if len(self.records) >= 2:
            raise RuntimeError("policy bookkeeping fault")


def _faulty_beside_healthy(engine, target, faulty_prompts, faulty_kwargs: dict, healthy_kwargs: dict, fault: str):
    """A faulty call and a healthy one run at once: the healthy one finishes with the target's greedy
    tokens, the faulty one raises its own fault (a SeedError caused by `fault`), and nothing stays held."""
    params = SamplingParams(max_new_tokens=40, temperature=0)

    async def both():
        faulty = engine.agenerate(faulty_prompts, params, mode="seed", **faulty_kwargs)
        healthy = engine.agenerate(PROMPTS, params, **healthy_kwargs)
        return await asyncio.wait_for(asyncio.gather(faulty, healthy, return_exceptions=True), timeout=120)

    faulty, healthy = asyncio.run(both())
    assert not isinstance(healthy, BaseException), healthy
    assert [r.token_ids for r in healthy] == [reference_greedy(target, p, 40) for p in PROMPTS]
    assert isinstance(faulty, SeedError) and fault in repr(faulty.__cause__)
    assert engine.scheduler.active_calls == 0
    del faulty  # its traceback's frames hold the rows verified beside the failing one
    assert set(_held(engine).values()) == {0}


@pytest.mark.parametrize("other_mode", ["seed", "parallel"])
def test_a_policy_raising_after_a_verification_fails_its_own_call_only(models, other_mode):
    """Before: the exception escaped the verify phase and the loop failed every call it served."""
    target, draft = models
    engine = Engine(target, draft)
    _faulty_beside_healthy(engine, target, [[1, 2, 3]], {"draft_policy": _ObserveFails((1, 1))},
                           {"mode": other_mode}, "policy bookkeeping fault")


def _fail_once_inside(model, layer: int = 1):
    """Arm the returned dict's "armed" to make the next forward of 2+ entries raise inside decoder layer
    `layer`, after the layers before it wrote their keys and values to the pool (an OOM mid-forward)."""
    state = {"armed": False, "fired": 0}

    def hook(module, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        if state["armed"] and hidden.shape[1] >= 2:
            state["armed"] = False
            state["fired"] += 1
            raise RuntimeError("injected fault half-way through a forward")

    handle = model.model.layers[layer].register_forward_pre_hook(hook, with_kwargs=True)
    return state, handle


@pytest.mark.parametrize("mode", ["parallel", "seed"])
def test_a_shared_verification_failing_half_way_is_retried_on_each_rows_own_history(models, mode):
    """Before: the failed forward's slots stayed on the rows' pool lines, so the one-by-one retry read
    them as history: parallel returned wrong greedy tokens silently, seed failed on a mask of the wrong
    size."""
    target, draft = models
    state, handle = _fail_once_inside(target)
    try:
        engine = Engine(target, draft)
        prefill = engine._prefill_shared

        def then_arm(seqs, with_draft):  # the next forward of the target is the first verification
            prefill(seqs, with_draft)
            state["armed"] = True

        engine._prefill_shared = then_arm
        results = engine.generate(PROMPTS, SamplingParams(max_new_tokens=MAX_NEW, temperature=0), mode=mode)
    finally:
        handle.remove()
    assert state["fired"] == 1
    assert [r.token_ids for r in results] == [reference_greedy(target, p, MAX_NEW) for p in PROMPTS]


def test_a_forward_that_fails_inside_the_pools_scoring_gives_its_slots_back():
    pool = KVPool("cpu")
    owners = [torch.nn.Module(), torch.nn.Module()]  # a line's slots are freed when its owner is collected
    lines = [pool.new_line(owner) for owner in owners]
    with pool.scoring(lines, [3, 2]):
        pass
    free, table = pool.n_free, pool.table.clone()
    with pytest.raises(RuntimeError, match="forward fault"):
        with pool.scoring(lines, [4, 1]):
            raise RuntimeError("forward fault")
    assert [line.length for line in lines] == [3, 2]  # the rows' histories, as before the forward
    pool.collect()
    assert pool.n_free == free  # the failed forward's slots are free again
    for line, n in zip(lines, [3, 2]):  # the rows' own slots are untouched
        assert torch.equal(pool.table[line.index, :n], table[line.index, :n])


class _BeginFails(FixedPolicy):
    """A policy that fails to plan its rows' rounds from the second on (inside the batched draft round)."""

    name = "begin-fails"

    def __init__(self, k_config):
        super().__init__(k_config)
        self.rounds = 0

    def begin(self, seq, params, vocab_size):
        self.rounds += 1
        if self.rounds >= 3:  # from its second round on, whatever shares the round
            raise RuntimeError("policy planning fault")
        return super().begin(seq, params, vocab_size)


def test_a_policy_raising_in_a_shared_draft_round_fails_its_own_call_only(models, monkeypatch):
    """Before: every call with a row in the failed batched draft round failed with it."""
    target, draft = models
    # the retry's warning carries the error, whose traceback holds the round's rows: pytest keeps log records
    monkeypatch.setattr(seed_module.log, "warning", lambda *args, **kwargs: None)
    engine = Engine(target, draft)
    _faulty_beside_healthy(engine, target, [[1, 2, 3], [3, 2, 1]],
                           {"draft_policy": _BeginFails((1, 1)), "draft_batch": "all"},
                           {"mode": "seed", "k_config": (2, 1), "draft_batch": "all"}, "policy planning fault")


class _StepFails(FixedPolicy):
    """A policy whose rounds fail after the round's first draft forward (which fed every row of the
    shared round its pending tokens), from the second round on."""

    name = "step-fails"

    def __init__(self, k_config):
        super().__init__(k_config)
        self.rounds = 0

    def begin(self, seq, params, vocab_size):
        self.rounds += 1
        policy = self

        class Round(FixedRound):
            def step(self, logits, hidden, drawn=None):
                if policy.rounds > 2:
                    raise RuntimeError("policy step fault")
                return super().step(logits, hidden, drawn)

        return Round(TreeBuilder(seq, params, vocab_size), self.k_config)


def test_a_shared_draft_round_failing_after_a_forward_is_drafted_again_from_each_rows_own_cache(models, monkeypatch):
    """The retried call's rows drafted from draft caches that still held what the failed round fed."""
    target, draft = models
    monkeypatch.setattr(seed_module.log, "warning", lambda *args, **kwargs: None)
    engine = Engine(target, draft)
    _faulty_beside_healthy(engine, target, [[1, 2, 3]], {"draft_policy": _StepFails((1, 1, 1))},
                           {"mode": "seed", "k_config": (2, 1)}, "policy step fault")
