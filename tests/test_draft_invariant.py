"""Drafter-invariant sampling (SamplingParams.draft_invariant, engine/keyed_draws.py): each sampled
token is the inverse CDF of the target's p at a uniform keyed by (row seed, position), so

- the samples follow the target's distribution (the TV test of test_sampling_lossless),
- a row's tokens for a seed are the same in every mode and with every draft policy, alone or beside
  other rows: token-identical to `ar`, as greedy rows are,
- a draft model's draw at the same uniform is accepted wherever it lands where the target's does
  (a draft equal to the target is always accepted),
- the load-aware policies plan such rows with the greedy ones (nothing they decide changes them).
"""
from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from conftest import noisy_copy, tiny_model
from test_sampling_lossless import PROMPT, SAMPLES, SETTINGS, exact_distribution, parallelspec_pair, tv, tv_bound
from seed_tot import Engine, SamplingParams
from seed_tot.engine.cost_model import Costs
from seed_tot.engine.keyed_draws import keyed_uniform, slot_uniforms
from seed_tot.engine.policies.base import planned_together
from seed_tot.engine.policies.choose import ChoosePolicy
from seed_tot.engine.policies.suffix import SuffixSource

REPEATING = [3, 17, 42, 8, 61, 5, 3, 17, 42, 8]
PROMPTS = [REPEATING, [9, 1, 77], [5, 5, 5, 5, 2], REPEATING[:6]]
NEW = 24


@pytest.fixture(scope="module")
def models():
    target = tiny_model("llama", seed=21)
    return target, noisy_copy(target, 0.05, seed=3)


def _keyed(params: SamplingParams) -> SamplingParams:
    return dataclasses.replace(params, draft_invariant=True)


def test_keyed_uniforms_are_uniform_and_differ_by_seed_and_position():
    draws = [keyed_uniform(seed, pos) for seed in range(200) for pos in range(50)]
    assert all(0.0 <= u < 1.0 for u in draws)
    assert len(set(draws)) == len(draws)
    # ten equal bins of 10,000 draws: a chi-square of 9 degrees of freedom stays far below 40
    counts = Counter(int(u * 10) for u in draws)
    assert sum((c - 1000) ** 2 / 1000 for c in counts.values()) < 40


def test_a_tree_s_slots_take_the_uniform_of_their_depth():
    class Row:
        generated = [5, 6]
        generator = __import__("torch").Generator().manual_seed(9)

    # root's children at depth 1 (nodes 0, 1), node 2 under node 0: slot 0 (after the root) is the
    # token at position 2, slots 1 and 2 (after nodes 0 and 1) position 3, slot 3 (after node 2) 4
    u = slot_uniforms(Row, [-1, -1, 0])
    assert u == [keyed_uniform(9, 2), keyed_uniform(9, 3), keyed_uniform(9, 3), keyed_uniform(9, 4)]


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("mode,k_config", [("ar", (1,)), ("seed", (1, 1)), ("mcsd", (2, 2))])
def test_keyed_samples_follow_the_target_distribution(setting, mode, k_config):
    """SAMPLES rows of one prompt (row i keyed by seed + i); the draft lies outside the bound, so a
    verifier that let the draft's law through would fail."""
    from test_sampling_lossless import VOCAB

    target = tiny_model("llama", seed=21, vocab=VOCAB)
    draft = noisy_copy(target, 0.6, seed=22)
    params = _keyed(SETTINGS[setting])
    exact = exact_distribution(target, params)
    bound = tv_bound(exact, SAMPLES)
    assert tv(Counter({s: p * SAMPLES for s, p in exact_distribution(draft, params).items()}), exact, SAMPLES) > bound
    engine = Engine(target, None if mode == "ar" else draft)
    results = engine.generate([PROMPT] * SAMPLES, params, mode=mode, k_config=k_config, n_workers=8)
    if mode != "ar":
        stats = [r.stats for r in results]
        assert 0.05 < sum(s.accepted for s in stats) / sum(s.draft_depth for s in stats) < 0.95
    assert tv(Counter(tuple(r.token_ids) for r in results), exact, SAMPLES) < bound


def _runs(engine: Engine, params: SamplingParams) -> dict[str, list[list[int]]]:
    """Every mode and draft policy the engine offers, batched and one row at a time."""
    runs = {}
    for mode, kw in [("parallel", {}), ("sd", dict(k_config=(1, 1, 1))), ("mcsd", dict(k_config=(2, 2))),
                     ("seed", dict(k_config=(1, 1, 1), draft_batch=1, verify_batch=1)),
                     ("seed", dict(k_config=(2, 1), draft_batch=None, verify_batch=None)),
                     ("seed", dict(draft_policy="lookup", draft_batch=None, verify_batch=None)),
                     ("seed", dict(draft_policy="suffix", draft_batch=None, verify_batch=None)),
                     ("seed", dict(draft_policy="auto", draft_batch=None, verify_batch=None)),
                     ("sd", dict(draft_policy="opt-tree"))]:
        name = f"{mode} {kw}"
        runs[name] = [r.token_ids for r in engine.generate(PROMPTS, params, mode=mode, **kw)]
    flat = Costs(0.1, 0.0, 0.001)  # every source pays: both grafted
    policy = ChoosePolicy(flat, SuffixSource(depth=4, share="all"), max_len=3, costs_at="calibrated")
    runs["seed choose"] = [r.token_ids for r in engine.generate(PROMPTS, params, mode="seed", draft_policy=policy,
                                                                draft_batch=None, verify_batch=None)]
    return runs


@pytest.mark.parametrize("setting", ["temperature", "top_p"])
def test_a_keyed_sample_is_the_same_in_every_mode_and_policy(models, setting):
    target, draft = models
    params = _keyed(dataclasses.replace(SETTINGS[setting], max_new_tokens=NEW, seed=11, search_key="s"))
    engine = Engine(target, draft)
    reference = [r.token_ids for r in Engine(target).generate(PROMPTS, params, mode="ar")]
    assert len({tuple(t) for t in reference}) == len(PROMPTS)
    accepted = 0
    for name, tokens in _runs(engine, params).items():
        assert tokens == reference, name
    accepted = sum(r.stats.accepted for r in engine.generate(PROMPTS, params, mode="seed", k_config=(1, 1, 1)))
    assert accepted > 0  # drafts were accepted, so identity is not a plain step in disguise


def test_without_keyed_draws_the_modes_write_different_samples(models):
    """The property above is not automatic: the ratio test's draws depend on the drafts."""
    target, draft = models
    params = dataclasses.replace(SETTINGS["temperature"], max_new_tokens=NEW, seed=11)
    reference = [r.token_ids for r in Engine(target).generate(PROMPTS, params, mode="ar")]
    drafted = [r.token_ids for r in Engine(target, draft).generate(PROMPTS, params, mode="seed", k_config=(1, 1, 1))]
    assert drafted != reference


def test_a_keyed_row_writes_the_same_beside_other_rows_and_calls(models):
    target, draft = models
    params = _keyed(dataclasses.replace(SETTINGS["temperature"], max_new_tokens=NEW, seed=4))
    alone = Engine(target, draft).generate(PROMPTS[:1], params, mode="seed")[0].token_ids
    crowd = Engine(target, draft).generate(PROMPTS + [[7, 7, 1]] * 4, params, mode="seed", draft_batch=None,
                                           verify_batch=None)[0].token_ids
    assert crowd == alone


def test_a_draft_equal_to_the_target_is_always_accepted(models):
    """The draft model draws at the target's keyed uniform: with q = p the draws coincide. At
    independent uniforms a draft equal to the target would be accepted about sum p^2 of the time."""
    target, _ = models
    params = _keyed(dataclasses.replace(SETTINGS["temperature"], max_new_tokens=NEW, seed=2))
    results = Engine(target, target).generate(PROMPTS, params, mode="seed", k_config=(1, 1, 1))
    assert sum(r.stats.accepted for r in results) == sum(r.stats.draft_depth for r in results) > 0


def test_a_parallelspec_draft_is_coupled_and_exact():
    """The shipped drafter kind: its first draw per level at the keyed uniform; tokens equal ar's."""
    target, drafter = parallelspec_pair(confident=True)
    params = _keyed(dataclasses.replace(SETTINGS["temperature"], max_new_tokens=12, seed=5))
    prompts = [PROMPT, [2, 2, 5, 1], [7, 1]]
    reference = [r.token_ids for r in Engine(target).generate(prompts, params, mode="ar")]
    results = Engine(target, drafter).generate(prompts, params, mode="seed", draft_policy="parallelspec",
                                               k_config=(1, 1), draft_batch=None, verify_batch=None)
    assert [r.token_ids for r in results] == reference
    assert sum(r.stats.accepted for r in results) > 0


def test_load_aware_policies_plan_keyed_rows_with_the_greedy_ones():
    class Row:
        def __init__(self, params):
            self.rule = type("Rule", (), {"params": params})()

    greedy, sampled = Row(SamplingParams(temperature=0)), Row(SamplingParams(temperature=1.0))
    keyed = Row(SamplingParams(temperature=1.0, draft_invariant=True))
    assert planned_together([greedy, sampled, keyed], "greedy") == [greedy, keyed]
    assert planned_together([greedy, sampled, keyed], "all") == [greedy, sampled, keyed]
    assert planned_together([greedy, sampled, keyed], "off") == []


def test_draft_invariant_must_be_a_flag():
    with pytest.raises(ValueError, match="draft_invariant"):
        SamplingParams(draft_invariant="yes")


# ----------------------------------------------------------------------------- where users reach it


def test_generate_draft_invariant_prints_the_same_sample_in_every_mode(tiny_model_dirs):
    import json

    from test_cli import run

    target, draft = tiny_model_dirs
    outs = []
    for mode in ("ar", "parallel", "seed", "mcsd"):
        tree = ["--k-config", "2,2,1"] if mode in ("seed", "mcsd") else []
        out = run("generate", "Tom has 3 apples.", "--target", target, "--draft", draft, "--mode", mode, *tree,
                  "--temperature", "1.0", "--seed", "3", "--draft-invariant", "--max-new-tokens", "12", "-n", "3", "--json")
        outs.append([json.loads(line)["token_ids"] for line in out.splitlines()])
    assert outs[0] == outs[1] == outs[2] == outs[3]
    assert len({tuple(t) for t in outs[0]}) > 1  # three samples, not one answer three times


def test_the_config_key_is_read_checked_and_reaches_every_call(tmp_path):
    from seed_tot.search import load_settings
    from seed_tot.search.config import ConfigError

    good = tmp_path / "good.yaml"
    good.write_text("temperature: 0.7\ndraft_invariant: true\n")
    settings = load_settings(good)
    assert settings.search.draft_invariant and settings.decoding().draft_invariant
    bad = tmp_path / "bad.yaml"
    bad.write_text("depth: 2\ndraft_invariant: maybe\n")
    with pytest.raises(ConfigError) as err:
        load_settings(bad)
    assert str(bad) in str(err.value) and "draft_invariant" in str(err.value) and "true or false" in str(err.value)


@pytest.mark.parametrize("mode,k_config", [("pipedec", (2, 2)), ("stpp", (2, 2)), ("pp", (1,))])
def test_pipeline_modes_write_the_keyed_sample_of_ar(mode, k_config):
    """PipeDec and its baselines decide their rows alone (verify.decide_row) with the same keyed draws."""
    from seed_tot.engine.pipeline import PipelineConfig, simulate
    from test_sampling_lossless import VOCAB

    target = tiny_model("llama", seed=21, vocab=VOCAB)
    draft = noisy_copy(target, 0.6, seed=22)
    params = _keyed(dataclasses.replace(SETTINGS["top_p"], max_new_tokens=8, seed=3))
    prompts = [PROMPT, [2, 2, 5, 1], [7, 1], PROMPT]
    reference = [r.token_ids for r in Engine(target).generate(prompts, params, mode="ar")]
    outs = simulate(target, draft, prompts, params, PipelineConfig(mode=mode, n_stages=2, k_config=k_config), VOCAB)
    assert [o.result.token_ids for o in outs] == reference
