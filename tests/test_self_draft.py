"""The layer-truncated 'self' draft (`--draft self`: the target's first layers, parameters shared) in
every drafting mode: greedy output equals the target alone, sampled output follows the target's
distribution (the TV test of test_sampling_lossless), and the draft the engine runs is the draft
model itself (its layers see their history in batched forwards), so a self draft whose dropped
layers add nothing is accepted every time."""
from __future__ import annotations

from collections import Counter

import pytest
import torch

from conftest import reference_greedy, tiny_model
from seed_tot import Engine, SamplingParams
from seed_tot.engine import models
from test_sampling_lossless import SAMPLES, VOCAB, exact_distribution, sample_through_engine, tv, tv_bound

PROMPTS = [[2, 7], [1, 2, 3, 4, 5, 6, 7], [9], [4, 4, 4]]
NEW = 16
MODES = [("sd", (1, 1, 1), 1), ("mcsd", (2, 2, 1), 1), ("seed", (1, 1), 1), ("seed", (2, 1), None),
         ("seed", (1, 1, 1), None)]  # None: batched draft and verification forwards


def damped(arch: str, damp: float, vocab: int = 96, seed: int = 9):
    """A 4-layer target whose layers 2-3 add `damp` times their output to the residual stream: its
    2-layer self draft agrees always (damp=0) or often (0 < damp < 1)."""
    target = tiny_model(arch, seed=seed, vocab=vocab, layers=4)
    with torch.no_grad():
        for layer in target.model.layers[2:]:
            layer.self_attn.o_proj.weight.mul_(damp)
            layer.mlp.down_proj.weight.mul_(damp)
    return target


def greedy_counts(arch: str, damp: float, mode, k_config, batch) -> tuple[int, int]:
    """Greedy output of the damped target's 2-layer self draft, checked against the target alone;
    returns (accepted, offered) draft tokens."""
    target = damped(arch, damp)
    batches = dict(draft_batch=batch, verify_batch=batch) if mode == "seed" else {}
    results = Engine(target, models.truncated_draft(target, 2)).generate(
        PROMPTS, SamplingParams(max_new_tokens=NEW, temperature=0), mode=mode, k_config=k_config, **batches)
    assert [r.token_ids for r in results] == [reference_greedy(target, p, NEW) for p in PROMPTS]
    return sum(r.stats.accepted for r in results), sum(r.stats.draft_depth for r in results)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("mode,k_config,batch", MODES)
def test_a_self_draft_whose_dropped_layers_add_nothing_is_accepted_every_time(arch, mode, k_config, batch):
    accepted, offered = greedy_counts(arch, 0.0, mode, k_config, batch)
    assert accepted == offered > 0


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("mode,k_config,batch", MODES)
def test_greedy_self_draft_output_equals_the_target_alone(arch, mode, k_config, batch):
    accepted, offered = greedy_counts(arch, 0.5, mode, k_config, batch)
    assert 0 < accepted < offered  # drafts both accepted and rejected


# batched seed (fast): a chain and a tree; sd's and mcsd's rows one at a time take the same draft forwards
@pytest.mark.parametrize("mode,k_config,setting,batch", [("seed", (1, 1), "temperature", None),
                                                         ("seed", (2, 2), "top_k", None),
                                                         ("seed", (2, 2), "top_p", None)])
def test_self_draft_samples_follow_the_target_distribution(mode, k_config, setting, batch):
    from test_sampling_lossless import SETTINGS

    target = tiny_model("llama", seed=21, vocab=VOCAB, layers=4)
    draft = models.truncated_draft(target, 2)
    exact = exact_distribution(target, SETTINGS[setting])
    bound = tv_bound(exact, SAMPLES)
    draft_law = exact_distribution(draft, SETTINGS[setting])
    assert tv(Counter({s: p * SAMPLES for s, p in draft_law.items()}), exact, SAMPLES) > bound, \
        "draft too close to the target for this test to detect a lossy verifier"
    results, _ = sample_through_engine(target, draft, setting, mode, k_config, batch)
    assert tv(Counter(tuple(r.token_ids) for r in results), exact, SAMPLES) < bound


def test_the_self_draft_has_its_own_config_and_hooks_everywhere_and_the_targets_parameters():
    target = tiny_model("qwen2", seed=9, layers=4)
    draft = models.truncated_draft(target, 2)
    assert all(getattr(m, "config", draft.config) is draft.config for m in draft.modules())
    assert all(getattr(m, "config", target.config) is target.config for m in target.modules())
    assert {id(p) for p in draft.parameters()} <= {id(p) for p in target.parameters()}
    seen = []
    draft.get_output_embeddings().register_forward_pre_hook(lambda module, args: seen.append(1))
    with torch.no_grad():
        target(torch.tensor([[1, 2, 3]]))
    assert not seen  # a capture hooked on the draft's LM head does not fire on target forwards
