"""A ParallelSpec drafter that reads the target's hidden states (engine/target_features.py): every
entry it caches read exactly f_{p-1} of the target (prefill, shared prompt stretches, single and
batched rounds), greedy output is the target's, samples follow its distribution, training equals
inference, and what cannot feed it features refuses it."""
from __future__ import annotations

import asyncio
from collections import Counter

import pytest
import torch

from conftest import reference_greedy, tiny_model
from test_sampling_lossless import SAMPLES, pair, sample_through_engine, tv, tv_bound  # noqa: F401 (pair: a fixture)
from seed_tot import DecodeSpec, Engine, SamplingParams
from seed_tot.engine.drafters import ParallelDrafter, load_drafter, save_drafter
from seed_tot.engine.kv_cache import KVCache
from seed_tot.engine.seed import SeedScheduler
from seed_tot.engine.speculative import draft_round, prefill, verify_round
from seed_tot.training.drafter_train import Sample, group_batch, group_logits, sample_loss

PROMPT = [3, 17, 42, 8, 61, 5]


def feature_drafter(target, n_masks: int = 3, seed: int = 0) -> ParallelDrafter:
    """An untrained drafter whose entries depend strongly on the features (the [I | 0] start would not)."""
    torch.manual_seed(seed)
    drafter = ParallelDrafter(target, n_masks=n_masks, n_layers=1, target_features=True).eval()
    with torch.no_grad():
        drafter.fuse.weight.normal_(0, 0.2)
    return drafter


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", seed=3)


@torch.no_grad()
def true_slots(target, tokens: list[int]) -> torch.Tensor:
    """f_{p-1} for every position p of `tokens`, from one plain forward of the target (zeros at p = 0)."""
    hidden = target.base_model(input_ids=torch.tensor([tokens])).last_hidden_state[0]
    return torch.cat([torch.zeros_like(hidden[:1]), hidden[:-1]])


def assert_draft_cache_read_the_true_features(target, runtime, seq, check_sensitive: bool = False) -> None:
    """runtime: the drafter's ModelRuntime, through which a fresh prefill is the reference."""
    n = seq.draft.committed
    fresh = KVCache()
    prefill(runtime, fresh, seq.tokens[: n + 1], true_slots(target, seq.tokens[:n]))
    mine = [(layer.keys, layer.values) for layer in seq.draft.cache.layers]
    for (keys, values), ref in zip(mine, fresh.cache.layers):
        torch.testing.assert_close(keys[..., :n, :], ref.keys, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(values[..., :n, :], ref.values, atol=1e-4, rtol=1e-4)
    if check_sensitive:  # the same tokens with zero features give other entries: the check can fail
        blind = KVCache()
        prefill(runtime, blind, seq.tokens[: n + 1], torch.zeros(n, runtime.model.feature_size))
        assert not torch.allclose(mine[0][0][..., :n, :], blind.cache.layers[0].keys, atol=1e-3)


def test_every_round_the_drafter_cache_holds_what_the_true_target_features_give(target):
    drafter = feature_drafter(target)
    engine = Engine(target, drafter)
    params = SamplingParams(max_new_tokens=24, temperature=0)
    seqs, k_config = engine._start([PROMPT], params, "sd", (1, 1, 1))
    seq, policy = seqs[0], engine.policy("sd", k_config, params, "parallelspec")
    assert_draft_cache_read_the_true_features(target, engine.draft_runtime, seq)  # the prefill
    while not seq.done:
        tree, node_entry = draft_round(engine.draft_runtime, seq, policy, params, engine.vocab_size)
        verify_round(engine.target_runtime, seq, tree, params, engine.vocab_size, node_entry)
        assert seq.draft.parents == []  # the masks never stay
        assert_draft_cache_read_the_true_features(target, engine.draft_runtime, seq, check_sensitive=True)


@pytest.mark.parametrize("batch", [1, None])
def test_batched_seed_rows_with_shared_prompt_stretches_read_their_own_features(target, batch):
    drafter = feature_drafter(target, seed=1)
    engine = Engine(target, drafter)
    common = [(7 * i) % 90 + 1 for i in range(40)]  # longer than MIN_SHARED: scored once, forked
    prompts = [common + [5, 9], common + [5, 9], common + [11], PROMPT]
    params = SamplingParams(max_new_tokens=16, temperature=0)
    seqs, k_config = engine._start(prompts, params, "seed", (2, 2), verify_batch=batch, draft_batch=batch)
    for seq in seqs:
        assert_draft_cache_read_the_true_features(target, engine.draft_runtime, seq)
    policy = engine.policy("seed", k_config, params, "parallelspec")
    asyncio.run(SeedScheduler(engine).run(seqs, policy, DecodeSpec(verify_batch=batch, draft_batch=batch)))
    for prompt, seq in zip(prompts, seqs):
        assert seq.generated == reference_greedy(target, prompt, 16)
        assert_draft_cache_read_the_true_features(target, engine.draft_runtime, seq, check_sensitive=True)


@pytest.mark.parametrize("mode,k_config,batch", [("sd", (1,), 1), ("mcsd", (2, 2), 1), ("seed", (1,), 1),
                                                 ("seed", (2, 2), None)])
def test_greedy_output_equals_the_target_alone(target, mode, k_config, batch):
    drafter = feature_drafter(target, seed=2)
    prompts = [PROMPT, [9, 1, 77], PROMPT[::-1], [4]]  # [4]: a one-token prompt has no prefill at all
    params = SamplingParams(max_new_tokens=20, temperature=0)
    results = Engine(target, drafter).generate(prompts, params, mode=mode, k_config=k_config, draft_batch=batch,
                                               verify_batch=batch)
    for prompt, result in zip(prompts, results):
        assert result.token_ids == reference_greedy(target, prompt, 20)


@pytest.mark.parametrize("mode,k_config,setting,batch", [("sd", (1,), "temperature", 1),
                                                         ("seed", (2, 2), "top_p", None)])
def test_samples_follow_the_target_distribution(pair, mode, k_config, setting, batch):
    target, _ = pair
    drafter = feature_drafter(target, n_masks=1)
    results, exact = sample_through_engine(target, drafter, setting, mode, k_config, batch, draft_policy="parallelspec")
    assert tv(Counter(tuple(r.token_ids) for r in results), exact, SAMPLES) < tv_bound(exact, SAMPLES)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@torch.no_grad()
def test_training_forward_at_every_group_equals_inference_with_the_features(arch):
    target = tiny_model(arch, seed=5)
    drafter = feature_drafter(target, seed=4)
    tokens = torch.randint(0, 96, (12,), generator=torch.Generator().manual_seed(1)).tolist()
    hidden = target.base_model(input_ids=torch.tensor([tokens])).last_hidden_state[0]
    anchors = list(range(len(tokens) - 1))
    trained = group_logits(drafter, group_batch(drafter, tokens, anchors, hidden))
    slots = true_slots(target, tokens)
    for g, t in enumerate(anchors):
        for j in range(drafter.n_masks + 1):
            ids = tokens[: t + 1] + [drafter.mask_id(i) for i in range(1, j + 1)]
            feats = torch.cat([slots[: t + 1], slots[t: t + 1].expand(j, -1)])[None]  # a mask reads its anchor's f
            inference = drafter(input_ids=torch.tensor([ids]), target_features=feats).logits[0, -1]
            torch.testing.assert_close(trained[g, j], inference, atol=2e-5, rtol=1e-4)
    blind = group_logits(drafter, group_batch(drafter, tokens, anchors, torch.zeros_like(hidden)))
    assert not torch.allclose(trained, blind, atol=1e-3)  # the features really reach the training forward


def test_a_feature_drafter_trains_only_with_the_features_of_its_samples(target):
    drafter = feature_drafter(target)
    sample = Sample(PROMPT + [9, 1, 77, 4], len(PROMPT))
    with pytest.raises(ValueError, match="hidden states"):
        sample_loss(drafter, sample, None, torch.Generator().manual_seed(0))
    sample.hidden = target.base_model(input_ids=torch.tensor([sample.tokens])).last_hidden_state[0].detach()
    loss, stats = sample_loss(drafter, sample, None, torch.Generator().manual_seed(0))
    assert loss is not None and stats.total == [4, 3, 2, 1]  # every labelled group slot of the response


def test_policies_that_feed_drafted_tokens_and_pipelines_refuse_it(target):
    engine = Engine(target, feature_drafter(target))
    params = SamplingParams(max_new_tokens=4, temperature=0)
    with pytest.raises(ValueError, match="hidden states"):
        engine.generate([PROMPT], params, mode="sd", draft_policy="fixed")
    with pytest.raises(ValueError, match="hidden states"):
        engine.generate_pipelined([PROMPT], params, mode="pipedec")
    with pytest.raises(ValueError, match="needs \\[MASK\\] tokens"):
        ParallelDrafter(target, n_masks=0, target_features=True)


def test_saved_feature_drafter_loads_with_its_fuse_layer(tmp_path, target):
    drafter = feature_drafter(target)
    save_drafter(drafter, tmp_path / "d", target, "tiny")
    loaded = load_drafter(tmp_path / "d", target, "tiny")
    assert loaded.uses_target_features
    torch.testing.assert_close(loaded.fuse.weight, drafter.fuse.weight)
    params = SamplingParams(max_new_tokens=12, temperature=0)
    # every level verified (cut=none): the default cut prices levels by timed costs, so its counters vary run to run
    run = dict(mode="sd", k_config=(1, 1, 1), draft_policy="parallelspec", policy_options={"cut": "none"})
    a = Engine(target, drafter).generate([PROMPT], params, **run)[0]
    b = Engine(target, loaded).generate([PROMPT], params, **run)[0]
    assert a.token_ids == b.token_ids and a.stats.accepted == b.stats.accepted


@torch.no_grad()
def test_a_round_drafts_what_one_forward_on_the_true_features_gives_with_masks_reading_their_anchors_f(target):
    drafter = feature_drafter(target, seed=5)
    engine = Engine(target, drafter)
    params = SamplingParams(max_new_tokens=8, temperature=1.0)  # sampled: the tree keeps each q_t
    seqs, k_config = engine._start([PROMPT], params, "sd", (1, 1, 1, 1))
    policy = engine.policy("sd", k_config, params, "parallelspec")
    tree, _ = draft_round(engine.draft_runtime, seqs[0], policy, params, engine.vocab_size)
    slots = true_slots(target, PROMPT)
    masks = [drafter.mask_id(j) for j in (1, 2, 3)]
    feats = torch.cat([slots, slots[-1:].expand(3, -1)])[None]
    logits = drafter(input_ids=torch.tensor([PROMPT + masks]), target_features=feats).logits[0, -4:]
    q = torch.softmax(logits[:, : engine.vocab_size].float(), dim=-1)
    torch.testing.assert_close(torch.stack([tree.q(i) for i in range(4)]), q, atol=1e-5, rtol=1e-4)


@torch.no_grad()
def test_sample_features_are_computed_over_the_whole_prompt_as_at_inference(target):
    from seed_tot.training.drafter_data import attach_target_hidden

    prompt, response = [(5 * i) % 90 + 2 for i in range(80)], [9, 1, 77, 4]
    sample = Sample(prompt[-10:] + response, 10)  # the sample keeps 10 prompt tokens
    attach_target_hidden(target, [sample], [[1, 2, 3], prompt])
    whole = target.base_model(input_ids=torch.tensor([prompt + response])).last_hidden_state[0]
    torch.testing.assert_close(sample.hidden, whole[-len(sample.tokens):], atol=1e-5, rtol=1e-4)
    cut = target.base_model(input_ids=torch.tensor([sample.tokens])).last_hidden_state[0]
    assert not torch.allclose(sample.hidden, cut, atol=1e-3)  # what a forward over the cut sample would give
    with pytest.raises(ValueError, match="not the end of any"):
        attach_target_hidden(target, [Sample([7, 7, 7, 1], 3)], [prompt])


@torch.no_grad()
def test_samples_of_one_prompt_score_it_once_and_get_the_states_of_a_whole_forward(target):
    from seed_tot.training.drafter_data import attach_target_hidden

    prompt = [(7 * i) % 90 + 2 for i in range(60)]
    responses = [[9, 1, 77, 4], [3, 3], [50, 8, 8, 8, 21]]
    samples = [Sample(prompt[-12:] + r, 12) for r in responses] + [Sample(prompt[-5:], 5)]  # the last: no response
    scored = []
    hook = target.base_model.register_forward_hook(lambda m, args, kwargs, out: scored.append(kwargs["input_ids"].shape[1]),
                                                   with_kwargs=True)
    try:
        attach_target_hidden(target, samples, [prompt])
    finally:
        hook.remove()
    assert scored == [len(prompt)] + [len(r) for r in responses]  # the prompt once, then each response alone
    for sample in samples:
        whole = target.base_model(input_ids=torch.tensor([prompt + sample.tokens[sample.start:]])).last_hidden_state[0]
        torch.testing.assert_close(sample.hidden, whole[-len(sample.tokens):], atol=1e-5, rtol=1e-4)
