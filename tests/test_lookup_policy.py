"""The `lookup` draft policy: prompt lookup with no draft model. Each round drafts the tokens that
followed the last earlier occurrence of the context's last n tokens, as picked candidates; its rows
need no draft cache. Greedy output is the target's and sampled output has its distribution in sd,
mcsd and SEED (one row per forward and batched), with or without a draft model loaded."""
from __future__ import annotations

import dataclasses
import json

import pytest
from conftest import reference_greedy, tiny_model
from test_cli import fails, run
from test_sampling_lossless import SAMPLES, SETTINGS, assert_policy_samples_follow_the_target
from seed_tot import Engine, SamplingParams
from seed_tot.engine.policies.prompt_lookup import PromptLookupPolicy

# repeats itself, so a lookup on its last tokens finds a match from the first round on
REPEATING = [3, 17, 42, 8, 61, 5, 3, 17, 42, 8]
PROMPTS = [REPEATING, [9, 1, 77], [5, 5, 5, 5, 2]]


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", seed=21)


@pytest.mark.parametrize("with_draft_model", [False, True])
@pytest.mark.parametrize("mode,batch", [("sd", 1), ("mcsd", 1), ("seed", 1), ("seed", 3), ("seed", None)])
def test_greedy_output_equals_the_target_alone(target, mode, batch, with_draft_model):
    params = SamplingParams(max_new_tokens=40, temperature=0)
    engine = Engine(target, tiny_model("llama", seed=5) if with_draft_model else None)
    policy = PromptLookupPolicy(ngram=3, depth=4)
    results = engine.generate(PROMPTS, params, mode=mode, draft_batch=batch, verify_batch=batch, draft_policy=policy)
    for prompt, result in zip(PROMPTS, results):
        assert result.token_ids == reference_greedy(target, prompt, 40)
        # the draft model, when there is one, is never run: no prefill, no forward
        assert result.stats.draft_prefills == 0 and result.stats.draft_forwards == 0
    assert sum(r.stats.accepted for r in results) > 0  # some guesses were right
    assert sum(rec["drafted"] > 0 for rec in policy.records) > 0


def test_rows_of_different_lengths_and_stop_rules_in_one_batch(target):
    """Rows that stop at different times (max_new_tokens, EOS) leave the batch; the others go on exactly."""
    prompts = PROMPTS + [REPEATING[:4]]
    eos = reference_greedy(target, REPEATING, 12)[7]  # the 8th token of row 0 ends it there
    engine = Engine(target)
    engine.eos_ids = frozenset([eos])
    params = SamplingParams(max_new_tokens=30, temperature=0)
    alone = [engine.generate([p], params, mode="sd", draft_policy="lookup")[0].token_ids for p in prompts]
    together = engine.generate(prompts, params, mode="seed", draft_batch=None, verify_batch=None,
                               draft_policy="lookup")
    assert [r.token_ids for r in together] == alone
    assert len(alone[0]) == 8 and max(len(a) for a in alone) == 30


def test_depth_bounds_each_round_and_the_budget_bounds_the_last(target):
    policy = PromptLookupPolicy(ngram=2, depth=2)
    params = SamplingParams(max_new_tokens=9, temperature=0)
    Engine(target).generate([REPEATING], params, mode="sd", draft_policy=policy)
    assert max(rec["drafted"] for rec in policy.records) == 2
    assert sum(rec["tokens"] for rec in policy.records) == 9


@pytest.mark.parametrize("mode,setting,batch", [("sd", "temperature", 1), ("seed", "top_p", None),
                                                ("seed", "top_k", 1)])
def test_sampled_output_follows_the_target_distribution(mode, setting, batch, monkeypatch):
    """The TV fixture's prompt with its own continuation in front of it, so that lookup guesses from
    the first round; the exact distribution is taken after that same context."""
    import test_sampling_lossless as fixture

    # "4 2" occurred before: the guess is "4 1", whose first token the target samples about half the time
    monkeypatch.setattr(fixture, "PROMPT", [1, 4, 2, 4, 1, 4, 2])
    target = tiny_model("llama", seed=21, vocab=fixture.VOCAB)
    policy = PromptLookupPolicy(ngram=2, depth=2)
    assert_policy_samples_follow_the_target(target, None, policy, setting, mode, (1,), batch)
    assert sum(rec["drafted"] > 0 for rec in policy.records) > SAMPLES // 2


def test_a_sample_is_the_same_in_sd_and_in_batched_seed(target):
    """Each sequence owns its generator, and the guess depends only on its own tokens: the same seed gives
    the same sample whatever shares its forwards."""
    params = dataclasses.replace(SETTINGS["temperature"], max_new_tokens=16, seed=7)
    engine = Engine(target)
    sd = engine.generate(PROMPTS, params, mode="sd", draft_policy="lookup")
    seed = engine.generate(PROMPTS, params, mode="seed", draft_batch=None, verify_batch=None, draft_policy="lookup")
    assert [r.token_ids for r in sd] == [r.token_ids for r in seed]


def test_bad_options_and_a_model_policy_without_a_draft_model(target):
    engine = Engine(target)
    params = SamplingParams(max_new_tokens=4, temperature=0)
    with pytest.raises(ValueError, match="option ngram='0' must be >= 1"):
        engine.generate([REPEATING], params, mode="sd", draft_policy="lookup", policy_options={"ngram": "0"})
    with pytest.raises(ValueError, match="option depth='x' is not an int"):
        engine.generate([REPEATING], params, mode="sd", draft_policy="lookup", policy_options={"depth": "x"})
    with pytest.raises(ValueError, match=r"mode 'sd' needs a draft model \(or draft_policy='lookup'"):
        engine.generate([REPEATING], params, mode="sd", draft_policy="fixed")
    assert engine.policy("sd", (1, 1, 1, 1), params, "lookup").depth == 4  # default depth: sd's chain
    with pytest.raises(ValueError, match="ngram=0 must be >= 1"):
        PromptLookupPolicy(ngram=0)


def test_cli_draft_lookup_loads_no_draft_model_and_matches_ar(tiny_model_dirs):
    target, _ = tiny_model_dirs
    outs = {}
    for mode, draft in (("ar", []), ("seed", ["--draft", "lookup"]), ("sd", ["--draft", "lookup"])):
        out = run("generate", "Tom has 3 apples. Tom has 3 apples.", "--target", target, *draft, "--mode", mode,
                  "--max-new-tokens", "12", "--json")
        outs[mode] = json.loads(out.splitlines()[0])["token_ids"]
    assert outs["ar"] == outs["seed"] == outs["sd"]
    assert "needs a draft model" in fails("generate", "Hi", "--target", target, "--draft", "lookup",
                                                   "--mode", "sd", "--draft-policy", "parallelspec")


def test_lookup_guesses_copy_the_context():
    """What a round drafts: the continuation of the longest matching suffix, as picked nodes."""
    from seed_tot.engine.draft_tree import DETERMINISTIC
    from test_prompt_lookup import _Seq

    seq = _Seq(REPEATING)
    rnd = PromptLookupPolicy(ngram=3, depth=3).begin(seq, SamplingParams(max_new_tokens=8, temperature=0), 100)
    assert rnd.first_feed() is None
    tree, entries = rnd.finish()
    assert tree.tokens == [61, 5, 3] and tree.parents == [-1, 0, 1] and entries == {}
    assert all(tree.q_index[i] == DETERMINISTIC for i in range(3))
