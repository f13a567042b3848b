"""The engine on CUDA: every mode, through the step loop and the CUDA-graph forwards, gives the
target's own greedy tokens. Skipped where there is no CUDA device (CI's CPU); a GPU session runs it."""
from __future__ import annotations

import pytest
import torch

from conftest import noisy_copy, reference_greedy, tiny_model
from seed_tot import Engine, SamplingParams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

MODES = [dict(mode="ar"), dict(mode="parallel"), dict(mode="sd", k_config=(1, 1, 1)),
         dict(mode="mcsd", k_config=(2, 2, 1)), dict(mode="seed", k_config=(1, 1, 1)),
         dict(mode="seed", k_config=(2, 1), verify_batch=1, draft_batch=1)]


@pytest.fixture(scope="module")
def cuda_pair():
    target = tiny_model("llama", seed=11)
    draft = noisy_copy(target, 0.01)
    prompts = [[3, 1, 4, 1, 5], [9, 2, 6], [5, 3, 5, 8, 9, 7, 9], [3, 1, 4, 1, 5]]
    refs = [reference_greedy(target, p, 24) for p in prompts]  # on the CPU: the reference
    return target.cuda(), draft.cuda(), prompts, refs


@pytest.mark.parametrize("settings", MODES, ids=lambda s: "-".join(str(v) for v in s.values()))
def test_every_mode_on_cuda_gives_the_targets_greedy_tokens(cuda_pair, settings):
    target, draft, prompts, refs = cuda_pair
    results = Engine(target, draft).generate(prompts, SamplingParams(max_new_tokens=24, temperature=0), **settings)
    assert [r.token_ids for r in results] == refs


def test_sampled_rows_on_cuda_do_not_depend_on_what_shares_their_forwards(cuda_pair):
    target, draft, prompts, _ = cuda_pair
    params = SamplingParams(max_new_tokens=16, temperature=0.8, seed=4)
    engine = Engine(target, draft)
    together = engine.generate(prompts, params, mode="seed", k_config=(1, 1))
    alone = engine.generate(prompts, params, mode="sd", k_config=(1, 1))
    assert [r.token_ids for r in together] == [r.token_ids for r in alone]


@pytest.mark.parametrize("policy", ["fixed", "opt-tree"])
def test_sampled_drafting_on_cuda_draws_from_each_sequences_host_generator(cuda_pair, policy):
    """A sequence's generator lives on the host; drafting from a distribution on the GPU must still
    draw from it (torch refuses a generator of another device), trees included."""
    target, draft, prompts, _ = cuda_pair
    params = SamplingParams(max_new_tokens=12, temperature=0.9, seed=2)
    k_config = (2, 1)
    results = Engine(target, draft).generate(prompts, params, mode="seed", k_config=k_config, draft_policy=policy)
    assert all(len(r.token_ids) == 12 for r in results)
