"""`auto` drafts nothing when the draft never agrees, long chains when it always does (stubbed costs)."""
from __future__ import annotations

import json
from dataclasses import asdict
from types import SimpleNamespace

import pytest
import torch

from conftest import noisy_copy, reference_greedy, tiny_model
from seed_tot import Engine, SamplingParams
from seed_tot.engine.cost_model import TIMING, cache_key, calibrate, monotone_fit
from seed_tot.engine.draft_tree import DraftTree
from seed_tot.engine.policies.auto import (CALIBRATION_TOKENS, DRAFT_CALIBRATION_TOKENS, AutoPolicy, Costs, best_length, derive_opt_tree_options,
                                          load_costs)
from seed_tot.engine.verify import Acceptance
from test_specdec import ConstantHead

COSTS = Costs(target_fixed_s=0.1, target_per_token_s=0.002, draft_step_s=0.02)  # draft step = 1/5 target


def _round_with(policy, seq, accepted_fraction: float, rounds: int) -> list[int]:
    """Feed the policy `rounds` verifications in which each drafted token is accepted while
    the running fraction allows; returns the chosen lengths."""
    lengths = []
    for _ in range(rounds):
        k = policy.choose(seq)
        lengths.append(k)
        if k:
            n_acc = round(k * accepted_fraction)
            tree = DraftTree(list(range(-1, k - 1)), [0] * k, torch.empty(0, 4), q_index=[-1] * k)
            policy.observe(seq, tree, Acceptance(list(range(n_acc)), [0] * (n_acc + 1), n_acc < k))
    return lengths


def test_best_length_is_zero_without_acceptance_and_long_with_full_acceptance():
    assert best_length(0.0, COSTS, 8) == 0
    assert best_length(0.02, COSTS, 8) == 0
    assert best_length(1.0, COSTS, 8) == 8
    assert 0 < best_length(0.7, COSTS, 8) < 8


def test_auto_stops_drafting_when_acceptance_is_near_zero():
    policy = AutoPolicy(COSTS, max_len=8, probe_every=4)
    seq = SimpleNamespace(done=False, index=0)
    lengths = _round_with(policy, seq, 0.0, 200)
    assert lengths[0] > 0  # the prior says "try"
    assert sum(1 for k in lengths[20:] if k) <= 8  # then only rare probes (the gap doubles to 64)
    assert max(lengths[20:]) == 1


def test_auto_drafts_long_chains_when_acceptance_is_near_one():
    policy = AutoPolicy(COSTS, max_len=8)
    seq = SimpleNamespace(done=False, index=0)
    lengths = _round_with(policy, seq, 1.0, 30)
    assert lengths[-10:] == [8] * 10


def test_auto_recovers_when_the_draft_starts_to_agree():
    policy = AutoPolicy(COSTS, max_len=8, probe_every=2)
    seq = SimpleNamespace(done=False, index=0)
    _round_with(policy, seq, 0.0, 60)
    assert _round_with(policy, seq, 1.0, 200)[-5:] == [8] * 5


def test_derived_opt_tree_options_follow_the_costs():
    cheap_width = derive_opt_tree_options(Costs(0.1, 0.0001, 0.01))
    dear_width = derive_opt_tree_options(Costs(0.1, 0.05, 0.05))
    assert cheap_width["n"] > dear_width["n"]
    assert dear_width["delta"] == pytest.approx(0.05 / 0.15)


def test_calibration_is_measured_once_and_cached(tmp_path, monkeypatch, llama_pair):
    monkeypatch.setenv("SEED_TOT_CACHE_DIR", str(tmp_path))
    engine = Engine(*llama_pair)
    first = load_costs(engine)
    cached = json.loads((tmp_path / "calibration.json").read_text())
    entry = next(iter(cached.values()))
    assert len(cached) == 1 and entry["draft_step_s"] > 0 and entry["target_fixed_s"] > 0
    assert [n for n, _ in entry["target_points"]] == list(CALIBRATION_TOKENS)
    assert [n for n, _ in entry["draft_points"]] == list(DRAFT_CALIBRATION_TOKENS)  # batched draft steps
    assert all(t > 0 for _, t in entry["target_points"])
    assert load_costs(engine) == first  # read back, not measured again


def test_a_cached_straight_line_from_an_older_version_is_measured_again(tmp_path, monkeypatch, llama_pair):
    monkeypatch.setenv("SEED_TOT_CACHE_DIR", str(tmp_path))
    engine = Engine(*llama_pair)
    key = cache_key(engine)  # the entry sits under this engine's real key: only its old format makes it stale
    (tmp_path / "calibration.json").write_text(json.dumps({key: {"target_fixed_s": 9.0, "target_per_token_s": 9.0,
                                                                 "draft_step_s": 9.0}}))
    costs = load_costs(engine)
    assert costs.target_points and costs.draft_step_s != 9.0
    # single-row sizes up to 16 and no batched draft steps (before load-aware planning): measured again too
    (tmp_path / "calibration.json").write_text(json.dumps({key: {
        "target_fixed_s": 9.0, "target_per_token_s": 9.0, "draft_step_s": 9.0, "target_points": [[1, 9.0], [16, 9.0]]}}))
    costs = load_costs(engine)
    assert costs.draft_points and costs.target_points[-1][0] == CALIBRATION_TOKENS[-1]
    # batched draft steps up to 32 and no prompt-sized draft forward (before auto priced the draft's prefill)
    points = [[n, 9.0] for n in CALIBRATION_TOKENS]
    (tmp_path / "calibration.json").write_text(json.dumps({key: {
        "target_fixed_s": 9.0, "target_per_token_s": 9.0, "draft_step_s": 9.0, "target_points": points,
        "draft_points": [[n, 9.0] for n in DRAFT_CALIBRATION_TOKENS if n <= 32]}}))
    costs = load_costs(engine)
    assert costs.draft_points[-1][0] == DRAFT_CALIBRATION_TOKENS[-1] and costs.draft_step_s != 9.0
    # every size, but timed size by size (before the busy-stretch fix): measured again too
    (tmp_path / "calibration.json").write_text(json.dumps({key: {
        "target_fixed_s": 9.0, "target_per_token_s": 9.0, "draft_step_s": 9.0, "target_points": points,
        "draft_points": [[n, 9.0] for n in DRAFT_CALIBRATION_TOKENS]}}))
    assert load_costs(engine).draft_step_s != 9.0
    assert json.loads((tmp_path / "calibration.json").read_text())[key]["timing"] == TIMING


# a CPU-like target: flat up to 3 tokens, then 45 ms per token (issue 10's cost table, rounded)
CPU_POINTS = ((1, 0.232), (2, 0.238), (3, 0.245), (4, 0.290), (6, 0.380), (8, 0.470), (12, 0.650), (16, 0.830))


def test_piecewise_costs_interpolate_between_measured_sizes_and_extrapolate_the_last_slope():
    costs = Costs(0.1, 0.04, 0.1, CPU_POINTS)
    assert costs.target(2) == pytest.approx(0.238)
    assert costs.target(5) == pytest.approx((0.290 + 0.380) / 2)
    assert costs.target(20) == pytest.approx(0.830 + 4 * 0.045)
    assert costs.extra_token(2) == pytest.approx(0.007)


def test_piecewise_costs_draft_two_tokens_where_a_straight_line_through_1_and_16_says_one():
    # a high-acceptance pair with a dear draft step (acceptance 0.84, a draft step 0.11 s, as measured for the
    # Qwen pair): a straight line overprices the second verified token there, the measured points do not
    line = Costs(0.232 - 0.04, 0.04, 0.11)  # through (1, 0.232) and (16, 0.832)
    piecewise = Costs(0.232 - 0.04, 0.04, 0.11, CPU_POINTS)
    assert best_length(0.84, line, 8) == 1
    assert best_length(0.84, piecewise, 8) >= 2


def test_corrupt_calibration_cache_is_a_clear_error(tmp_path, monkeypatch, llama_pair):
    monkeypatch.setenv("SEED_TOT_CACHE_DIR", str(tmp_path))
    (tmp_path / "calibration.json").write_text("{not json")
    with pytest.raises(ValueError, match="calibration.json: unreadable calibration cache"):
        load_costs(Engine(*llama_pair))


@pytest.mark.parametrize("mode", ["sd", "seed"])
def test_greedy_auto_equals_target_alone_with_good_and_useless_drafts(mode):
    target = tiny_model("llama", seed=3)
    prompts = [[5], [1, 2, 3, 4, 5, 6, 7]]
    refs = [reference_greedy(target, p, 24) for p in prompts]
    for draft in (noisy_copy(target, 0.005), tiny_model("llama", seed=4)):
        policy = AutoPolicy(COSTS, max_len=6, probe_every=2)
        results = Engine(target, draft).generate(prompts, SamplingParams(max_new_tokens=24, temperature=0), mode=mode,
                                                 draft_policy=policy)
        assert [r.token_ids for r in results] == refs


def _head_chain_length(a: float, prior: float = 0.9, costs: Costs = COSTS, max_len: int = 8) -> int:
    """Tokens `auto` drafts in one round when its head says P̂ = a for every token."""
    kv = SimpleNamespace(parents=[], committed=3)
    seq = SimpleNamespace(draft=kv, generated=[], generator=torch.Generator().manual_seed(0), pending=lambda c: [1],
                          done=False, index=0)
    policy = AutoPolicy(costs, max_len=max_len, prior=prior, head=ConstantHead(a), capture=SimpleNamespace())
    rnd = policy.begin(seq, SamplingParams(temperature=0), 8)
    feed = rnd.first_feed()
    while feed is not None:
        kv.parents += feed.parents
        feed = rnd.step(torch.randn(len(feed.tokens), 8), torch.zeros(len(feed.tokens), 4))
    return len(rnd.finish()[0])


def test_with_a_head_auto_drafts_longer_the_surer_the_head_is():
    lengths = [_head_chain_length(a) for a in (0.05, 0.5, 0.8, 0.95, 0.999)]
    assert lengths == sorted(lengths) and lengths[0] == 2 and lengths[-1] == 8  # the prior 0.9 asks for Y1's verdict


def test_with_a_head_auto_stops_where_one_more_token_no_longer_pays():
    # brute force over chain lengths with the same model: E(n) = 1 + a + ... + a^n, time(n) as in auto;
    # the prior equals the head's a, so the first token's decision uses the same a
    for a in (0.3, 0.6, 0.85, 0.97):
        rate = [sum(a ** j for j in range(n + 1)) / (n * COSTS.draft_step_s + COSTS.target(n + 1))
                for n in range(1, 9)]
        first_drop = next((n for n in range(1, 8) if rate[n] <= rate[n - 1]), 8)
        assert _head_chain_length(a, prior=a) == first_drop


def test_greedy_auto_with_a_head_equals_target_alone():
    from seed_tot.engine.policies.base import HiddenCapture

    target = tiny_model("llama", seed=3)
    draft = noisy_copy(target, 0.005)
    prompts = [[5], [1, 2, 3, 4, 5, 6, 7]]
    refs = [reference_greedy(target, p, 24) for p in prompts]
    for mode in ("sd", "seed"):
        engine = Engine(target, draft)
        policy = AutoPolicy(COSTS, max_len=6, prior=0.9, head=ConstantHead(0.9),
                            capture=engine.draft_runtime.capture(HiddenCapture))
        results = engine.generate(prompts, SamplingParams(max_new_tokens=24, temperature=0), mode=mode,
                                  draft_policy=policy)
        assert [r.token_ids for r in results] == refs, mode
        assert max(r["drafted"] for r in policy.records) > 1  # the head's rule, not one-token probes


def test_costs_read_a_noisy_calibration_through_its_monotone_fit():
    # measured: 3 tokens slower than 4 (noise); a forward of more tokens never costs less
    costs = Costs(0.1, 0.0, 0.01, ((1, 0.1), (2, 0.2), (3, 0.4), (4, 0.2), (8, 0.5)), ((1, 0.01), (2, 0.03), (4, 0.01)))
    assert costs.target_points == ((1, 0.1), (2, 0.2), (3, pytest.approx(0.3)), (4, pytest.approx(0.3)), (8, 0.5))
    assert costs.draft_points == ((1, 0.01), (2, pytest.approx(0.02)), (4, pytest.approx(0.02)))
    assert monotone_fit(CPU_POINTS) == CPU_POINTS  # a monotone calibration is read as measured
    assert Costs(**asdict(costs)) == costs  # what the cache holds reads back the same


def test_calibration_survives_a_busy_stretch_of_the_machine(monkeypatch, llama_pair):
    """Four forwards in a row slowed by other work (a stretch as long as one size's repeats): timed size
    by size, the best of that size's repeats kept the slowdown; timed round by round, it is dropped."""
    from seed_tot.engine import cost_model
    from seed_tot.engine.kv_cache import KVCache

    engine = Engine(*llama_pair)
    clock = {"now": 0.0, "calls": 0}
    real_forward = KVCache.forward

    def forward(self, runtime, tokens, parents, *args, **kwargs):
        clock["calls"] += 1
        clock["now"] += 0.001 * len(tokens) + (5.0 if 22 <= clock["calls"] < 26 else 0.0)
        return real_forward(self, runtime, tokens, parents, *args, **kwargs)

    monkeypatch.setattr(KVCache, "forward", forward)
    monkeypatch.setattr(cost_model.time, "perf_counter", lambda: clock["now"])
    costs = calibrate(engine)
    assert clock["calls"] > 26  # the stretch fell inside the timed forwards
    assert all(seconds < 1.0 for _, seconds in costs.target_points + costs.draft_points)
