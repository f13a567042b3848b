"""What a draft policy keeps across calls stays bounded: an engine builds each named policy once and
keeps it for its lifetime (a server, a whole `solve` run), so nothing it keeps may grow per call."""
from __future__ import annotations

import gc

import pytest
import torch

from conftest import noisy_copy, tiny_model
from seed_tot import Engine, SamplingParams
from seed_tot.engine import seed as seed_module
from seed_tot.engine.draft_tree import DraftTree
from seed_tot.engine.policies import FixedPolicy
from seed_tot.engine.policies.base import MAX_RECORDS
from seed_tot.engine.seed import SeedError
from seed_tot.engine.verify import Acceptance
from test_step_loop_faults import settled


def test_a_policy_keeps_the_latest_round_records_only():
    """Before: one record per verified round, appended for the engine's lifetime."""
    policy = FixedPolicy((1, 1))
    seq = type("Row", (), {"index": 0})()
    tree = DraftTree([-1, 0], [3, 4], torch.empty(0, 4), q_index=[-1, -1])
    for n in range(3 * MAX_RECORDS):
        policy.observe(seq, tree, Acceptance([0] * (n % 3), [0] * (n % 3 + 1), False))
    assert MAX_RECORDS <= len(policy.records) <= 2 * MAX_RECORDS
    assert [r["accepted"] for r in policy.records[-3:]] == [(3 * MAX_RECORDS - 3 + i) % 3 for i in range(3)]


def test_auto_forgets_the_rows_of_a_call_that_failed():
    """Before: auto dropped a row's estimate only when the row finished, so each failed (or cancelled)
    call left its unfinished rows' state behind for good, keyed by ids later rows may be given."""
    target = tiny_model("llama", seed=0)
    engine = Engine(target, noisy_copy(target, 0.005))
    params = SamplingParams(max_new_tokens=30, temperature=0)
    options = {"prefill": "free"}  # never declines to draft: every row of the call has state in it
    policy = engine.policy("seed", (1, 1, 1), params, "auto", options)
    real = seed_module.accept_rows
    rounds = {"n": 0}

    def failing_row(jobs, *args, **kwargs):
        outcomes = real(jobs, *args, **kwargs)
        rounds["n"] += 1
        if rounds["n"] == 4:
            outcomes[-1] = RuntimeError("injected row fault")
        return outcomes

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(seed_module, "accept_rows", failing_row)
        with pytest.raises(SeedError, match="injected row fault"):
            engine.generate([[1, 2, 3], [4, 5, 6], [7, 8, 9]], params, mode="seed", draft_policy="auto",
                            policy_options=options)
    assert rounds["n"] == 4 and policy.records  # it drafted, and failed in its fourth verification
    settled(engine)
    gc.collect()
    assert len(policy._state) == 0 and len(policy._planned) == 0
