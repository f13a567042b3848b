"""Engine.agenerate's on_tokens: what a streaming caller sees is exactly what the call returns."""
from __future__ import annotations

import asyncio

import pytest

from seed_tot import Engine
from conftest import noisy_copy, rows_stopping_differently


@pytest.mark.parametrize("mode", ["ar", "parallel", "sd", "seed"])
def test_committed_tokens_join_to_each_rows_result(mode):
    """Rows ending at EOS, at a stop string (whose tokens the stop rule cuts back) and at the budget:
    per row, the tokens reported as committed join to its result's tokens, and the finish reason is
    reported once, with the last of them."""
    target, prompts, tok, params, refs = rows_stopping_differently()
    engine = Engine(target, noisy_copy(target, 0.005), tok)
    seen: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
    finishes: dict[int, list[str]] = {i: [] for i in range(len(prompts))}

    def on_tokens(index, tokens, finish):
        seen[index] += tokens
        if finish is not None:
            finishes[index].append(finish)

    results = asyncio.run(engine.agenerate(prompts, params, mode=mode, on_tokens=on_tokens))
    assert {r.finish_reason for r in results} >= {"eos", "stop"}
    for i, r in enumerate(results):
        assert seen[i] == r.token_ids
        assert finishes[i] == [r.finish_reason]
