"""Sampled output has exactly the target's distribution (temperature, top-k, top-p applied).

The reference is computed by enumeration with transformers' own logits warpers; the engine's
samples must lie within a total-variation bound: the largest TV among 50,000 simulated draws of as
many samples from the exact distribution itself (the null), which shrinks as 1/sqrt(samples). Each
test also checks that the draft's own distribution lies *outside* that bound, so the test can fail.
"""
from __future__ import annotations

import functools
import itertools
import math
from collections import Counter

import numpy as np
import pytest
import torch
from transformers.generation.logits_process import (TemperatureLogitsWarper, TopKLogitsWarper,
                                                    TopPLogitsWarper)

from conftest import noisy_copy, tiny_model
from seed_tot import Engine, SamplingParams
from seed_tot.engine.draft_tree import DraftTree
from seed_tot.engine.sampling import process_logits
from seed_tot.engine.verify import accept_tokens

VOCAB = 8
LENGTH = 2
PROMPT = [1, 4, 2]
# 800 samples against the simulated null maximum (tv_bound) flag a TV of 0.10-0.11 on this fixture's
# three settings: no weaker than the 0.10-0.13 that 2500 samples flagged against the former analytic
# bound (3x the expected TV), at a third of the engine's work.
SAMPLES = 800


def warp(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    scores = logits.float()
    for warper in ([TemperatureLogitsWarper(params.temperature)]
                   + ([TopKLogitsWarper(params.top_k)] if params.top_k else [])
                   + ([TopPLogitsWarper(params.top_p)] if params.top_p < 1 else [])):
        scores = warper(None, scores)
    return scores.softmax(-1)


@torch.no_grad()
def exact_distribution(model, params: SamplingParams) -> dict[tuple[int, ...], float]:
    """P(x1..xL | prompt) for every continuation, from full forwards of every sequence."""
    seqs = list(itertools.product(range(VOCAB), repeat=LENGTH))
    ids = torch.tensor([PROMPT + list(s) for s in seqs])
    probs = warp(model(ids).logits[:, len(PROMPT) - 1: -1].reshape(-1, VOCAB), params).reshape(len(seqs), LENGTH, VOCAB)
    out = {}
    for i, s in enumerate(seqs):
        out[s] = math.prod(float(probs[i, t, s[t]]) for t in range(LENGTH))
    return out


def tv(empirical: Counter, exact: dict, n: int) -> float:
    return 0.5 * sum(abs(empirical.get(s, 0) / n - p) for s, p in exact.items())


NULL_DRAWS = 50_000


def tv_bound(exact: dict, n: int) -> float:
    """The largest TV among NULL_DRAWS simulated n-sample draws from `exact` itself. If the engine's
    n samples do follow `exact`, they exceed it with probability about 1/(NULL_DRAWS + 1) (the
    engine's TV and the simulated ones are then exchangeable): flaky ~never, yet ~half the former
    3x-the-expectation bound, so that fewer samples detect the same departure."""
    return _null_tv_max(tuple(exact.values()), n)


@functools.lru_cache(maxsize=None)
def _null_tv_max(probs: tuple[float, ...], n: int) -> float:
    p = np.array(probs) / sum(probs)
    rng = np.random.default_rng(0)  # fixed: the same bound on every run
    counts = rng.multinomial(n, p, size=NULL_DRAWS)
    return float((0.5 * np.abs(counts / n - p).sum(1)).max())


SETTINGS = {
    "temperature": SamplingParams(max_new_tokens=LENGTH, temperature=0.7),
    "top_k": SamplingParams(max_new_tokens=LENGTH, temperature=1.0, top_k=4),
    "top_p": SamplingParams(max_new_tokens=LENGTH, temperature=1.3, top_p=0.8),
}


def sample_through_engine(target, draft, setting: str, mode: str, k_config, batch: int | None = 1,
                          padding: dict[int, int] | None = None, draft_policy=None):
    """SAMPLES continuations of PROMPT through the engine (8 workers; `batch`: draft_batch and verify_batch;
    `padding`: both models' query padding), and the exact distribution they must follow. Asserts drafts
    were both accepted and rejected, so that an unfaithful verifier would show in the distribution."""
    params = SETTINGS[setting]
    engine = Engine(target, draft)
    if padding is not None:
        engine.target_runtime.set_padding(padding)
        engine.draft_runtime.set_padding(padding)
    results = engine.generate([PROMPT] * SAMPLES, params, mode=mode, k_config=k_config, n_workers=8,
                              draft_batch=batch, verify_batch=batch, draft_policy=draft_policy)
    stats = [r.stats for r in results]
    assert 0.05 < sum(s.accepted for s in stats) / sum(s.draft_depth for s in stats) < 0.95
    return results, exact_distribution(target, params)


def parallelspec_pair(confident: bool = False):
    """This file's target and an untrained one-mask ParallelSpec drafter over it; confident: its final
    norm scaled 3x, so that its p̂ spans 0..1 like a trained drafter's."""
    from seed_tot.engine.drafters import ParallelDrafter

    target = tiny_model("llama", seed=21, vocab=VOCAB)
    torch.manual_seed(0)
    drafter = ParallelDrafter(target, n_masks=1, n_layers=1).eval()
    if confident:
        with torch.no_grad():
            drafter.model.norm.weight.mul_(3.0)
    return target, drafter


def assert_policy_samples_follow_the_target(target, drafter, policy, setting: str, mode: str, k_config,
                                            batch: int | None) -> list:
    """SAMPLES continuations of PROMPT (read when called, so a test may patch it) through `policy`:
    drafts both accepted and rejected, and the samples within the TV bound. Returns the results."""
    params = SETTINGS[setting]
    results = Engine(target, drafter).generate([PROMPT] * SAMPLES, params, mode=mode, k_config=k_config,
                                               n_workers=8, draft_batch=batch, verify_batch=batch, draft_policy=policy)
    stats = [r.stats for r in results]
    assert 0.05 < sum(s.accepted for s in stats) / sum(s.draft_depth for s in stats) < 0.95
    exact = exact_distribution(target, params)
    assert tv(Counter(tuple(r.token_ids) for r in results), exact, SAMPLES) < tv_bound(exact, SAMPLES)
    return results


@pytest.fixture(scope="module")
def pair():
    target = tiny_model("llama", seed=21, vocab=VOCAB)
    draft = noisy_copy(target, 0.6, seed=22)  # related but clearly different: both accept and reject happen
    return target, draft


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("mode,k_config", [("sd", (1, 1)), ("mcsd", (2, 2)), ("mcsd", (3, 1)), ("seed", (1, 1)), ("seed", (2, 2))])
def test_sampled_continuations_follow_the_target_distribution(pair, setting, mode, k_config):
    target, draft = pair
    params = SETTINGS[setting]
    exact = exact_distribution(target, params)
    draft_exact = exact_distribution(draft, params)
    bound = tv_bound(exact, SAMPLES)
    assert tv(Counter({s: p * SAMPLES for s, p in draft_exact.items()}), exact, SAMPLES) > bound, \
        "draft too close to the target for this test to detect a lossy verifier"
    results, _ = sample_through_engine(target, draft, setting, mode, k_config)
    assert tv(Counter(tuple(r.token_ids) for r in results), exact, SAMPLES) < bound


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_ar_samples_follow_the_target_distribution(pair, setting):
    """ar against the exact law itself, not only through its same-seed coupling to parallel (which
    would pass if both sampled alike but wrongly). The target alone, unwarped, lies outside the bound
    (TV about 0.18-0.21 against 0.09-0.11 here): a sampler that skipped temperature, top-k or top-p
    would fail."""
    target, _ = pair
    params = SETTINGS[setting]
    exact = exact_distribution(target, params)
    bound = tv_bound(exact, SAMPLES)
    unwarped = exact_distribution(target, SamplingParams(max_new_tokens=LENGTH, temperature=1.0))
    assert tv(Counter({s: p * SAMPLES for s, p in unwarped.items()}), exact, SAMPLES) > bound
    results = Engine(target).generate([PROMPT] * SAMPLES, params, mode="ar")
    assert all(r.stats.draft_depth == 0 and len(r.token_ids) == LENGTH for r in results)  # one token a step
    assert tv(Counter(tuple(r.token_ids) for r in results), exact, SAMPLES) < bound


@pytest.mark.parametrize("narrow", [dict(top_k=2), dict(temperature=1.3, top_p=0.8)])
def test_sibling_groups_wider_than_q_follow_the_target_distribution(pair, narrow):
    """Three siblings over a q of fewer tokens: top_k=2 keeps the groups two wide; under top_p, whose
    support only the device knows, a group ends in draws from a spent q (tokens of no mass, drawn on
    the device). Both must leave the output's distribution exact."""
    target, draft = pair
    params = SamplingParams(max_new_tokens=LENGTH, **{"temperature": 1.0, **narrow})
    exact = exact_distribution(target, params)
    results = Engine(target, draft).generate([PROMPT] * SAMPLES, params, mode="mcsd", k_config=(3, 1), n_workers=8)
    assert sum(r.stats.accepted for r in results) > 0.05 * SAMPLES
    assert tv(Counter(tuple(r.token_ids) for r in results), exact, SAMPLES) < tv_bound(exact, SAMPLES)


# The verifier-alone tests: 13,000 trials against the simulated null's maximum (tv_bound) flag a TV of
# about 0.02, the fixed threshold that 20,000 trials were held to before, at two thirds of the loop.
VERIFIER_TRIALS = 13_000


@pytest.mark.parametrize("without_replacement", [True, False])
@pytest.mark.parametrize("n_candidates", [1, 2, 3])
def test_accept_tokens_first_token_is_distributed_as_p(n_candidates, without_replacement):
    """The verifier alone, on fixed p and q: the emitted token follows p whatever q is."""
    gen = torch.Generator().manual_seed(0)
    p = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05, 0.0])
    q = torch.tensor([0.1, 0.4, 0.0, 0.2, 0.2, 0.1])
    trials, counts = VERIFIER_TRIALS, torch.zeros(6)
    for _ in range(trials):
        if without_replacement:
            tokens = torch.multinomial(q, n_candidates, replacement=False, generator=gen).tolist()
        else:
            tokens = torch.multinomial(q, n_candidates, replacement=True, generator=gen).tolist()
        tree = DraftTree([-1] * n_candidates, tokens, q.expand(n_candidates, -1), without_replacement)
        target_probs = torch.cat([p[None], p.expand(n_candidates, -1)])
        counts[accept_tokens(tree, target_probs, greedy=False, generator=gen).tokens[0]] += 1
    empirical = counts / trials
    assert 0.5 * (empirical - p).abs().sum() < tv_bound(dict(enumerate(p.tolist())), trials)
    assert counts[5] == 0  # a token the target gives no mass is never emitted


def test_lossy_rule_is_caught_by_the_distribution_check():
    """Sanity of the statistic: keeping every draft token (no rejection) is far from p."""
    p = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05, 0.0])
    q = torch.tensor([0.1, 0.4, 0.0, 0.2, 0.2, 0.1])
    assert 0.5 * (q - p).abs().sum() > tv_bound(dict(enumerate(p.tolist())), VERIFIER_TRIALS)


def test_process_logits_matches_transformers_warpers():
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(3)) * 3
    for params in [SamplingParams(temperature=0.5), SamplingParams(top_k=7), SamplingParams(top_p=0.6, temperature=1.2),
                   SamplingParams(top_k=10, top_p=0.9, temperature=0.8)]:
        torch.testing.assert_close(process_logits(logits, params, 50), warp(logits, params))
    greedy = process_logits(logits, SamplingParams(temperature=0), 50)
    assert torch.equal(greedy.argmax(-1), logits.argmax(-1)) and torch.equal(greedy.sum(-1), torch.ones(4))


def test_padded_vocabulary_columns_are_never_sampled():
    logits = torch.zeros(1, 12)
    logits[0, 10:] = 100.0  # padding rows of an embedding matrix beyond the tokenizer
    probs = process_logits(logits, SamplingParams(temperature=1.0), 10)
    assert probs.shape == (1, 10) and torch.allclose(probs.sum(), torch.tensor(1.0))
