"""A draft policy's options are checked when a command starts, before any model loads: an unknown key
or a value the policy cannot read is one usage line naming the policy, the option and what it takes.
The same check needs no engine (policies.check_policy_options), and from_options still applies it for
Python callers."""
from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

import seed_tot.bench
import seed_tot.cli
from seed_tot.cli import main
from seed_tot.engine.policies import POLICIES, check_policy_options, make_policy
from seed_tot.engine.policies.prompt_lookup import PromptLookupPolicy

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def no_model_loads(monkeypatch):
    """Any model load fails the test: the refusal must come first."""
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the policy options were checked")
    monkeypatch.setattr(seed_tot.cli, "load_engine", refuse)
    monkeypatch.setattr(seed_tot.bench, "load_engine", refuse)


def _usage_error(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 2, result.output
    return result.output


def test_solve_refuses_an_unknown_policy_option_before_loading_models(no_model_loads, tmp_path):
    out = _usage_error("solve", "gsm8k", "--data", str(FIXTURES / "gsm8k_small.jsonl"), "--mode", "seed",
                       "--draft-policy", "fixed", "--policy-option", "foo=1", "--output", str(tmp_path / "o"))
    assert "draft policy 'fixed' has no option foo; it takes no options" in out


def test_generate_refuses_a_policy_option_of_the_wrong_type_before_loading_models(no_model_loads):
    out = _usage_error("generate", "--mode", "sd", "--draft-policy", "lookup", "--policy-option", "ngram=abc")
    assert "--policy-option" in out and "draft policy 'lookup': option ngram='abc' is not an int" in out


def test_bench_refuses_a_later_modes_bad_option_before_any_mode_runs(no_model_loads):
    out = _usage_error("bench", "--modes", "ar,sd,seed+opt-tree:zz=1")
    assert "'seed+opt-tree:zz=1': draft policy 'opt-tree' has no option zz; it takes n, delta, max_depth, " \
           "temperature" in out
    out = _usage_error("bench", "--modes", "ar,sd+lookup:ngram=abc")
    assert "'sd+lookup:ngram=abc': draft policy 'lookup': option ngram='abc' is not an int" in out


def test_the_check_names_the_accepted_keys_from_the_policys_own_signature():
    with pytest.raises(ValueError, match="'lookup' has no option ngrams; it takes ngram, depth$"):
        check_policy_options("lookup", {"ngrams": "2"})


@pytest.mark.parametrize("name, options, message", [
    ("opt-tree", {"n": "many"}, "option n='many' is not an int or auto"),
    ("opt-tree", {"delta": "-1"}, "option delta='-1' must be >= 0"),
    ("auto", {"recalibrate": "maybe"}, "option recalibrate='maybe' must be one of true, false"),
    ("auto", {"load": "some"}, "load='some' must be one of greedy, all, off"),
    ("parallelspec", {"cut": "often"}, "cut='often' must be one of none, cost"),
    ("parallelspec", {"passes": "two"}, "option passes='two' is not an int"),
    ("specdec", {"h": "0.3"}, "needs a trained head"),
    ("specdec", {"head": "dir", "min_len": "1.5"}, "option min_len='1.5' is not an int"),
    ("specdec", {"head": "dir", "h": "1"}, "option h='1' must be between 0 and 1"),
    ("specdec", {"head": "dir", "min_len": "5", "max_len": "3"}, "option max_len='3' must be >= min_len='5'"),
    ("auto", {"prior": "1.5"}, "option prior='1.5' must be <= 1"),
])
def test_values_a_policy_cannot_read_are_refused_without_an_engine(name, options, message):
    with pytest.raises(ValueError, match=message):
        check_policy_options(name, options)


def test_values_a_policy_reads_pass_and_come_back_converted():
    assert check_policy_options("opt-tree", {"n": "auto", "delta": "0.1"}) == {
        "n": "auto", "delta": 0.1, "max_depth": 8, "temperature": None}
    assert check_policy_options("auto", {"recalibrate": "yes", "load": "true"})["load"] == "greedy"
    assert check_policy_options("lookup", {"ngram": "2"}) == {"ngram": 2, "depth": None}
    for name in POLICIES:  # every policy's defaults are readable (specdec's only with its required head)
        check_policy_options(name, {"head": "dir"} if name == "specdec" else {})


def test_python_callers_still_get_the_checks_from_from_options():
    with pytest.raises(ValueError, match="option ngram='abc' is not an int"):
        PromptLookupPolicy.from_options(None, (1, 1), None, ngram="abc")
    with pytest.raises(ValueError, match="has no option foo"):
        make_policy("fixed", {"foo": 1}, None, (1,), None)


def test_a_head_without_a_policy_that_reads_one_is_refused_before_loading_models(no_model_loads, tmp_path):
    # the default policy (here the shipped drafter's parallelspec) reads no head; the engine said so only
    # after loading the models, as "draft policy 'parallelspec' has no option head"
    out = _usage_error("generate", "--mode", "sd", "--head", str(tmp_path))
    assert "--head" in out and "read by the draft policies specdec, auto; name one with --draft-policy" in out


@pytest.mark.parametrize("policy", ["specdec", "auto"])
def test_a_head_directory_with_no_head_is_refused_before_loading_models(no_model_loads, tmp_path, policy):
    out = _usage_error("generate", "--mode", "sd", "--draft-policy", policy, "--head", str(tmp_path / "nothing"))
    assert "--head" in out and "nothing/head.json: no head here (train one with `seed-tot train-head`)" in out
    out = _usage_error("solve", "gsm8k", "--data", str(FIXTURES / "gsm8k_small.jsonl"), "--mode", "seed",
                       "--draft-policy", policy, "--head", str(tmp_path), "--output", str(tmp_path / "o"))
    assert f"{tmp_path}/head.json: no head here" in out
