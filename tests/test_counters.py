"""Counters say what the hardware did: summed over a call's sequences, target/draft forwards and
prefills equal the forwards that hooks on the models saw; verifications count per-sequence rounds."""
from __future__ import annotations

import pytest

from conftest import noisy_copy, tiny_model
from seed_tot.engine import Engine, SamplingParams, summarize

PROMPTS = [[3, 17, 4, 9, 22], [3, 17, 4, 9, 22], [8, 1, 60], [5]]  # a repeated prompt shares its prefill


class ForwardLog:
    def __init__(self, model):
        self.forwards = 0
        model.register_forward_hook(self._hook)

    def _hook(self, module, args, output):
        self.forwards += 1


@pytest.fixture()
def engine_and_logs():
    target = tiny_model("llama", seed=3)
    draft = noisy_copy(target, 0.01)
    return Engine(target, draft), ForwardLog(target), ForwardLog(draft)


@pytest.mark.parametrize("mode,k_config,verify_batch", [
    ("ar", (1,), 1), ("parallel", (1,), 1), ("sd", (1, 1, 1), 1), ("mcsd", (2, 2, 1), 1),
    ("seed", (1, 1, 1), 1), ("seed", (2, 1), 3)])
def test_forward_counters_sum_to_the_forwards_the_models_ran(engine_and_logs, mode, k_config, verify_batch):
    engine, target_log, draft_log = engine_and_logs
    results = engine.generate(PROMPTS, SamplingParams(max_new_tokens=10, temperature=0), mode=mode,
                              k_config=k_config, verify_batch=verify_batch)
    total = summarize(results)
    assert round(total.target_forwards + total.target_prefills, 6) == target_log.forwards
    assert round(total.draft_forwards + total.draft_prefills, 6) == draft_log.forwards
    # three distinct prompts of more than one token are prefilled once each (the copy shares it),
    # in every mode: parallel rows are prefilled before they join the shared decode forwards
    assert total.target_prefills == 2
    # those prefills' seconds are counted apart, as a part of the target's busy time
    assert 0 < total.target_prefill_s < total.target_busy_s
    # the draft's prompt scoring is timed in the modes that draft, and only there
    assert (total.draft_prefill_s > 0) == (mode in ("sd", "mcsd", "seed"))
    # every decode forward scores each row's one pending token (the last one committed) plus its draft
    # nodes, so the query entries are exactly rounds + drafted nodes (ar and parallel: one per step)
    assert total.target_query_tokens == total.verifications + total.drafted
    assert total.query_tokens_per_target_forward >= total.rows_per_target_forward
    if mode in ("sd", "mcsd", "seed"):
        assert total.drafted > 0
    if mode == "parallel":
        assert total.target_forwards == max(len(r.token_ids) for r in results)  # one forward per step
        assert total.verifications == sum(len(r.token_ids) for r in results)
    if mode == "seed" and verify_batch > 1:
        # batching: fewer target forwards than per-sequence verifications
        assert total.target_forwards < total.verifications
        assert total.rows_per_target_forward > 1
    else:
        assert total.rows_per_target_forward == pytest.approx(1.0 if mode != "parallel" else
                                                              total.verifications / total.target_forwards)
