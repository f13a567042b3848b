"""Every forward the engine runs passes its KV cache under the name the module declares: on a
transformers that renamed `past_key_values` to `cache` (5.x) nothing passes or reads the deprecated
name (which warns on every forward and goes in 5.40); on one that did not, the old name is used."""
from __future__ import annotations

import warnings

import pytest
import torch
from conftest import reference_greedy, tiny_model
from test_sampling_lossless import parallelspec_pair
from transformers import DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast

from seed_tot import Engine, SamplingParams
from seed_tot.engine.cache_argument import cache_kwargs, either_cache, output_field, returned_cache
from seed_tot.engine.pipeline import PipelineConfig, simulate
from seed_tot.synthetic import build_synthetic_engine

PROMPTS = [[5, 1, 3, 2, 7, 3], [3, 1, 4, 0, 6, 5, 3, 1, 4]]  # within every test model's vocabulary
PARAMS = SamplingParams(max_new_tokens=12, temperature=0)


def _deprecation_messages(caught, records) -> list[str]:
    """Python warnings and transformers log records that name the deprecated cache argument."""
    found = [str(w.message) for w in caught if "past_key_values" in str(w.message)]
    return found + [r.getMessage() for r in records if "past_key_values" in r.getMessage()]


@pytest.fixture
def deprecations(caplog):
    """Collects every mention of the deprecated name while the test runs (warnings always shown)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with caplog.at_level("WARNING", logger="transformers"):
            yield lambda: _deprecation_messages(caught, caplog.records)


def test_a_stock_model_takes_the_cache_under_the_chosen_name_without_a_deprecation(deprecations):
    model = tiny_model("llama")
    cache = DynamicCache()
    with torch.no_grad():
        out = model(torch.tensor([[1, 2, 3]]), use_cache=True, **cache_kwargs(model, cache))
    assert cache.get_seq_length() == 3  # the model really wrote into the cache it was handed
    assert returned_cache(out) is cache
    assert output_field(CausalLMOutputWithPast) in CausalLMOutputWithPast.__dataclass_fields__
    assert deprecations() == []


def test_our_modules_take_either_name_but_not_both():
    assert either_cache("C", None) == "C" and either_cache(None, "P") == "P" and either_cache(None, None) is None
    with pytest.raises(ValueError, match="not both"):
        either_cache("C", "P")


@pytest.mark.parametrize("mode,batch", [("ar", 1), ("sd", 1), ("mcsd", 1), ("seed", 1), ("seed", None),
                                        ("parallel", None)])
def test_no_mode_passes_the_deprecated_name(deprecations, mode, batch):
    target = tiny_model("llama", seed=21)
    engine = Engine(target, tiny_model("llama", seed=5))
    k_config = (2, 1) if mode in ("mcsd", "seed") else (1, 1, 1)
    results = engine.generate(PROMPTS, PARAMS, mode=mode, k_config=k_config, verify_batch=batch, draft_batch=batch)
    for prompt, result in zip(PROMPTS, results):
        assert result.token_ids == reference_greedy(target, prompt, 12)
    assert deprecations() == []


def test_the_parallelspec_drafter_and_the_synthetic_oracle_pass_no_deprecated_name(deprecations):
    target, drafter = parallelspec_pair()
    engine = Engine(target, drafter)
    results = engine.generate(PROMPTS, PARAMS, mode="seed", draft_policy="parallelspec", verify_batch=None,
                              draft_batch=None)
    for prompt, result in zip(PROMPTS, results):
        assert result.token_ids == reference_greedy(target, prompt, 12)
    synthetic = build_synthetic_engine("tiny", alpha=0.6, device="cpu")
    assert synthetic.generate(PROMPTS, PARAMS, mode="sd")[0].token_ids == \
        synthetic.generate(PROMPTS, PARAMS, mode="ar")[0].token_ids
    assert deprecations() == []


def test_pipeline_stages_pass_no_deprecated_name(deprecations):
    model = tiny_model("llama", layers=3)
    out = simulate(model, None, [PROMPTS[0]], PARAMS, PipelineConfig(mode="pp", n_stages=3), 96)[0]
    assert out.result.token_ids == reference_greedy(model, PROMPTS[0], 12)
    assert deprecations() == []
