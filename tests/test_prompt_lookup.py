"""parallelspec lookup=N: a prompt-lookup guess (what followed the context's last N tokens the last
time they occurred) grafted beside the drafter's tree as picked nodes. The verifier tries picked
children first and runs sampled siblings against the residual, which is exact; greedy output is the
target's and sampled output has its distribution, chain and tree, sd and batched seed."""
from __future__ import annotations

import json

import pytest
import torch

from conftest import reference_greedy
from test_parallelspec import PROMPT, drafter, target  # noqa: F401 (fixtures)
from test_parallelspec_cut import STEEP
from test_sampling_lossless import (SAMPLES, VERIFIER_TRIALS, assert_policy_samples_follow_the_target,
                                    parallelspec_pair, tv_bound)
from seed_tot import Engine, SamplingParams
from seed_tot.engine.draft_tree import DETERMINISTIC, DraftTree
from seed_tot.engine.drafters import load_drafter, save_drafter
from seed_tot.engine.policies.base import TreeBuilder
from seed_tot.engine.policies.parallelspec import ParallelSpecPolicy
from seed_tot.engine.policies.prompt_lookup import graft_chain, lookup_continuation, picked_first
from seed_tot.engine.verify import accept_tokens

P = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05, 0.0])
Q = torch.tensor([0.1, 0.4, 0.0, 0.2, 0.2, 0.1])
# repeats itself, so a lookup on its last tokens finds a match from the first round on
REPEATING = [3, 17, 42, 8, 61, 5, 3, 17, 42, 8]


def test_lookup_copies_what_followed_the_most_recent_match_of_the_longest_suffix():
    tokens = [3, 2, 7, 2, 9, 3, 2]
    assert lookup_continuation(tokens, 2, 1) == [7]  # "3 2" occurred at 0
    assert lookup_continuation(tokens, 1, 1) == [9]  # "2": its most recent earlier occurrence is at 3
    assert lookup_continuation(tokens, 2, 4) == [7, 2, 9, 3]
    assert lookup_continuation(tokens, 3, 2) == [7, 2]  # no "9 3 2" before: falls back to n = 2
    assert lookup_continuation([1, 2, 3], 3, 4) == []  # the last token never occurred before
    assert lookup_continuation(tokens, 2, 0) == []


class _Seq:
    def __init__(self, tokens):
        self.tokens, self.generated = tokens, []
        self.draft = type("Cache", (), {"parents": []})()


def _builder() -> TreeBuilder:
    return TreeBuilder(_Seq([1, 2]), SamplingParams(max_new_tokens=8, temperature=0), 100)


def test_the_graft_shares_picked_nodes_on_its_path_and_branches_where_it_differs():
    b = _builder()
    a = b.add(-1, 10, None)
    c = b.add(a, 11, None)
    b.add(c, 12, None)
    new = graft_chain(b, [10, 11, 30, 31], shared=[0, 1, 2])
    assert new == [3, 4] and b.parents[3] == c and b.parents[4] == 3 and b.tokens[3:] == [30, 31]
    assert graft_chain(b, [10, 11, 12], shared=[0, 1, 2]) == []  # already drafted: nothing to add


def test_the_graft_never_shares_a_sampled_node():
    """Sharing a sampled draw would try the guess only when no draw equals it (biased)."""
    b = _builder()
    b.add(-1, 10, torch.ones(100) / 100)  # a sampled draw of the guess's first token
    new = graft_chain(b, [10, 11], shared=[])
    assert b.parents[new[0]] == -1 and b.q_index[new[0]] == DETERMINISTIC


def test_picked_nodes_come_first_in_every_sibling_group():
    parents, q_index = [-1, -1, 0, -1, 3], [0, 0, 1, DETERMINISTIC, DETERMINISTIC]
    order = picked_first(parents, q_index, [0, 1, 2, 3, 4])
    assert order == [3, 0, 1, 4, 2]
    b = _builder()
    for parent, q in zip(parents, q_index):
        b.add(parent, 5, None if q == DETERMINISTIC else torch.ones(100) / 100)
    tree, _ = b.tree(order, ordered=True)  # DraftTree accepts it: parents first, picked first
    assert tree.parents == [-1, -1, -1, 0, 1] and tree.deterministic(0) and not tree.deterministic(1)


def test_a_picked_child_after_a_sampled_sibling_is_refused():
    with pytest.raises(ValueError, match="deterministic child after a sampled one"):
        DraftTree([-1, -1], [1, 2], torch.ones(1, 6) / 6, q_index=[0, DETERMINISTIC])


@pytest.mark.parametrize("guess", [0, 1, 5])
def test_a_picked_guess_beside_sampled_draws_leaves_the_first_token_distributed_as_p(guess):
    """The verifier alone: a picked child tried first, then two draws from q against its residual."""
    gen = torch.Generator().manual_seed(3)
    trials, counts = VERIFIER_TRIALS, torch.zeros(6)
    for _ in range(trials):
        draws = torch.multinomial(Q, 2, replacement=False, generator=gen).tolist()
        tree = DraftTree([-1, -1, -1], [guess] + draws, Q[None], True, [DETERMINISTIC, 0, 0])
        counts[accept_tokens(tree, P.expand(4, -1), greedy=False, generator=gen).tokens[0]] += 1
    assert 0.5 * ((counts / trials) - P).abs().sum() < tv_bound(dict(enumerate(P.tolist())), trials)
    assert counts[5] == 0


def test_sharing_a_sampled_draw_would_be_caught():
    """Sanity of that statistic: the biased rule (try the guess only when no draw equals it) is off."""
    gen = torch.Generator().manual_seed(3)
    trials, hits = VERIFIER_TRIALS, 0
    for _ in range(trials):
        draw = int(torch.multinomial(Q, 1, generator=gen))
        if draw == 1:  # shared: the draw alone, the ratio rule
            tree = DraftTree([-1], [1], Q[None])
        else:
            tree = DraftTree([-1, -1], [1, draw], Q[None], True, [DETERMINISTIC, 0])
        hits += accept_tokens(tree, P.expand(3, -1), greedy=False, generator=gen).tokens[0] == 1
    assert abs(hits / trials - float(P[1])) > 0.03  # 0.4 * 0.5 + 0.6 * 0.2 = 0.32, not 0.2


def _lookup_rounds(policy) -> int:
    """Rounds whose tree holds more nodes than the drafter's chain: the lookup branch was grafted."""
    return sum(r["drafted"] > r["depth"] for r in policy.records)


@pytest.mark.parametrize("mode,k_config,batch", [("sd", (1,), 1), ("seed", (1,), None), ("seed", (2, 2), None),
                                                  ("mcsd", (2, 1), 1)])
def test_greedy_output_equals_the_target_alone_with_lookup(target, drafter, mode, k_config, batch):
    prompts = [REPEATING, [9, 1, 77, 9, 1], PROMPT]
    params = SamplingParams(max_new_tokens=24, temperature=0)
    policy = ParallelSpecPolicy(drafter, k_config, depth=3, lookup=2)
    results = Engine(target, drafter).generate(prompts, params, mode=mode, k_config=k_config, draft_batch=batch,
                                               verify_batch=batch, draft_policy=policy)
    for prompt, result in zip(prompts, results):
        assert result.token_ids == reference_greedy(target, prompt, 24)
    assert _lookup_rounds(policy) > 0


def test_greedy_output_equals_the_target_alone_with_lookup_and_the_joint_cut(target, drafter):
    prompts = [REPEATING, [9, 1, 77, 9, 1], PROMPT]
    params = SamplingParams(max_new_tokens=20, temperature=0)
    policy = ParallelSpecPolicy(drafter, (1,), depth=4, costs=STEEP, lookup=3)
    results = Engine(target, drafter).generate(prompts, params, mode="seed", draft_batch=None, verify_batch=None,
                                               draft_policy=policy)
    for prompt, result in zip(prompts, results):
        assert result.token_ids == reference_greedy(target, prompt, 20)
    assert _lookup_rounds(policy) > 0


def test_a_lookup_guess_the_target_agrees_with_is_accepted(target, drafter):
    """Greedy: this prompt's continuation repeats one token 25 times (tokens 46-70), which the guess
    copies from the run so far; the untrained drafter's masks do not."""
    params = SamplingParams(max_new_tokens=70, temperature=0)
    runs = [Engine(target, drafter).generate([[9, 1, 77]], params, mode="sd", draft_policy="parallelspec",
                                             policy_options={"depth": "4", "lookup": str(n)})[0] for n in (0, 3)]
    assert runs[0].token_ids == runs[1].token_ids == reference_greedy(target, [9, 1, 77], 70)
    assert runs[1].stats.accepted >= runs[0].stats.accepted + 10, (runs[0].stats, runs[1].stats)


@pytest.mark.parametrize("mode,k_config,setting,batch", [("sd", (1,), "temperature", 1),
                                                         ("seed", (2, 2), "top_p", None),
                                                         ("seed", (1,), "top_k", None)])
def test_sampled_output_follows_the_target_distribution_with_lookup(mode, k_config, setting, batch, monkeypatch):
    """The TV fixture's prompt with its own continuation in front of it, so that lookup guesses from
    the first round; the exact distribution is taken after that same context."""
    import test_sampling_lossless as fixture

    context = [1, 4, 2, 5, 1, 4, 2]  # "4 2" occurred before: the guess is "5 1"
    monkeypatch.setattr(fixture, "PROMPT", context)
    target, drafter = parallelspec_pair()
    policy = ParallelSpecPolicy(drafter, k_config, depth=2, lookup=2)
    assert_policy_samples_follow_the_target(target, drafter, policy, setting, mode, k_config, batch)
    assert _lookup_rounds(policy) > SAMPLES // 2


def test_lookup_option_and_drafter_json_default(tmp_path, target, drafter):
    engine = Engine(target, drafter)
    params = SamplingParams(max_new_tokens=4, temperature=0)
    with pytest.raises(ValueError, match="option lookup='-1' must be >= 0"):
        engine.generate([PROMPT], params, mode="sd", draft_policy="parallelspec", policy_options={"lookup": "-1"})
    assert engine.policy("sd", (1,), params, "parallelspec").lookup == 0
    save_drafter(drafter, tmp_path / "d", target, "tiny-target")
    config = json.loads((tmp_path / "d" / "drafter.json").read_text())
    (tmp_path / "d" / "drafter.json").write_text(json.dumps({**config, "lookup": 3}))
    loaded = load_drafter(tmp_path / "d", target, "tiny-target")
    assert Engine(target, loaded).policy("sd", (1,), params).model.lookup == 3  # the drafter's default, under choose
    assert Engine(target, loaded).policy("sd", (1,), params, "parallelspec", {"lookup": "0"}).lookup == 0
    (tmp_path / "d" / "drafter.json").write_text(json.dumps({**config, "lookup": "often"}))
    with pytest.raises(ValueError, match=r"drafter.json: lookup='often' must be an integer >= 0"):
        load_drafter(tmp_path / "d", target, "tiny-target")
