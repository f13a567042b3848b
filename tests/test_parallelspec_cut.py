"""The parallelspec policy's cut=cost: after its one forward the round keeps the levels that pay for
their verification. The cut follows its formula, varies from round to round, and keeps the round
lossless: greedy output is the target's, sampled output has the target's distribution."""
from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

from conftest import reference_greedy, tiny_model
from test_sampling_lossless import assert_policy_samples_follow_the_target, parallelspec_pair
from seed_tot import Engine, SamplingParams
from seed_tot.engine.drafters import ParallelDrafter, load_drafter, save_drafter
from seed_tot.engine.policies.auto import Costs
from seed_tot.engine.policies.level_cut import joint_cut
from seed_tot.engine.policies.parallelspec import ParallelSpecPolicy, ParallelSpecRound


def costs(points) -> Costs:
    return Costs(1.0, 0.0, 0.0, tuple(points))


def test_the_cut_keeps_the_depth_with_the_most_expected_tokens_per_second():
    # verification costs 1.0 up to 3 tokens, then 0.2 per token; p̂ along the chain 0.9, 0.72, 0.36, 0.07
    rnd = ParallelSpecRound.__new__(ParallelSpecRound)
    rnd.passes_run = 1
    rnd.costs = costs([(1, 1.0), (3, 1.0), (8, 2.0)])
    chain = [[(0, 5, None, p)] for p in (0.9, 0.72, 0.36, 0.07)]
    # E/time: d=1 1.9/1.0, d=2 2.62/1.0, d=3 2.98/1.2, d=4 3.05/1.4 -> 2
    assert rnd._cut(chain) == 2
    rnd.costs = costs([(1, 1.0), (8, 1.0)])  # flat: every level pays
    assert rnd._cut(chain) == 4
    # a noisy calibration (4 tokens timed below 3) is read through its monotone fit: 3 and 4 tokens both
    # cost their mean, 1.5, so neither is free: E/time d=1 1.9/1.0, d=2 2.62/1.5, d=3 2.98/1.5, d=4 3.05/2.0
    rnd.costs = costs([(1, 1.0), (2, 1.0), (3, 2.0), (4, 1.0), (5, 2.0)])
    assert rnd.costs.target(4) == pytest.approx(1.5) and rnd._cut(chain) == 3


def _chain(*p_hats):
    return [[(0, 5, None, p)] for p in p_hats]


def test_a_joint_cut_keeps_every_level_when_verification_is_flat():
    rows = [_chain(0.9, 0.7, 0.4), _chain(0.3, 0.1, 0.02)] * 4
    assert joint_cut(rows, costs([(1, 1.0), (64, 1.0)])) == [3] * 8


def test_a_joint_cut_under_a_growing_cost_keeps_the_surest_rows_deeper():
    # flat up to 8 tokens, then 10% a token: 4 rows verify 8 tokens at their first levels already
    steep = costs([(1, 1.0), (8, 1.0), (64, 6.6)])
    sure, unsure = _chain(0.95, 0.9, 0.85, 0.8), _chain(0.3, 0.05, 0.01, 0.001)
    kept = joint_cut([sure, unsure, sure, unsure], steep)
    assert kept[1] == kept[3] == 1 and kept[0] == kept[2] > 1
    # alone it keeps every level; among 16 sure rows, whose first levels already fill the forward, one
    assert joint_cut([sure], steep) == [4] and joint_cut([sure] * 16, steep) == [1] * 16


def test_a_joint_cut_is_the_solo_cut_for_one_row():
    chain = _chain(0.9, 0.72, 0.36, 0.07)
    rnd = ParallelSpecRound.__new__(ParallelSpecRound)
    rnd.passes_run = 1
    for points in ([(1, 1.0), (3, 1.0), (8, 2.0)], [(1, 1.0), (8, 1.0)]):
        rnd.costs = costs(points)
        assert joint_cut([chain], rnd.costs) == [rnd._cut(chain)]


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", seed=3)


@pytest.fixture(scope="module")
def drafter(target):
    """Untrained, but confident like a trained drafter (its final norm scaled 3x): p̂ spans 0..1."""
    torch.manual_seed(0)
    drafter = ParallelDrafter(target, n_masks=3, n_layers=1).eval()
    with torch.no_grad():
        drafter.model.norm.weight.mul_(3.0)
    return drafter


# verifying up to 3 tokens costs the same, each one more 2% more: a level whose p̂ is small gets cut
STEEP = costs([(1, 1.0), (3, 1.0), (16, 1.26)])


@pytest.mark.parametrize("mode,k_config,batch", [("sd", (1,), 1), ("seed", (1,), 1), ("seed", (2, 2), None)])
def test_greedy_output_equals_the_target_alone_with_the_cut(target, drafter, mode, k_config, batch):
    prompts = [[3, 17, 42, 8, 61, 5], [9, 1, 77], [5, 61, 8, 42, 17, 3]]
    params = SamplingParams(max_new_tokens=24, temperature=0)
    policy = ParallelSpecPolicy(drafter, k_config, depth=4, costs=STEEP)
    results = Engine(target, drafter).generate(prompts, params, mode=mode, k_config=k_config, draft_batch=batch,
                                               verify_batch=batch, draft_policy=policy)
    for prompt, result in zip(prompts, results):
        assert result.token_ids == reference_greedy(target, prompt, 24)
    depths = Counter(r["depth"] for r in policy.records if r["drafted"])
    assert {2, 3, 4} <= set(depths), depths  # the cut varies with the round's p̂: not a fixed depth


@pytest.mark.parametrize("mode,k_config,setting,batch,load,rows", [("sd", (1,), "temperature", 1, "greedy", 1),
                                                                   ("sd", (1,), "temperature", 1, "greedy", 4),
                                                                   ("seed", (2, 2), "top_p", None, "greedy", 4),
                                                                   ("seed", (1,), "temperature", None, "all", 8)])
def test_sampled_output_follows_the_target_distribution_with_the_cut(mode, k_config, setting, batch, load, rows):
    """load=greedy: a sampled row is cut alone, priced as `rows` rows like it (sampled_rows); load=all:
    sampled rows of a batched round are cut jointly, by every row's draws."""
    target, drafter = parallelspec_pair(confident=True)
    # depth 2 costs 5% more (chain) or 40% more (tree), at `rows` rows: kept only when its p̂ pays for that
    points = [(rows * n, t) for n, t in ((1, 1.0), (2, 1.0), (3, 1.05), (7, 1.5))]
    policy = ParallelSpecPolicy(drafter, k_config, depth=2, costs=costs(points), load=load, sampled_rows=rows)
    assert_policy_samples_follow_the_target(target, drafter, policy, setting, mode, k_config, batch)
    depths = Counter(r["depth"] for r in policy.records if r["drafted"])
    assert depths[1] > 100 and depths[2] > 100, depths  # the cut depends on the sampled tokens' q: both happen


def test_sampled_rows_cut_alone_by_default_so_batched_seed_samples_what_sd_samples(target, drafter):
    """load=greedy (the default) cuts only greedy rows jointly: a sampled row's tree depends on its own
    draws, so batched SEED reproduces sd's samples for the same seed."""
    params = SamplingParams(max_new_tokens=16, temperature=0.9, seed=5)
    prompts = [[3, 17, 42, 8], [9, 1, 77]] * 3
    engine = Engine(target, drafter)
    policies = [ParallelSpecPolicy(drafter, (1,), depth=4, costs=STEEP, sampled_rows=2) for _ in range(2)]
    runs = [engine.generate(prompts, params, mode=mode, draft_batch=batch, verify_batch=batch, draft_policy=policy)
            for (mode, batch), policy in zip((("sd", 1), ("seed", None)), policies)]
    assert [r.token_ids for r in runs[0]] == [r.token_ids for r in runs[1]]
    # priced at its constant load of 2 rows, a row's cut still varies with its own draws
    depths = [sorted(r["depth"] for r in policy.records if r["drafted"]) for policy in policies]
    assert depths[0] == depths[1] and len(set(depths[0])) > 1, depths


def test_a_sampled_row_cut_alone_is_priced_at_its_constant_load():
    """Priced alone on a forward that is flat up to 8 tokens, every level looks free; priced as 4
    rows like it (sampled_rows=4), only the first level pays for the tokens it adds."""
    rnd = ParallelSpecRound.__new__(ParallelSpecRound)
    rnd.passes_run, rnd.costs = 1, costs([(1, 1.0), (8, 1.0), (64, 6.6)])
    chain = _chain(0.6, 0.3, 0.1, 0.02)
    assert rnd._cut(chain, 1) == 4
    # 4 rows: 8 tokens at depth 1 (1.0 s, 6.4 expected), 12 at depth 2 (1.4 s, 7.6): depth 1
    assert rnd._cut(chain, 4) == 1
    with pytest.raises(ValueError, match="sampled_rows=0 must be >= 1"):
        ParallelSpecPolicy(ParallelDrafter(tiny_model("llama", seed=3), n_masks=2), (1,), sampled_rows=0)


def test_cut_option_and_drafter_json_default(tmp_path, monkeypatch, target, drafter):
    monkeypatch.setenv("SEED_TOT_CACHE_DIR", str(tmp_path / "cache"))
    engine = Engine(target, drafter)
    params = SamplingParams(max_new_tokens=4, temperature=0)
    with pytest.raises(ValueError, match="cut='often' must be one of none, cost"):
        engine.generate([[1, 2, 3]], params, mode="sd", draft_policy="parallelspec", policy_options={"cut": "often"})
    with pytest.raises(ValueError, match="load='some' must be one of greedy, all, off"):
        engine.generate([[1, 2, 3]], params, mode="sd", draft_policy="parallelspec", policy_options={"load": "some"})
    assert engine.policy("sd", (1,), params, "parallelspec", {"cut": "none"}).costs is None
    assert engine.policy("sd", (1,), params, "parallelspec", {"sampled_rows": "8"}).sampled_rows == 8  # as the CLI gives it
    calibrated = engine.policy("sd", (1,), params, "parallelspec", {"cut": "cost"}).costs
    assert calibrated is not None and calibrated.target(1) > 0  # measured on this machine, cached
    assert (tmp_path / "cache" / "calibration.json").is_file()

    save_drafter(drafter, tmp_path / "d", target, "tiny-target")
    config = json.loads((tmp_path / "d" / "drafter.json").read_text())
    (tmp_path / "d" / "drafter.json").write_text(json.dumps({**config, "cut": "cost"}))
    loaded = load_drafter(tmp_path / "d", target, "tiny-target")
    assert loaded.default_cut == "cost"
    assert Engine(target, loaded).policy("sd", (1,), params).costs is not None  # the drafter's default
    (tmp_path / "d" / "drafter.json").write_text(json.dumps({**config, "cut": "sometimes"}))
    with pytest.raises(ValueError, match=r"drafter.json: cut='sometimes' must be 'none' or 'cost'"):
        load_drafter(tmp_path / "d", target, "tiny-target")


def test_a_sampled_level_is_never_kept_or_cut_by_its_own_draw():
    """Level 2's q = (.6, .4), the target's p = (.5, .5), and verifying level 2 pays only if its p̂
    beats 0.5. Judged by its own draw (p̂ = q(x)) the level would be kept just when it drew the first
    token, and the verifier would emit that token 70% of the time; judged by its expected q (0.52),
    the emitted token follows p."""
    from seed_tot.engine.kv_cache import KVCache
    from seed_tot.engine.policies.base import TreeBuilder
    from seed_tot.engine.sequence import Sequence, StopRule
    from seed_tot.engine.verify import decide_alone

    params = SamplingParams(max_new_tokens=8, temperature=1.0)
    rule = StopRule(params, frozenset(), None)
    neg = float("-inf")
    logits = torch.tensor([[30.0, 0.0, neg, neg],  # q_1: token 0 (all but certainly)
                           [torch.tensor(0.6).log().item(), torch.tensor(0.4).log().item(), neg, neg]])
    pay = costs([(1, 1.0), (2, 1.0), (3, 1.25), (8, 3.0)])  # keep level 2 iff (2 + p̂) / 1.25 > 2
    p = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0], [0.25] * 4])
    emitted, trials = Counter(), 4000
    for trial in range(trials):
        seq = Sequence(0, [1, 2], rule, torch.Generator().manual_seed(trial), draft=KVCache())
        rnd = ParallelSpecRound(TreeBuilder(seq, params, 4), (1, 1), [3], pay)
        assert rnd.step(logits, None) is None  # one pass: every level drawn at once
        tree, _ = rnd.finish()
        acceptance = decide_alone(tree, p[: len(tree) + 1], False, seq.generator)
        emitted[acceptance.tokens[1]] += 1
    assert abs(emitted[0] / trials - 0.5) < 0.04, emitted


def test_a_row_planned_for_a_round_that_never_began_leaves_no_cut_for_a_later_row(drafter):
    """A round that failed between `plan_batch` and a row's `begin`, or a row a wrapping policy drafted
    without the model, must not leave that row's joint cut under its id, which a later sequence (or
    the same row, planned alone) may read: the next plan replaces every pending entry."""
    policy = ParallelSpecPolicy(drafter, (1,), depth=3, costs=STEEP)

    class Row:
        rule = type("Rule", (), {"params": SamplingParams(max_new_tokens=4, temperature=0)})()

    stranded, later = [Row(), Row()], [Row(), Row()]
    policy.plan_batch(stranded, 2)
    assert {id(r) for r in stranded} == set(policy._joint)
    policy.plan_batch(later, 2)
    assert set(policy._joint) == {id(r) for r in later}
    first_cut = policy._joint[id(later[0])]
    assert policy._joint[id(later[1])] is first_cut  # the rows of one round share one cut
    # a row left without the model's round (choose drafted it from text) and then planned alone: a plan
    # of one row cuts alone, and must not hand that row the cut its earlier round made without it
    policy.plan_batch([later[0]], 1)
    assert policy._joint == {}
