"""An untrained ParallelSpec drafter keeps the target's distribution (the TV test of
test_sampling_lossless), chain and tree, in sd, mcsd and seed: q_t does not depend on the drafted
path, and the verifier sees the q each candidate was drawn from."""
from __future__ import annotations

from collections import Counter

import pytest
import torch

from test_sampling_lossless import PROMPT, SAMPLES, SETTINGS, exact_distribution, pair, tv, tv_bound  # noqa: F401 (pair: a fixture)
from seed_tot import Engine
from seed_tot.engine.drafters import ParallelDrafter


@pytest.mark.parametrize("mode,k_config,setting,batch", [("sd", (1,), "temperature", 1),
                                                         ("seed", (2, 2), "top_p", None)])  # None: batched forwards
def test_parallelspec_samples_follow_the_target_distribution(pair, mode, k_config, setting, batch):
    target, _ = pair
    torch.manual_seed(0)
    drafter = ParallelDrafter(target, n_masks=1, n_layers=1).eval()  # untrained: drafts 2 tokens per forward
    params = SETTINGS[setting]
    exact = exact_distribution(target, params)
    results = Engine(target, drafter).generate([PROMPT] * SAMPLES, params, mode=mode, k_config=k_config, n_workers=8,
                                                          draft_batch=batch, verify_batch=batch)
    stats = [r.stats for r in results]
    # drafts are both accepted and rejected, so an unfaithful verifier would show in the distribution
    assert 0.05 < sum(s.accepted for s in stats) / sum(s.draft_depth for s in stats) < 0.95
    forwards, rounds = sum(s.draft_forwards for s in stats), sum(s.verifications for s in stats)
    assert forwards == rounds if batch == 1 else forwards < rounds  # one draft forward a round (shared when batched)
    assert tv(Counter(tuple(r.token_ids) for r in results), exact, SAMPLES) < tv_bound(exact, SAMPLES)
