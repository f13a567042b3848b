"""parallelspec passes=P: pass p feeds the drafted level p-1 back to the drafter, so the levels below
it are drawn from q's that have seen it. Each pass is one draft forward; accepted fed nodes stay in
the drafter's cache, which then equals a fresh prefill; greedy output is the target's and sampled
output has its distribution, chain and tree, sd and batched seed."""
from __future__ import annotations

import pytest
import torch

from conftest import reference_greedy
from test_parallelspec import PROMPT, assert_drafter_cache_is_a_fresh_prefill, drafter, target  # noqa: F401 (fixtures)
from test_parallelspec_cut import STEEP
from test_sampling_lossless import assert_policy_samples_follow_the_target, parallelspec_pair
from seed_tot import Engine, SamplingParams
from seed_tot.engine.drafters import ParallelDrafter
from seed_tot.engine.policies.parallelspec import ParallelSpecPolicy
from seed_tot.engine.speculative import draft_round, verify_round

@pytest.fixture(scope="module")
def oracle(target):
    """Both of the target's layers, its norm, embeddings and head: on real tokens it IS the target, so
    every fed level is what the target would say; its masks are untrained guesses."""
    torch.manual_seed(0)
    return ParallelDrafter(target, n_masks=3, n_layers=2).eval()


@torch.no_grad()
def _last_logits(drafter, ids: list[int]) -> torch.Tensor:
    return drafter(input_ids=torch.tensor([ids])).logits[0, -1]


@pytest.mark.parametrize("passes", [1, 2, 3])
def test_pass_p_draws_the_levels_below_a_fed_node_from_the_drafters_forward_on_it(target, drafter, passes):
    engine = Engine(target, drafter)
    params = SamplingParams(max_new_tokens=8, temperature=0)
    seqs, _ = engine._start([PROMPT], params, "sd", (1,))
    calls = []
    handle = drafter.register_forward_pre_hook(lambda module, args, kwargs: calls.append(1), with_kwargs=True)
    try:
        policy = ParallelSpecPolicy(drafter, (1,), depth=4, passes=passes)
        tree, node_entry = draft_round(engine.draft_runtime, seqs[0], policy, params, engine.vocab_size)
    finally:
        handle.remove()
    assert len(calls) == passes and tree.depth() == 4
    assert sorted(node_entry) == list(range(passes - 1))  # the fed levels' nodes, each with its cache entry
    x = tree.tokens  # a chain
    for t in range(4):
        anchor = min(t, passes - 1)  # the deepest fed level above level t+1
        ids = PROMPT + x[:anchor] + [drafter.mask_id(j) for j in range(1, t - anchor + 1)]
        assert x[t] == int(_last_logits(drafter, ids).argmax()), (t, anchor)
    if passes == 1:  # q_2 of a single pass never saw x_1: the masks' guess differs from the conditioned one here
        assert x[1] != int(_last_logits(drafter, PROMPT + x[:1]).argmax())


@pytest.mark.parametrize("passes", [2, 3])
def test_accepted_fed_nodes_stay_and_the_drafter_cache_equals_a_fresh_prefill(target, oracle, passes):
    engine = Engine(target, oracle)
    params = SamplingParams(max_new_tokens=24, temperature=0)
    seqs, k_config = engine._start([PROMPT], params, "sd", (1,))
    seq, policy = seqs[0], ParallelSpecPolicy(oracle, (1,), depth=4, passes=passes)
    rounds = 0
    while not seq.done:
        budget = params.max_new_tokens - len(seq.generated)
        tree, node_entry = draft_round(engine.draft_runtime, seq, policy, params, engine.vocab_size)
        acc = verify_round(engine.target_runtime, seq, tree, params, engine.vocab_size, node_entry)
        rounds += 1
        # the oracle's fed levels are the target's own tokens: at least `passes` drafted tokens accepted
        assert len(acc.path) >= min(passes, budget)
        assert_drafter_cache_is_a_fresh_prefill(engine.draft_runtime, seq)
    assert seq.generated == reference_greedy(target, PROMPT, 24)
    assert seq.stats.draft_forwards <= passes * rounds


@pytest.mark.parametrize("mode,k_config,batch,passes", [("sd", (1,), 1, 2), ("seed", (1,), None, 3),
                                                        ("seed", (2, 2), None, 2), ("mcsd", (2, 1), 1, 3)])
def test_greedy_output_equals_the_target_alone_with_passes(target, drafter, mode, k_config, batch, passes):
    prompts = [PROMPT, [9, 1, 77], PROMPT[::-1]]
    params = SamplingParams(max_new_tokens=20, temperature=0)
    results = Engine(target, drafter).generate(prompts, params, mode=mode, k_config=k_config, draft_batch=batch,
                                               verify_batch=batch, policy_options={"passes": passes},
                                               draft_policy="parallelspec")
    for prompt, result in zip(prompts, results):
        assert result.token_ids == reference_greedy(target, prompt, 20)


def test_greedy_output_equals_the_target_alone_with_passes_and_the_joint_cut(target, drafter):
    prompts = [PROMPT, [9, 1, 77], PROMPT[::-1]]
    params = SamplingParams(max_new_tokens=20, temperature=0)
    policy = ParallelSpecPolicy(drafter, (1,), depth=4, costs=STEEP, passes=2)
    results = Engine(target, drafter).generate(prompts, params, mode="seed", draft_batch=None, verify_batch=None,
                                               draft_policy=policy)
    for prompt, result in zip(prompts, results):
        assert result.token_ids == reference_greedy(target, prompt, 20)


@pytest.mark.parametrize("mode,k_config,setting,batch", [("sd", (1,), "temperature", 1),
                                                         ("seed", (2, 2), "top_p", None)])
def test_sampled_output_follows_the_target_distribution_with_passes(mode, k_config, setting, batch):
    """Two levels (the fixture's length): level 2 is drawn from the drafter's forward on each level-1
    node, one q per sibling group, which is what the verifier is given."""
    target, drafter = parallelspec_pair()
    policy = ParallelSpecPolicy(drafter, k_config, depth=2, passes=2)
    results = assert_policy_samples_follow_the_target(target, drafter, policy, setting, mode, k_config, batch)
    stats = [r.stats for r in results]
    rounds = sum(s.verifications for s in stats)
    assert sum(s.draft_forwards for s in stats) > (1.5 if batch == 1 else 0.2) * rounds  # pass 2 ran


def test_passes_option_errors(target, drafter):
    engine = Engine(target, drafter)
    params = SamplingParams(max_new_tokens=4, temperature=0)
    with pytest.raises(ValueError, match="passes=0 must be >= 1"):
        engine.generate([PROMPT], params, mode="sd", draft_policy="parallelspec", policy_options={"passes": 0})
    with pytest.raises(ValueError, match="option passes='two' is not an int"):
        engine.generate([PROMPT], params, mode="sd", draft_policy="parallelspec", policy_options={"passes": "two"})
    featured = ParallelDrafter(target, n_masks=2, n_layers=1, target_features=True)
    with pytest.raises(ValueError, match="reads the target's hidden states"):
        ParallelSpecPolicy(featured, (1,), passes=2)
