"""PipeDec's tick scheduler (single-process simulation): lossless output and exact tick counts."""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from torch import nn

from conftest import noisy_copy, reference_greedy, tiny_model
from seed_tot import SamplingParams
from seed_tot.engine import Engine
from seed_tot.engine.cache_argument import cache_kwargs
from seed_tot.engine.pipeline import PipelineConfig, simulate

PROMPT = [5, 9, 13, 2, 7]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("mode", ["pipedec", "pp", "stpp"])
def test_greedy_pipeline_equals_target_alone(arch, mode):
    target = tiny_model(arch, layers=3)
    draft = noisy_copy(target, 0.01)
    params = SamplingParams(max_new_tokens=12, temperature=0)
    cfg = PipelineConfig(mode=mode, n_stages=3, width=3, children=2, k_config=(2, 1, 1))
    outs = simulate(target, draft, [PROMPT, PROMPT[:1]], params, cfg, 96)
    assert [o.result.token_ids for o in outs] == [reference_greedy(target, p, 12) for p in (PROMPT, PROMPT[:1])]


@pytest.mark.parametrize("width,children", [(1, 1), (4, 3)])
def test_sampled_pipedec_equals_ar_with_the_same_seed(width, children):
    target = tiny_model("llama", layers=2).double()
    draft = noisy_copy(target, 0.02)
    params = SamplingParams(max_new_tokens=16, temperature=1.0, seed=7)
    ar = Engine(target, draft, vocab_size=96).generate([PROMPT, PROMPT[:2]], params, mode="ar")
    outs = simulate(target, draft, [PROMPT, PROMPT[:2]], params,
                    PipelineConfig(mode="pipedec", n_stages=2, width=width, children=children), 96)
    assert [o.result.token_ids for o in outs] == [r.token_ids for r in ar]
    assert sum(o.stats.hits for o in outs) > 0  # the tree really was used, not restarted every token


def test_sampled_pp_equals_ar_with_the_same_seed():
    target = tiny_model("qwen2", layers=2).double()
    params = SamplingParams(max_new_tokens=12, temperature=0.8, top_k=20, seed=3)
    ar = Engine(target, None, vocab_size=96).generate([PROMPT], params, mode="ar")
    out = simulate(target, None, [PROMPT], params, PipelineConfig(mode="pp", n_stages=2), 96)[0]
    assert out.result.token_ids == ar[0].token_ids


@dataclass
class _Out:
    logits: torch.Tensor


class _Contrarian(nn.Module):
    """An always-wrong draft: the target itself with the target's own best token forbidden."""

    def __init__(self, target):
        super().__init__()
        self.target = target

    @property
    def device(self):
        return self.target.device

    @property
    def dtype(self):
        return self.target.dtype

    @property
    def config(self):
        return self.target.config

    def forward(self, cache=None, **kwargs):  # the cache under the name the target's release takes
        logits = self.target(**kwargs, **cache_kwargs(self.target, cache)).logits
        return _Out(logits.scatter(-1, logits.argmax(-1, keepdim=True), float("-inf")))


@pytest.mark.parametrize("n_stages", [1, 2, 4])
def test_oracle_draft_tick_counts(n_stages):
    target = tiny_model("llama", layers=4)
    n = 9
    params = SamplingParams(max_new_tokens=n, temperature=0)
    cfg = PipelineConfig(mode="pipedec", n_stages=n_stages, width=2, children=2)
    right = simulate(target, target, [PROMPT], params, cfg, 96)[0].stats  # the draft is the target: always right
    assert (right.ticks, right.hits) == (n + n_stages - 1, n)  # even the first token was drafted at tick 1
    wrong = simulate(target, _Contrarian(target), [PROMPT], params, cfg, 96)[0].stats
    assert (wrong.ticks, wrong.hits) == (n_stages * n, 0)
    pp = simulate(target, None, [PROMPT], params, PipelineConfig(mode="pp", n_stages=n_stages), 96)[0].stats
    assert pp.ticks == n_stages * n


def test_stpp_ticks_are_draft_levels_plus_stages_per_round():
    target = tiny_model("llama", layers=2)
    params = SamplingParams(max_new_tokens=9, temperature=0)
    out = simulate(target, target, [PROMPT], params, PipelineConfig(mode="stpp", n_stages=2, k_config=(1, 1)), 96)[0]
    # an always-right chain of 2 yields 3 tokens per round: rounds of 2 draft ticks + 2 stage ticks
    assert out.stats.rounds == 3 and out.stats.ticks == 3 * (2 + 2)
    assert out.result.token_ids == reference_greedy(target, PROMPT, 9)


def test_pipedec_needs_a_draft():
    target = tiny_model("llama", layers=2)
    with pytest.raises(ValueError, match="needs a draft model"):
        simulate(target, None, [PROMPT], SamplingParams(max_new_tokens=2), PipelineConfig(mode="pipedec"), 96)


def test_stpp_counts_no_hit_for_a_draft_accepted_past_eos():
    """An always-right chain of 3 runs past EOS at the second token: the round's output stops there,
    and so do its hits (the drafts after EOS are dropped with it)."""
    probe = tiny_model("llama", layers=2)
    eos = reference_greedy(probe, PROMPT, 2)[1]
    params = SamplingParams(max_new_tokens=9, temperature=0)
    out = simulate(probe, probe, [PROMPT], params, PipelineConfig(mode="stpp", n_stages=2, k_config=(1, 1, 1)),
                   96, eos_ids=frozenset({eos}))[0]
    assert out.result.token_ids == reference_greedy(probe, PROMPT, 2) and out.result.finish_reason == "eos"
    assert out.stats.rounds == 1 and out.stats.hits == 2 == out.result.stats.accepted
