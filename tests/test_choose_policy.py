"""The `choose` draft policy: per row and round, the draft model, the suffix source, both grafted, or
none, by expected accepted tokens per unit of step cost. What it takes and declines at a given price
(a draft step priced at the rows that share it, with the tokens it must catch up on), and that its
greedy output is the target's and its sampled output has the target's distribution, with a chain
draft model and with a ParallelSpec drafter."""
from __future__ import annotations

import pytest
from conftest import reference_greedy, tiny_model
from test_attention_types import NEW, PROMPTS as ARCH_PROMPTS, arch_engine  # noqa: F401 (a fixture)
from test_sampling_lossless import SAMPLES, assert_policy_samples_follow_the_target
from test_suffix_policy import PROMPTS, REPEATING, target  # noqa: F401 (a fixture)
from seed_tot import Engine, SamplingParams
from seed_tot.engine.cost_model import Costs
from seed_tot.engine.policies.choose import MISSED, ChoosePolicy
from seed_tot.engine.policies.choose_pricing import best_option, expected_accepted
from seed_tot.engine.policies.suffix import SuffixSource


FLAT = Costs(0.1, 0.0, 0.0)  # a verified token and a draft step cost nothing more: every source pays, both at once most
DEAR = Costs(0.01, 0.05, 0.05)  # a drafted token costs most of a step: hardly any draft pays
MILD = Costs(0.05, 0.01, 0.01)  # a drafted token costs a sixth of a step: a draft pays if surer than that
CHEAP = Costs(0.05, 0.002, 0.002)  # a drafted token costs a 12th of a step: a model level pays if it adds 0.08


def test_the_choice_takes_what_pays_and_declines_what_does_not():
    assert best_option(0.6, 0.6, 3, FLAT, 3, 1, graft=True) == (3, 3)
    assert best_option(0.6, 0.6, 3, FLAT, 3, 1, graft=False) in ((3, 0), (0, 3))
    assert best_option(0.1, 0.9, 4, MILD, 3, 1, graft=True) == (0, 4)  # the sure suffix draft alone
    assert best_option(0.1, 0.1, 4, MILD, 3, 1, graft=True) == (0, 0)  # nothing pays: a plain step
    assert best_option(0.9, 0.0, 0, MILD, 3, 1, graft=True)[0] > 0  # no suffix match: the model's chain
    # at a load of 16 rows a verified token costs the round more than it gives at 0.5 (a CPU's
    # forward grows with its tokens): the same draft that pays alone is declined in a crowd
    steep = Costs(0.05, 0.01, 0.01, ((1, 0.05), (16, 0.06), (64, 1.0)))
    assert best_option(0.5, 0.5, 3, steep, 3, 1, graft=True) != (0, 0)
    assert best_option(0.5, 0.5, 3, steep, 3, 16, graft=True) == (0, 0)
    # a long match whose later tokens cost more than they are likely to give is cut to its paying prefix:
    # at 0.5 a token, with a verified token costing a sixth of a step, 2 of 4 (0.75 - 2/6 beats 0.94 - 4/6)
    assert best_option(0.0, 0.5, 4, MILD, 3, 1, graft=True) == (0, 2)
    # two branches off one root: the better of the two at each depth, never less than either alone
    assert expected_accepted(0.5, 2, 0.5, 2) > expected_accepted(0.5, 2, 0.0, 0) == pytest.approx(0.75)


def test_a_graft_counts_the_model_only_where_the_suffix_chain_is_wrong():
    """Two branches off one root: where the suffix chain is right the walk takes it, so the model adds
    what it gets right where the suffix chain fails. Independent sources (missed = a_m) give the old
    sum; a model right only where the suffix chain is adds nothing, and a sure suffix match then
    drafts alone where an independent model would have been grafted beside it."""
    assert expected_accepted(0.5, 3, 0.6, 2, missed=0.5) == pytest.approx(expected_accepted(0.5, 3, 0.6, 2))
    assert expected_accepted(0.6, 3, 0.8, 3, missed=0.0) == pytest.approx(expected_accepted(0.0, 0, 0.8, 3))
    # past the suffix chain's end only the model's branch reaches: its acceptance overall counts there
    assert expected_accepted(0.6, 3, 0.8, 1, missed=0.0) == pytest.approx(0.8 + 0.6 ** 2 + 0.6 ** 3)
    k, l = best_option(0.7, 0.7, 3, CHEAP, 3, 1, graft=True)
    assert k > 0 and l > 0
    assert best_option(0.7, 0.7, 3, CHEAP, 3, 1, graft=True, missed=0.05) == (0, 3)


def test_the_model_is_judged_again_in_rounds_whose_suffix_chain_missed():
    """A model that agrees with the suffix chain, right when it is and wrong when it is not: its
    acceptance overall stays near a half, its acceptance where the suffix chain missed falls toward
    0, and choose then drafts a suffix chain of four alone instead of grafting the model beside it."""
    from types import SimpleNamespace

    policy = ChoosePolicy(MILD, SuffixSource(depth=4), max_len=3, costs_at="calibrated")
    policy.source = SimpleNamespace(observe=lambda seq: None)
    seq = SimpleNamespace(rule=SimpleNamespace(params=SamplingParams(max_new_tokens=64, temperature=0, phase="thought")),
                          index=0, done=False)
    tree = type("Tree", (), {"depth": lambda self: 2, "tokens": [5, 6, 5, 6], "expected_tokens": lambda self: 0.0,
                             "__len__": lambda self: 4})()
    for n in range(40):
        row = policy._row(seq)
        row.taken, row.suffix_tokens, row.chain_first, row.round = (2, 2), [5, 6], 5, None
        right = n % 2 == 0  # the suffix chain [5, 6] and the model's [5, 6] are right together, or both wrong
        policy.observe(seq, tree, SimpleNamespace(tokens=[5, 6, 9] if right else [3], path=[0, 1] if right else []))
    a_model, a_suffix, missed = (policy.alpha(seq, s) for s in ("model", "suffix", MISSED))
    assert 0.3 < a_model < 0.8 and missed < 0.1
    k, l = best_option(a_model, a_suffix, 4, CHEAP, 3, 1, graft=True)  # as if independent: grafted
    assert k > 0 and l > 0
    assert best_option(a_model, a_suffix, 4, CHEAP, 3, 1, graft=True, missed=missed) == (0, 4)


def test_the_one_token_fallback_is_judged_apart_from_longer_matches():
    """Chains of a two-token match right every round, the one-token fallback's wrong every round: each
    kind keeps its own estimate, so at a price where a drafted token must be right a sixth of the time
    the longer match's chain is drafted whole and the fallback's declined (one estimate for both
    would price each at their mix, about a half: a two-token prefix of either)."""
    from types import SimpleNamespace

    from seed_tot.engine.policies.choose import FALLBACK
    from seed_tot.engine.suffix_index import DraftNode

    assert best_option(0.0, 0.5, 3, MILD, 0, 1, graft=True) == (0, 2)  # the mix's price
    policy = ChoosePolicy(MILD, SuffixSource(depth=4), max_len=3, costs_at="calibrated")
    policy.source = SimpleNamespace(observe=lambda seq: None)
    seq = SimpleNamespace(rule=SimpleNamespace(params=SamplingParams(max_new_tokens=64, temperature=0, phase="thought")),
                          index=0, done=False, draft=None, generated=[])
    tree = type("Tree", (), {"depth": lambda self: 3, "tokens": [5, 6, 7], "expected_tokens": lambda self: 0.0,
                             "__len__": lambda self: 3})()
    indexed = [DraftNode(-1, 5, 1.0), DraftNode(0, 6, 1.0), DraftNode(1, 7, 1.0)]
    fallback = [DraftNode(-1, 5, 1.0, fallback=True), DraftNode(0, 6, 1.0, fallback=True),
                DraftNode(1, 7, 1.0, fallback=True)]
    for n in range(40):
        chain = indexed if n % 2 else fallback
        policy.source.draft = lambda seq, limit, chain=chain: chain
        policy.begin(seq, seq.rule.params, 100)
        row = policy._row(seq)
        row.taken, row.suffix_tokens, row.round = (0, 3), [5, 6, 7], None  # judged whole, taken or not
        policy.observe(seq, tree, SimpleNamespace(tokens=[5, 6, 7, 9] if n % 2 else [3], path=[]))
    assert policy.alpha(seq, "suffix") > 0.8 and policy.alpha(seq, FALLBACK) < 0.1
    policy.source.draft = lambda seq, limit: indexed
    policy.begin(seq, seq.rule.params, 100)
    assert policy._row(seq).taken == (0, 3) and policy._row(seq).suffix_kind == "suffix"
    policy.source.draft = lambda seq, limit: fallback
    policy.begin(seq, seq.rule.params, 100)
    assert policy._row(seq).taken[1] == 0 and policy._row(seq).suffix_kind == FALLBACK  # the model may be probed


def test_only_the_one_token_fallback_marks_its_draft():
    """What `choose` tells the two kinds apart by: unigram_draft's nodes say so, draft_from's do not."""
    from seed_tot.engine.suffix_index import PreviousOccurrence, draft_from, unigram_draft

    tokens = [4, 8, 9, 1, 4]
    previous = PreviousOccurrence()
    previous.extend(tokens)
    assert [(n.token, n.fallback) for n in unigram_draft(tokens, previous, 3)] == [(8, True), (9, True), (1, True)]
    assert not any(n.fallback for n in draft_from([(2, tokens, 1)], 3))


def test_a_probe_doubles_the_gap_even_when_right_and_a_round_the_price_takes_resets_it():
    """A model the price declines is probed now and then so its estimate can recover. A right probe
    that still leaves it unpaid is no reason to probe sooner: each probe doubles the gap (8, 16, 32,
    64 rounds, then 64), and only a round in which the price itself takes the model brings it back
    to probe_every."""
    from types import SimpleNamespace

    policy = ChoosePolicy(DEAR, SuffixSource(depth=4), max_len=3, costs_at="calibrated", probe_every=8)
    policy.source = SimpleNamespace(observe=lambda seq: None)
    seq = SimpleNamespace(rule=SimpleNamespace(params=SamplingParams(max_new_tokens=64, temperature=0, phase="thought")),
                          index=0, done=False)
    tree = type("Tree", (), {"depth": lambda self: 1, "tokens": [5], "expected_tokens": lambda self: 0.0,
                             "__len__": lambda self: 1})()
    row = policy._row(seq)

    def probes(rounds: int) -> list[int]:
        found = []
        for n in range(rounds):
            k, l = policy._probe(row, 0, 0, 0)
            if k:  # the probe's one token is right
                found.append(n)
                row.taken, row.suffix_tokens, row.chain_first, row.round = (k, l), [], None, None
                policy.observe(seq, tree, SimpleNamespace(tokens=[5, 7], path=[0]))
        return found

    first = probes(300)
    assert first[0] == 7 and [b - a for a, b in zip(first, first[1:])] == [16, 32, 64, 64, 64]
    assert policy.alpha(seq, "model") > 0.7  # every probe was right, and the gap grew all the same
    policy._probe(row, 3, 0, 0)  # the price takes the model this round
    assert probes(10)[0] == 7


@pytest.mark.parametrize("costs", [FLAT, DEAR], ids=["flat", "dear"])
@pytest.mark.parametrize("mode,batch", [("sd", 1), ("mcsd", 1), ("seed", 1), ("seed", None)])
def test_choose_greedy_output_equals_the_target_alone(target, mode, batch, costs):
    params = SamplingParams(max_new_tokens=40, temperature=0, search_key="s", phase="thought")
    engine = Engine(target, tiny_model("llama", seed=5))
    policy = ChoosePolicy(costs, SuffixSource(depth=4), max_len=3, costs_at="calibrated")
    for _ in range(2):  # the second call drafts from the first's outputs too
        results = engine.generate(PROMPTS, params, mode=mode, draft_batch=batch, verify_batch=batch, draft_policy=policy)
        for prompt, result in zip(PROMPTS, results):
            assert result.token_ids == reference_greedy(target, prompt, 40)
    drafted = [rec["drafted"] for rec in policy.records]
    if costs is FLAT:  # every round drafts, the two sources grafted (more nodes than either's chain)
        assert min(drafted) > 0 and max(drafted) > 4
        assert policy._phases[("thought", "model")].trials > 0 and policy._phases[("thought", "suffix")].trials > 0
        assert policy._phases[("thought", MISSED)].trials > 0  # the model judged where the suffix chain missed
    else:  # most rounds decline
        assert sum(d == 0 for d in drafted) > len(drafted) // 2


def test_choose_greedy_output_on_every_attention_type(arch_engine):
    arch, engine, refs = arch_engine
    params = SamplingParams(max_new_tokens=NEW, temperature=0, search_key="arch")
    policy = ChoosePolicy(FLAT, SuffixSource(depth=3), max_len=2, costs_at="calibrated")
    for mode, batch in (("sd", 1), ("seed", 1), ("seed", None)):
        results = engine.generate(ARCH_PROMPTS, params, mode=mode, draft_batch=batch, verify_batch=batch,
                                  draft_policy=policy)
        assert [r.token_ids for r in results] == refs, f"{arch} {mode} batch {batch}"


@pytest.mark.parametrize("mode,setting,batch", [("sd", "temperature", 1), ("seed", "top_p", None), ("seed", "top_k", 1)])
def test_choose_sampled_output_follows_the_target_distribution(mode, setting, batch, monkeypatch):
    """A draft model that agrees often, not always, and the suffix source's guesses grafted beside it:
    picked suffix nodes first, the model's draws against the residual."""
    import test_sampling_lossless as fixture
    from conftest import noisy_copy

    monkeypatch.setattr(fixture, "PROMPT", [1, 4, 2, 4, 1, 4, 2])
    target = tiny_model("llama", seed=21, vocab=fixture.VOCAB)
    draft = noisy_copy(target, 0.6, seed=22)
    policy = ChoosePolicy(FLAT, SuffixSource(depth=2, factor=2, share="all"), max_len=2, costs_at="calibrated")
    assert_policy_samples_follow_the_target(target, draft, policy, setting, mode, (1, 1), batch)
    assert sum(rec["drafted"] > 2 for rec in policy.records) > SAMPLES // 4  # grafted rounds really ran


def test_a_sampled_row_is_priced_at_its_constant_load_and_a_greedy_one_planned_alone_as_one_row(target):
    """A sampled row (load=greedy) prices its round as if `sampled_rows` rows like it shared the
    forward: on a forward flat for its first tokens and steep past 16, a draft pays priced as one row
    and not as 16. A greedy row planned alone (sd) is one row whatever sampled_rows says."""
    import copy

    steep = Costs(0.05, 0.01, 0.01, ((1, 0.05), (16, 0.06), (64, 1.0)))
    engine = Engine(target, copy.deepcopy(target))  # a draft that is always right: only the price decides
    drafted = {}
    for temperature, rows in ((1.0, 1), (1.0, 16), (0.0, 16)):
        params = SamplingParams(max_new_tokens=24, temperature=temperature, seed=3)
        policy = ChoosePolicy(steep, SuffixSource(depth=4), max_len=3, costs_at="calibrated", sampled_rows=rows)
        engine.generate(PROMPTS, params, mode="sd", draft_policy=policy)
        rounds = [rec["drafted"] for rec in policy.records]
        drafted[temperature, rows] = sum(d > 0 for d in rounds) / len(rounds)
    assert drafted[1.0, 1] > 0.8 and drafted[0.0, 16] > 0.8
    assert drafted[1.0, 16] < 0.3  # declined but for the probes that keep its estimates fresh
    with pytest.raises(ValueError, match="sampled_rows"):
        ChoosePolicy(steep, SuffixSource(depth=4), sampled_rows=0)


# a draft model whose one forward costs 80 ms for one row and 150 ms for eight, beside a target round of
# 8 rows at 450 ms and 16 ms a verified token more (the Qwen2.5-Coder 0.5B / 1.5B pair on a 2-core CPU)
SHARED = Costs(0.05, 0.016, 0.08, ((1, 0.06), (8, 0.45), (64, 1.35)), ((1, 0.08), (8, 0.15), (64, 0.6)))


def test_a_model_draft_step_is_priced_at_the_rows_that_share_it():
    assert best_option(0.8, 0.0, 0, SHARED, 3, 8, graft=True)[0] > 0  # its share of a forward for 8
    assert best_option(0.8, 0.0, 0, SHARED, 3, 8, graft=True, drafting=1) == (0, 0)  # the whole forward alone
    assert best_option(0.8, 0.0, 0, SHARED, 3, 8, graft=True, drafting=8) == best_option(0.8, 0.0, 0, SHARED, 3, 8,
                                                                                          graft=True)


def test_a_model_draft_is_priced_with_the_tokens_it_must_catch_up_on():
    """A row that has not drafted for a while feeds the draft every token since, at its first step:
    the draft that pays right after the last one (1 unseen token) does not after 40."""
    assert best_option(0.8, 0.0, 0, SHARED, 3, 8, graft=True, drafting=8, pending=1)[0] > 0
    assert best_option(0.8, 0.0, 0, SHARED, 3, 8, graft=True, drafting=8, pending=40) == (0, 0)
    assert best_option(0.8, 0.9, 4, SHARED, 3, 8, graft=True, drafting=8, pending=40) == (0, 4)  # the text alone


def _planned_round(alphas: list[float]) -> list[int]:
    """The model lengths choose's joint plan gives greedy rows whose model acceptance is `alphas` (no
    suffix match), in one round of as many rows."""
    from types import SimpleNamespace

    policy = ChoosePolicy(SHARED, SuffixSource(depth=4), max_len=3, costs_at="calibrated")
    policy.source = SimpleNamespace(draft=lambda seq, limit: [])  # no suffix match: the model or nothing
    seqs = [SimpleNamespace(rule=SimpleNamespace(params=SamplingParams(max_new_tokens=32, temperature=0)),
                            generated=[], draft=None) for _ in alphas]
    by_row = {id(s): a for s, a in zip(seqs, alphas)}
    policy.alpha = lambda seq, source: by_row[id(seq)] if source == "model" else 0.0
    policy.plan_batch(seqs, len(seqs))
    return [policy._plans[id(s)][0] for s in seqs]


def test_the_joint_plan_prices_the_model_at_the_rows_that_take_it():
    """Eight sure rows share the draft forward and all draft; one sure row among seven the model never
    gets right would take it at an eighth of the forward, but it would run for that row alone, and
    at that price it does not pay; four sure rows still pay at a quarter each."""
    assert all(k > 0 for k in _planned_round([0.8] * 8))
    assert _planned_round([0.8] + [0.0] * 7) == [0] * 8
    four = _planned_round([0.8] * 4 + [0.0] * 4)
    assert all(k > 0 for k in four[:4]) and four[4:] == [0] * 4


@pytest.mark.parametrize("mode,batch", [("seed", None), ("seed", 1)])
def test_choose_greedy_output_equals_the_target_alone_when_the_plan_reprices_its_drafting_rows(target, mode, batch):
    """With a draft that is always right and draft forwards that cost a lone row four times its share
    of eight, the rows that draft change from round to round; the tokens stay the target's."""
    import copy

    params = SamplingParams(max_new_tokens=32, temperature=0, search_key="s", phase="thought")
    engine = Engine(target, copy.deepcopy(target))
    policy = ChoosePolicy(SHARED, SuffixSource(depth=4), max_len=3, costs_at="calibrated")
    prompts = PROMPTS + [p[::-1] for p in PROMPTS] + [p + [7] for p in PROMPTS]
    results = engine.generate(prompts, params, mode=mode, draft_batch=batch, verify_batch=batch, draft_policy=policy)
    for prompt, result in zip(prompts, results):
        assert result.token_ids == reference_greedy(target, prompt, 32)
    assert any(rec["drafted"] for rec in policy.records)


def test_choose_by_name_and_its_options(target):
    engine = Engine(target, tiny_model("llama", seed=5))
    params = SamplingParams(max_new_tokens=6, temperature=0)
    out = engine.generate([REPEATING], params, mode="seed", draft_policy="choose",
                          policy_options={"max_len": "2", "depth": "3", "graft": "false"})
    assert out[0].token_ids == reference_greedy(target, REPEATING, 6)
    out = engine.generate([REPEATING], params, mode="seed", draft_policy="choose", policy_options={"unigram": "0"})
    assert out[0].token_ids == reference_greedy(target, REPEATING, 6)
    assert ChoosePolicy.parse_options(unigram="5")["suffix"]["unigram"] == 5
    assert ChoosePolicy.parse_options(unigram_rows="ALL")["suffix"]["unigram_rows"] == "all"
    with pytest.raises(ValueError, match="option graft='maybe' must be one of true, false"):
        engine.generate([REPEATING], params, mode="seed", draft_policy="choose", policy_options={"graft": "maybe"})


@pytest.mark.parametrize("features", [False, True])
@pytest.mark.parametrize("costs", [FLAT, DEAR], ids=["flat", "dear"])
@pytest.mark.parametrize("mode,batch", [("sd", 1), ("seed", None)])
def test_choose_with_a_parallelspec_drafter_is_exact(mode, batch, costs, features):
    """With a ParallelSpec drafter (the embedded default's kind, which may read the target's hidden
    states) the model's option is the drafter's one-pass round, the suffix chain grafted beside it;
    rounds without it leave the drafter's cache and feature log to catch up at the next."""
    from test_sampling_lossless import parallelspec_pair
    from test_target_features import feature_drafter
    from seed_tot.engine.policies.parallelspec import ParallelSpecPolicy

    if features:
        target = tiny_model("llama", seed=3)
        drafter = feature_drafter(target, n_masks=2)
    else:
        target, drafter = parallelspec_pair()
    prompts = [[1, 4, 2, 5, 1, 4, 2, 5, 1], [3, 3, 6, 3, 3], [7, 1, 2]]
    engine = Engine(target, drafter)
    depth = 3 if features else 2
    policy = ChoosePolicy(costs, SuffixSource(depth=3), model=ParallelSpecPolicy(drafter, (1,), depth=depth),
                          costs_at="calibrated")
    params = SamplingParams(max_new_tokens=24, temperature=0, search_key="s", phase="value")
    for _ in range(2):
        results = engine.generate(prompts, params, mode=mode, draft_batch=batch, verify_batch=batch, draft_policy=policy)
        assert [r.token_ids for r in results] == [reference_greedy(target, p, 24) for p in prompts]
    if costs is FLAT:
        assert policy._phases[("value", "model")].trials > 0 and policy._phases[("value", "suffix")].trials > 0
        assert max(rec["drafted"] for rec in policy.records) > depth  # grafted rounds
    # by name, the drafter's own defaults
    named = engine.policy(mode, (1, 1, 1), params, "choose")
    assert named.model is not None and named.max_len == named.model.depth
