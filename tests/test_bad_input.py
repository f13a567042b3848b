"""Bad input to the engine gets a clear error that says what was expected."""
from __future__ import annotations

import pytest
import torch

from conftest import CharTokenizer, tiny_model
from seed_tot import DecodeSpec, Engine, SamplingParams
from seed_tot.engine import engine as engine_module
from seed_tot.engine.engine import check_same_vocabulary


@pytest.fixture(scope="module")
def engine():
    target = tiny_model("llama", seed=0)
    return Engine(target, tiny_model("llama", seed=1), tokenizer=CharTokenizer())


def test_draft_with_a_smaller_vocabulary_is_rejected_naming_both_models():
    with pytest.raises(ValueError, match="draft small-draft has 50 output tokens but target big-target"):
        Engine(tiny_model(vocab=96), tiny_model(vocab=50), target_name="big-target", draft_name="small-draft")


def test_tokenizers_that_differ_name_both_models_and_the_first_differing_id():
    a, b = CharTokenizer(), CharTokenizer()
    b.index = dict(a.index)
    b.index["#"], b.index["$"] = a.index["$"], a.index["#"]
    with pytest.raises(ValueError, match=r"draft d-model and target t-model .* token id 3 is '\$' in the draft"):
        check_same_vocabulary(a, b, "t-model", "d-model")


def test_empty_prompt_list(engine):
    with pytest.raises(ValueError, match="prompts is empty"):
        engine.generate([], SamplingParams())


@pytest.mark.parametrize("prompt", ["", []])
def test_empty_prompt(engine, prompt):
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        engine.generate(["ok", prompt], SamplingParams())


@pytest.mark.parametrize("n", [0, -3])
def test_non_positive_max_new_tokens(n):
    with pytest.raises(ValueError, match="max_new_tokens must be a positive integer"):
        SamplingParams(max_new_tokens=n)


@pytest.mark.parametrize("setting, value, message", [
    ("temperature", float("nan"), "temperature must be a finite number"),
    ("temperature", "0.5", "temperature must be a finite number"),
    ("top_k", 1.5, "top_k must be an integer"),
    ("top_p", "0.9", "top_p must be a number"),
    ("max_new_tokens", True, "max_new_tokens must be a positive integer"),
    ("seed", None, "seed must be an integer"),
    ("seed", 1.5, "seed must be an integer"),
    ("stop", [1], "stop strings must be non-empty strings"),
    ("stop", None, "stop must be a string or a list of strings"),
])
def test_sampling_params_the_sampler_cannot_use_are_refused_when_built(setting, value, message):
    # before: NaN sampled garbage silently; top_k=1.5 and stop=[1] failed inside a forward mid-call
    with pytest.raises(ValueError, match=message):
        SamplingParams(**{setting: value})


@pytest.mark.parametrize("k_config", [(2, 0, 1), (), (0,)])
def test_k_config_with_a_zero(engine, k_config):
    with pytest.raises(ValueError, match="k_config must be a non-empty sequence of positive integers"):
        engine.generate(["hi"], SamplingParams(max_new_tokens=2), mode="mcsd", k_config=k_config)


def test_unknown_mode(engine):
    with pytest.raises(ValueError, match="unknown mode 'beam'; expected one of ar, parallel, sd, mcsd, seed"):
        engine.generate(["hi"], SamplingParams(max_new_tokens=2), mode="beam")


def test_a_single_string_instead_of_a_list(engine):
    with pytest.raises(ValueError, match="list of strings"):
        engine.generate("hi", SamplingParams(max_new_tokens=2))


def test_speculative_mode_without_a_draft():
    with pytest.raises(ValueError, match="mode 'sd' needs a draft model"):
        Engine(tiny_model()).generate([[1, 2]], SamplingParams(max_new_tokens=2), mode="sd")


@pytest.mark.parametrize("prompts, message", [
    ([1, 2, 3], r"prompt 0 is 1: .* a list inside the list: \[\[1, 2, 3\]\]"),  # one flat id list
    (["ok", None], "prompt 1 is None: each prompt must be a string or a list of token ids"),
    ([b"hi"], "prompt 0 is b'hi'"),  # bytes were read as the token ids 104, 105
    ([[1.7, 2]], "prompt 0 holds 1.7: a prompt of token ids must hold integers only"),  # was truncated to 1
    ([["a", "b"]], "prompt 0 holds 'a'"),
])
def test_prompts_that_are_neither_text_nor_token_ids_are_named(engine, prompts, message):
    with pytest.raises(ValueError, match=message):
        engine.generate(prompts, SamplingParams(max_new_tokens=2))


def test_params_and_spec_in_the_wrong_argument_say_what_goes_where(engine):
    with pytest.raises(TypeError, match="params must be a SamplingParams"):
        engine.generate(["hi"], {"max_new_tokens": 2})  # was: 'dict' object has no attribute 'stop'
    with pytest.raises(TypeError, match=r"goes in as spec=DecodeSpec\(\.\.\.\)"):
        engine.generate(["hi"], SamplingParams(max_new_tokens=2), DecodeSpec(mode="sd"))  # was: unknown mode DecodeSpec(...)


@pytest.mark.parametrize("dtype", ["bf16", "int8", torch.int64])
def test_from_pretrained_refuses_a_dtype_that_is_not_a_float_before_loading_anything(monkeypatch, dtype):
    # "bf16" was an AttributeError ("module 'torch' has no attribute 'bf16'") after the tokenizer loaded
    def load_tokenizer(name):
        raise AssertionError("the tokenizer loaded before the dtype was checked")

    monkeypatch.setattr(engine_module, "load_tokenizer", load_tokenizer)
    with pytest.raises(ValueError, match="is not a floating torch dtype; expected float32, bfloat16 or float16"):
        Engine.from_pretrained(dtype=dtype, device="cpu")


def test_token_ids_outside_the_vocabulary(engine):
    with pytest.raises(ValueError, match="prompt 0 has a token id outside"):
        engine.generate([[1, 10_000]], SamplingParams(max_new_tokens=2))
