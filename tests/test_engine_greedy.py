"""Greedy output of every mode is token-identical to the target alone (transformers' generate)."""
from __future__ import annotations

import pytest

from conftest import CharTokenizer, noisy_copy, reference_greedy, tiny_model
from seed_tot import Engine, SamplingParams

K_CONFIGS = [(1,), (1, 1, 1), (2, 2, 1), (4, 2, 1, 1)]
PROMPTS = [[5], [1, 2, 3, 4, 5, 6, 7], [9, 8, 7], [1, 2, 3, 4, 5, 6, 7]]  # a 1-token prompt and a repeat
MAX_NEW = 24


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def models(request):
    target = tiny_model(request.param, seed=3)
    close = noisy_copy(target, 0.005)  # agrees often: long accepted runs and bonus tokens
    unrelated = tiny_model(request.param, seed=4)  # agrees rarely: rejections everywhere
    refs = [reference_greedy(target, p, MAX_NEW) for p in PROMPTS]
    return target, close, unrelated, refs


# ar and parallel never run the draft: once each, not once per draft
@pytest.mark.parametrize("draft_kind,mode,k_config", [("close", "ar", (1,)), ("close", "parallel", (1,))]
                         + [(d, m, k) for d in ("close", "unrelated") for m in ("sd", "mcsd") for k in K_CONFIGS])
def test_greedy_tokens_equal_target_generate(models, mode, k_config, draft_kind):
    target, close, unrelated, refs = models
    engine = Engine(target, close if draft_kind == "close" else unrelated)
    results = engine.generate(PROMPTS, SamplingParams(max_new_tokens=MAX_NEW, temperature=0), mode=mode, k_config=k_config)
    assert [r.token_ids for r in results] == refs
    assert all(r.finish_reason == "length" for r in results)


def test_close_draft_exercises_long_accepted_runs_and_bonus_tokens(models):
    target, close, _, refs = models
    results = Engine(target, close).generate(PROMPTS, SamplingParams(max_new_tokens=MAX_NEW, temperature=0),
                                             mode="sd", k_config=(1, 1, 1))
    stats = results[1].stats
    assert stats.tokens_per_target_forward > 2.0  # some rounds accepted every draft plus the bonus
    assert [r.token_ids for r in results] == refs


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("mode,k_config", [("ar", (1,)), ("parallel", (1,)), ("sd", (1, 1, 1)), ("mcsd", (2, 2, 1))])
def test_greedy_stops_at_eos_like_target_generate(seed, mode, k_config):
    target = tiny_model("llama", seed=10 + seed)
    prompts = [[3, 1, 4], [1, 5, 9, 2]]
    free_run = reference_greedy(target, prompts[0], 30)
    eos = free_run[4]  # a token the target emits at step 5 of prompt 0: EOS must cut there
    target.generation_config.eos_token_id = eos
    refs = [reference_greedy(target, p, 30) for p in prompts]
    assert refs[0][-1] == eos and len(refs[0]) <= 5
    engine = Engine(target, noisy_copy(target, 0.005, seed=seed))
    results = engine.generate(prompts, SamplingParams(max_new_tokens=30, temperature=0), mode=mode, k_config=k_config)
    assert [r.token_ids for r in results] == refs
    assert results[0].finish_reason == "eos"


@pytest.mark.parametrize("mode,k_config", [("ar", (1,)), ("parallel", (1,)), ("sd", (1, 1, 1, 1)), ("mcsd", (4, 2, 1, 1))])
def test_stop_string_cuts_tokens_and_text_the_same_in_every_mode(mode, k_config):
    target = tiny_model("llama", seed=5)
    tok = CharTokenizer()
    prompt = "The cat"
    free_run = reference_greedy(target, tok(prompt)["input_ids"], 40)
    text = tok.decode(free_run)
    stop = text[10:12]  # a two-character stop string that the free run contains
    first = text.find(stop)
    expected_tokens = free_run[: first + len(stop)]  # up to the token that completes the stop string
    engine = Engine(target, noisy_copy(target, 0.005), tokenizer=tok)
    params = SamplingParams(max_new_tokens=40, temperature=0, stop=(stop, "\u2603never"))
    result = engine.generate([prompt, prompt], params, mode=mode, k_config=k_config)[0]
    assert result.token_ids == expected_tokens
    assert result.text == text[:first]
    assert result.finish_reason == "stop"
