"""The `suffix` draft policy: drafts read off the run's own text (the row, its search's other rows and
earlier calls, earlier outputs), scored by branch counts, with no draft model. Its drafts are picked
tokens, so greedy output is the target's and sampled output has its distribution, in sd, mcsd and
SEED (one row per forward and batched), on every attention type; a sampled row's draft (and so its
sample for a seed) depends on nothing that runs beside its search."""
from __future__ import annotations

import dataclasses

import pytest
from conftest import reference_greedy, tiny_model
from test_attention_types import NEW, PROMPTS as ARCH_PROMPTS, arch_engine  # noqa: F401 (a fixture)
from test_sampling_lossless import SAMPLES, SETTINGS, assert_policy_samples_follow_the_target
from seed_tot import Engine, SamplingParams
from seed_tot.engine.draft_tree import DETERMINISTIC
from seed_tot.engine.policies.suffix import SuffixPolicy, SuffixSource
from seed_tot.engine.suffix_index import SuffixScopes, TextIndex, draft_from

REPEATING = [3, 17, 42, 8, 61, 5, 3, 17, 42, 8]
PROMPTS = [REPEATING, [9, 1, 77], [5, 5, 5, 5, 2]]


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", seed=21)


# ----------------------------------------------------------------------------- the index


def test_the_longest_match_decides_and_its_continuation_is_drafted_as_long_as_the_match():
    index = TextIndex()
    index.new_doc([1, 2, 3, 4, 5, 1, 2, 3, 9, 9, 1, 2, 3, 4, 7])
    found = index.occurrences([5, 1, 2, 3], 8, 32)
    assert [(m, p) for m, _, p in found] == [(3, 12), (4, 7), (3, 2)]  # most recent first
    # "5 1 2 3" matched 4 tokens at 7 only: what followed it, 4 tokens at most (the match's length)
    assert [n.token for n in draft_from(found, 8)] == [9, 9, 1, 2]
    assert [n.token for n in draft_from(found, 2)] == [9, 9]


def test_branch_counts_pick_the_continuation_most_occurrences_agree_on():
    index = TextIndex()
    index.new_doc([6, 7, 1, 6, 7, 2, 6, 7, 2, 6, 7])
    chain = draft_from(index.occurrences([0, 6, 7], 8, 32), 4, factor=4)
    assert [n.token for n in chain][:1] == [2]  # 2 followed "6 7" twice, 1 once (and more recently 2)
    assert chain[0].prob == pytest.approx(2 / 3)
    tree = draft_from(index.occurrences([0, 6, 7], 8, 32), 4, width=2, factor=4)
    roots = [n.token for n in tree if n.parent == -1]
    assert roots == [2, 1]  # a small tree: both branches, the more frequent first
    assert all(n.parent < i for i, n in enumerate(tree))  # parents first


def test_the_run_scope_evicts_the_oldest_text_first_and_stays_bounded():
    index = TextIndex(max_tokens=10)
    for i in range(50):
        index.new_doc([i, i + 1, i + 2, i + 3])
    assert index.tokens <= 10 and list(index.docs) == [48, 49]
    assert sum(len(h) for h in index._pairs.values()) <= 2 * 10  # stale entries are dropped as they pile up
    assert index.occurrences([0, 1], 8, 32) == []  # evicted text is never read


class _Rule:
    def __init__(self, params):
        self.params = params


class _Seq:
    def __init__(self, index, prompt, rule, generated=()):
        self.index, self.prompt, self.rule, self.generated = index, list(prompt), rule, list(generated)
        self.finish_reason = None
        self.draft = None

    @property
    def tokens(self):
        return self.prompt + self.generated

    @property
    def done(self):
        return self.finish_reason is not None


def test_siblings_draft_from_each_other_and_a_later_call_from_the_earlier_ones():
    greedy = SamplingParams(max_new_tokens=32, temperature=0, search_key="problem-1")
    scopes = SuffixScopes()
    call = _Rule(greedy)
    a, b = _Seq(0, [1, 2], call, [10, 11, 12, 13, 14]), _Seq(1, [1, 2], call, [10, 11])
    scopes.sync(a)
    assert [n.token for n in scopes.draft(b, 3, factor=4)] == [12, 13, 14]  # what its sibling wrote on
    a.finish_reason = b.finish_reason = "stop"
    scopes.finish(a)
    scopes.finish(b)
    later = _Seq(0, [5], _Rule(greedy), [10, 11])
    assert [n.token for n in scopes.draft(later, 3, factor=4)] == [12, 13, 14]
    # another search reads the run (every earlier output), a row of no search too
    other = _Seq(0, [5], _Rule(dataclasses.replace(greedy, search_key="problem-2")), [10, 11])
    assert [n.token for n in scopes.draft(other, 3, factor=4)] == [12, 13, 14]
    keyless = _Seq(0, [5], _Rule(dataclasses.replace(greedy, search_key="")), [10, 11])
    assert [n.token for n in scopes.draft(keyless, 3, factor=4)] == [12, 13, 14]


def test_a_sampled_row_reads_its_search_s_finished_calls_only():
    """What other searches wrote, and what siblings write while they run, depends on what runs beside
    the search: a sampled row's draft (hence its sample for a seed) must not."""
    sampled = SamplingParams(max_new_tokens=32, temperature=1.0, search_key="p")
    scopes = SuffixScopes()
    stranger = _Seq(0, [1], _Rule(dataclasses.replace(sampled, search_key="q", temperature=0)), [10, 11, 20, 21])
    stranger.finish_reason = "stop"
    scopes.sync(stranger)
    scopes.finish(stranger)
    call = _Rule(sampled)
    a, b = _Seq(0, [1], call, [10, 11, 30, 31]), _Seq(1, [1], call, [10, 11])
    scopes.sync(a)
    assert scopes.draft(b, 3) == []  # neither the other search's output nor its running sibling
    a.finish_reason = "stop"
    scopes.finish(a)
    assert [n.token for n in scopes.draft(_Seq(0, [1], _Rule(sampled), [10, 11]), 2)] == [30, 31]
    everything = SuffixScopes(share="all")
    everything.sync(stranger)
    everything.finish(stranger)
    assert [n.token for n in everything.draft(_Seq(0, [1], _Rule(sampled), [10, 11]), 2)] == [20, 21]


def test_finished_calls_settle_in_row_order_whatever_order_they_finished_in():
    sampled = SamplingParams(max_new_tokens=32, temperature=1.0, search_key="p")
    docs = []
    for order in ((0, 1), (1, 0)):
        scopes = SuffixScopes()
        call = _Rule(sampled)
        rows = [_Seq(0, [1], call, [10, 11, 1]), _Seq(1, [1], call, [10, 11, 2])]
        for i in order:
            scopes.sync(rows[i])
            rows[i].finish_reason = "stop"
            scopes.finish(rows[i])
        scopes.draft(_Seq(0, [1], _Rule(sampled), [7]), 2)  # the next call settles the first
        docs.append(list(scopes.searches["p"].settled.docs.values()))
    assert docs[0] == docs[1] == [[10, 11, 1], [10, 11, 2]]


def test_where_no_scope_matches_two_tokens_the_row_drafts_from_its_last_token_s_previous_occurrence():
    greedy = _Rule(SamplingParams(max_new_tokens=32, temperature=0))
    # "9 4": no earlier pair; 4 last occurred at 1, followed by 2 3 5 (unigram=3 tokens at most)
    row = _Seq(0, [1, 4, 2, 3, 5, 6], greedy, [9, 4])
    assert [(n.parent, n.token) for n in SuffixScopes().draft(row, 8)] == [(-1, 2), (0, 3), (1, 5)]
    assert [n.token for n in SuffixScopes(unigram=2).draft(row, 8)] == [2, 3]
    assert [n.token for n in SuffixScopes().draft(row, 1)] == [2]  # never past the round's limit
    assert SuffixScopes(unigram=0).draft(row, 8) == []
    assert SuffixScopes().draft(_Seq(0, [1, 4, 2], greedy, [9, 7]), 8) == []  # 7 never occurred before
    # a two-token match anywhere wins: "3 5" in the row, followed by 6 9 (as long as the match)
    assert [n.token for n in SuffixScopes().draft(_Seq(0, [1, 4, 2, 3, 5, 6], greedy, [9, 3, 5]), 8)] == [6, 9]
    # the row grows round by round: the fallback follows it
    scopes, grown = SuffixScopes(), _Seq(0, [1, 4, 2, 3], greedy, [])
    assert scopes.draft(grown, 8) == []
    grown.generated += [8, 2]
    assert [n.token for n in scopes.draft(grown, 8)] == [3, 8, 2]
    # a sampled row only with unigram_rows=all
    sampled = _Seq(0, [1, 4, 2, 3, 5, 6], _Rule(SamplingParams(max_new_tokens=32, temperature=1.0)), [9, 4])
    assert SuffixScopes().draft(sampled, 8) == []
    assert [n.token for n in SuffixScopes(unigram_rows="all").draft(sampled, 8)] == [2, 3, 5]


def test_a_round_drafts_picked_nodes_and_no_model_forward():
    seq = _Seq(0, REPEATING, _Rule(SamplingParams(max_new_tokens=8, temperature=0)))
    rnd = SuffixPolicy(SuffixSource(depth=3, factor=4)).begin(seq, seq.rule.params, 100)
    assert rnd.first_feed() is None
    tree, entries = rnd.finish()
    assert tree.tokens == [61, 5, 3] and tree.parents == [-1, 0, 1] and entries == {}
    assert all(tree.q_index[i] == DETERMINISTIC for i in range(3))


# ----------------------------------------------------------------------------- exactness


@pytest.mark.parametrize("width", [1, 2])
@pytest.mark.parametrize("with_draft_model", [False, True])
@pytest.mark.parametrize("mode,batch", [("sd", 1), ("mcsd", 1), ("seed", 1), ("seed", 3), ("seed", None)])
def test_greedy_output_equals_the_target_alone(target, mode, batch, with_draft_model, width):
    params = SamplingParams(max_new_tokens=40, temperature=0, search_key="s")
    engine = Engine(target, tiny_model("llama", seed=5) if with_draft_model else None)
    policy = SuffixPolicy(SuffixSource(depth=4, width=width))
    results = engine.generate(PROMPTS, params, mode=mode, draft_batch=batch, verify_batch=batch, draft_policy=policy)
    for prompt, result in zip(PROMPTS, results):
        assert result.token_ids == reference_greedy(target, prompt, 40)
        assert result.stats.draft_prefills == 0 and result.stats.draft_forwards == 0
    assert sum(r.stats.accepted for r in results) > 0  # some drafts were right
    # a second call of the search: the first call's outputs are there to draft from, still exact
    again = engine.generate(PROMPTS, params, mode=mode, draft_batch=batch, verify_batch=batch, draft_policy=policy)
    assert [r.token_ids for r in again] == [r.token_ids for r in results]
    assert sum(r.stats.accepted for r in again) >= sum(r.stats.accepted for r in results)


def test_greedy_output_equals_the_target_alone_on_every_attention_type(arch_engine):
    arch, engine, refs = arch_engine
    params = SamplingParams(max_new_tokens=NEW, temperature=0, search_key="arch")
    for mode, batch in (("sd", 1), ("seed", 1), ("seed", None)):
        results = engine.generate(ARCH_PROMPTS, params, mode=mode, draft_batch=batch, verify_batch=batch,
                                  draft_policy="suffix")
        assert [r.token_ids for r in results] == refs, f"{arch} {mode} batch {batch}"


@pytest.mark.parametrize("mode,setting,batch,share", [("sd", "temperature", 1, "greedy"), ("seed", "top_p", None, "all"),
                                                      ("seed", "top_k", 1, "all"), ("mcsd", "temperature", 1, "all")])
def test_sampled_output_follows_the_target_distribution(mode, setting, batch, share, monkeypatch):
    """The TV fixture's prompt with its own continuation in front of it, so that the row scope finds
    a match from the first round; share=all: sampled rows read each other's text too (still exact)."""
    import test_sampling_lossless as fixture

    monkeypatch.setattr(fixture, "PROMPT", [1, 4, 2, 4, 1, 4, 2])
    target = tiny_model("llama", seed=21, vocab=fixture.VOCAB)
    policy = SuffixPolicy(SuffixSource(depth=2, factor=2, share=share, width=2 if mode == "mcsd" else 1))
    assert_policy_samples_follow_the_target(target, None, policy, setting, mode, (1,), batch)
    assert sum(rec["drafted"] > 0 for rec in policy.records) > SAMPLES // 2


@pytest.mark.parametrize("mode,batch", [("sd", 1), ("seed", None)])
def test_sampled_output_follows_the_target_distribution_when_only_one_token_matches(mode, batch, monkeypatch):
    """A prompt whose last two tokens occur nowhere before, whose last token does: the first round is
    the one-token fallback's (each row's own text only, share=off; sampled rows use it with
    unigram_rows=all), and its first token is the target's choice about half the time."""
    import test_sampling_lossless as fixture

    monkeypatch.setattr(fixture, "PROMPT", [7, 1, 4, 5, 1])
    target = tiny_model("llama", seed=21, vocab=fixture.VOCAB)
    policy = SuffixPolicy(SuffixSource(depth=2, share="off", run_tokens=0, unigram_rows="all"))
    assert [n.token for n in policy.source.scopes.draft(_Seq(0, fixture.PROMPT, _Rule(fixture.SETTINGS["temperature"])),
                                                         2)] == [4, 5]
    policy.source.clear()
    assert_policy_samples_follow_the_target(target, None, policy, "temperature", mode, (1,), batch)


def test_a_sample_is_the_same_in_sd_and_in_batched_seed_and_beside_other_searches(target):
    """A sampled row reads its own text and its search's finished calls: the same seed gives the same
    sample whatever shares its forwards and whatever other searches wrote before."""
    params = SamplingParams(max_new_tokens=16, temperature=1.0, seed=7, search_key="mine")
    first = Engine(target).generate(PROMPTS, params, mode="sd", draft_policy="suffix")
    engine = Engine(target)
    noise = dataclasses.replace(params, search_key="other", temperature=0, max_new_tokens=24)
    engine.generate([REPEATING + [1, 2], [4, 4, 4]], noise, mode="seed", draft_policy="suffix")
    beside = engine.generate(PROMPTS, params, mode="seed", draft_batch=None, verify_batch=None, draft_policy="suffix")
    assert [r.token_ids for r in beside] == [r.token_ids for r in first]


def test_bad_options_and_no_draft_model_needed(target):
    engine = Engine(target)
    params = SamplingParams(max_new_tokens=4, temperature=0)
    with pytest.raises(ValueError, match="option width='0' must be >= 1"):
        engine.generate([REPEATING], params, mode="sd", draft_policy="suffix", policy_options={"width": "0"})
    with pytest.raises(ValueError, match="option share='some' must be one of greedy, all, off"):
        engine.generate([REPEATING], params, mode="sd", draft_policy="suffix", policy_options={"share": "some"})
    with pytest.raises(ValueError, match="option unigram='-1' must be >= 0"):
        engine.generate([REPEATING], params, mode="sd", draft_policy="suffix", policy_options={"unigram": "-1"})
    with pytest.raises(ValueError, match="option unigram_rows='some' must be one of greedy, all"):
        engine.generate([REPEATING], params, mode="sd", draft_policy="suffix", policy_options={"unigram_rows": "some"})
    assert engine.generate([REPEATING], params, mode="sd", draft_policy="suffix")[0].token_ids == \
        reference_greedy(target, REPEATING, 4)
    with pytest.raises(ValueError, match="search_key must be a string"):
        SamplingParams(search_key=3)


# ----------------------------------------------------------------------------- beside a ParallelSpec drafter


def _grafted_rounds(policy) -> int:
    """Rounds whose tree holds more nodes than the drafter's chain: a text branch was grafted."""
    return sum(r["drafted"] > r["depth"] for r in policy.records)


@pytest.mark.parametrize("lookup", [0, 2])
@pytest.mark.parametrize("mode,k_config,batch", [("sd", (1,), 1), ("seed", (1,), None), ("seed", (2, 2), None),
                                                  ("mcsd", (2, 1), 1)])
def test_parallelspec_with_the_suffix_graft_is_exact(mode, k_config, batch, lookup):
    from test_sampling_lossless import parallelspec_pair
    from seed_tot.engine.policies.parallelspec import ParallelSpecPolicy

    target, drafter = parallelspec_pair()
    prompts = [[1, 4, 2, 5, 1, 4, 2, 5, 1], [3, 3, 6, 3, 3], [7, 1, 2]]
    params = SamplingParams(max_new_tokens=24, temperature=0, search_key="s")
    policy = ParallelSpecPolicy(drafter, k_config, depth=2, lookup=lookup, suffix=SuffixSource(depth=2, factor=2))
    engine = Engine(target, drafter)
    for _ in range(2):
        results = engine.generate(prompts, params, mode=mode, k_config=k_config, draft_batch=batch, verify_batch=batch,
                                  draft_policy=policy)
        assert [r.token_ids for r in results] == [reference_greedy(target, p, 24) for p in prompts]
    assert _grafted_rounds(policy) > 0


@pytest.mark.parametrize("mode,k_config,setting,batch", [("sd", (1,), "temperature", 1),
                                                         ("seed", (2, 2), "top_p", None)])
def test_parallelspec_with_the_suffix_graft_keeps_the_distribution(mode, k_config, setting, batch, monkeypatch):
    import test_sampling_lossless as fixture
    from test_sampling_lossless import parallelspec_pair
    from seed_tot.engine.policies.parallelspec import ParallelSpecPolicy

    monkeypatch.setattr(fixture, "PROMPT", [1, 4, 2, 5, 1, 4, 2])
    target, drafter = parallelspec_pair()
    policy = ParallelSpecPolicy(drafter, k_config, depth=2, suffix=SuffixSource(depth=2, factor=2, share="all"))
    assert_policy_samples_follow_the_target(target, drafter, policy, setting, mode, k_config, batch)
    assert _grafted_rounds(policy) > SAMPLES // 2


def test_parallelspec_suffix_option_by_name():
    from test_sampling_lossless import parallelspec_pair

    target, drafter = parallelspec_pair()
    engine = Engine(target, drafter)
    params = SamplingParams(max_new_tokens=4, temperature=0)
    assert engine.policy("sd", (1,), params, "parallelspec", {"suffix": "true"}).suffix is not None
    assert engine.policy("sd", (1,), params, "parallelspec").suffix is None
    with pytest.raises(ValueError, match="option suffix='often' must be one of true, false"):
        engine.policy("sd", (1,), params, "parallelspec", {"suffix": "often"})


# ----------------------------------------------------------------------------- counters, concurrent searches


@pytest.mark.parametrize("name", ["suffix", "choose"])
def test_counters_sum_to_the_forwards_the_models_ran(name):
    from test_counters import PROMPTS as COUNTED, ForwardLog
    from test_choose_policy import FLAT
    from seed_tot.engine.policies.choose import ChoosePolicy
    from conftest import noisy_copy
    from seed_tot.engine import summarize

    target = tiny_model("llama", seed=3)
    draft = noisy_copy(target, 0.01)
    engine, target_log, draft_log = Engine(target, draft), ForwardLog(target), ForwardLog(draft)
    policy = (SuffixPolicy() if name == "suffix"
              else ChoosePolicy(FLAT, SuffixSource(depth=3), max_len=2, costs_at="calibrated"))
    for _ in range(2):
        results = engine.generate(COUNTED + [COUNTED[0] * 3], SamplingParams(max_new_tokens=12, temperature=0,
                                                                              search_key="c"),
                                  mode="seed", verify_batch=3, draft_policy=policy)
    total = summarize(results)
    assert total.drafted > 0 and total.accepted > 0
    assert total.target_query_tokens == total.verifications + total.drafted
    if name == "suffix":  # no draft model run at all
        assert draft_log.forwards == 0 and total.draft_forwards == total.draft_prefills == 0
    else:
        assert total.draft_forwards > 0


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("policy", ["suffix", "choose", "lookup"])
def test_concurrent_searches_give_the_predictions_of_one_at_a_time(tiny_model_dirs, tmp_path, policy, temperature):
    """Greedy: the target's output whatever is drafted. Sampled: a row reads its own text and its own
    search's finished calls only, so its sample for a seed does not depend on the searches beside it."""
    import json
    from test_solve_concurrency import QUESTIONS, _solve  # noqa: F401
    from seed_tot.search import apply_overrides, load_settings, solve_dataset
    from short_task import ShortTask

    engine = Engine.from_pretrained(target=tiny_model_dirs[0], draft=tiny_model_dirs[1], device="cpu")
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"question": q, "answer": "1"}) + "\n" for q in QUESTIONS))
    runs = []
    for concurrency in (1, 3):
        task, out = ShortTask(), tmp_path / f"c{concurrency}"
        settings = apply_overrides(load_settings(None, base=task.config), mode="seed", temperature=temperature,
                                   draft_policy=policy, draft_batch="all", verify_batch="all")
        solve_dataset(engine, task, task.load(str(data)), settings=settings, output_dir=out, concurrency=concurrency)
        runs.append({r["id"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())})
    assert set(runs[0]) == set(runs[1]) and len(runs[0]) == len(QUESTIONS)
    for key in runs[0]:
        assert runs[1][key]["prediction"] == runs[0][key]["prediction"]
        assert runs[1][key]["steps"] == runs[0][key]["steps"]


def test_clearing_the_prefix_cache_forgets_the_text_too(target):
    """A benchmark run starts as cold as a fresh engine (bench clears the prefix cache before each run):
    the text drafts read is forgotten with it, so a repeat of a run does not draft its own last output."""
    engine = Engine(target)
    params = SamplingParams(max_new_tokens=16, temperature=0)
    first = engine.generate([[9, 1, 77]], params, mode="sd", draft_policy="suffix")[0]
    engine.clear_prefix_cache()
    cold = engine.generate([[9, 1, 77]], params, mode="sd", draft_policy="suffix")[0]
    warm = engine.generate([[9, 1, 77]], params, mode="sd", draft_policy="suffix")[0]
    assert first.token_ids == cold.token_ids == warm.token_ids
    assert cold.stats.accepted == first.stats.accepted < warm.stats.accepted  # warm read the last output



def test_cli_suffix_and_choose_match_ar(tiny_model_dirs):
    import json
    from test_cli import run

    target, draft = tiny_model_dirs
    outs = {}
    for label, args in (("ar", ["--mode", "ar"]), ("suffix", ["--draft", "lookup", "--draft-policy", "suffix"]),
                        ("choose", ["--draft", draft, "--draft-policy", "choose", "--policy-option", "depth=4"])):
        out = run("generate", "Tom has 3 apples. Tom has 3 apples.", "--target", target, *args,
                  "--max-new-tokens", "12", "--json")
        outs[label] = json.loads(out.splitlines()[0])["token_ids"]
    assert outs["ar"] == outs["suffix"] == outs["choose"]
