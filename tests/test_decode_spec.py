"""DecodeSpec: every decoding setting parsed and checked in one place, one canonical form each, and
the same object from the command line or a config through the search layer to the engine."""
from __future__ import annotations

import asyncio
import dataclasses
import pickle
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import seed_tot.search
from conftest import reference_greedy
from scripted_engine import ScriptedEngine
from seed_tot import Engine, SamplingParams
from seed_tot.bench import parse_modes
from seed_tot.cli import main
from seed_tot.engine.decode_spec import DecodeSpec, DecodeSpecError
from seed_tot.engine.seed import SeedScheduler
from seed_tot.search import ConfigError, DecodingSettings, RunSettings, apply_overrides, load_settings

FIXTURES = Path(__file__).parent / "fixtures"
PROMPTS = [[5, 6, 7], [9, 1, 4, 4, 2]]
GREEDY = SamplingParams(max_new_tokens=6, temperature=0)


# --------------------------------------------------------------------------- parsing and checks
@pytest.mark.parametrize("setting,value,message", [
    ("mode", "beam", "unknown mode 'beam'; expected one of ar, parallel, sd, mcsd, seed"),
    ("k_config", (2, 0), "k_config must be a non-empty sequence of positive integers"),
    ("k_config", "2,x", "k_config must be a sequence of positive integers"),
    ("k_config", (1.5, 2), "k_config must be a sequence of positive integers"),  # ran as (1, 2)
    ("k_config", (True,), "k_config must be a sequence of positive integers"),
    ("n_workers", 0, "n_workers must be a positive integer or None"),
    ("verify_batch", "every", "verify_batch must be a positive integer, None or 'all'"),
    ("verify_batch", 0, "verify_batch must be a positive integer"),
    ("draft_batch", True, "draft_batch must be a positive integer"),
    ("draft_batch", 2.0, "draft_batch must be a positive integer"),
    ("draft_policy", "beam", "unknown draft_policy 'beam'; expected one of fixed, opt-tree"),
    ("policy_options", 3, "policy_options must be a mapping"),
])
def test_each_bad_setting_is_refused_naming_the_setting(setting, value, message):
    with pytest.raises(DecodeSpecError, match=message) as caught:
        DecodeSpec(**{setting: value})
    assert caught.value.setting == setting and isinstance(caught.value, ValueError)
    copied = pickle.loads(pickle.dumps(caught.value))  # as a Ray actor would send it back
    assert (copied.setting, str(copied)) == (setting, str(caught.value))


def test_each_setting_has_one_canonical_form_whatever_the_spelling():
    spelled = DecodeSpec(mode="seed", k_config="2, 2,1", n_workers="3", verify_batch=None, draft_batch="4",
                         policy_options={"n": 8, "delta": 0.2})
    canonical = DecodeSpec(mode="seed", k_config=(2, 2, 1), n_workers=3, verify_batch="all", draft_batch=4,
                           policy_options=(("delta", 0.2), ("n", 8)))
    assert spelled == canonical and spelled.k_config == (2, 2, 1) and spelled.verify_batch == "all"
    assert DecodeSpec(k_config=[2, 2, 1]) == DecodeSpec(k_config=(2, 2, 1))
    assert DecodeSpec().verify_batch == "auto"  # decided per model pair by the engine, kept as given here


def test_all_from_the_command_line_a_config_and_python_is_the_same_value(tmp_path):
    solve = main.get_command(click.Context(main), "solve")
    flags = solve.make_context("solve", ["gsm8k", "--output", str(tmp_path / "o"), "--verify-batch", "all",
                                         "--draft-batch", "all"], parent=click.Context(main)).params
    from_cli = apply_overrides(RunSettings(), verify_batch=flags["verify_batch"], draft_batch=flags["draft_batch"])
    config = tmp_path / "c.yaml"
    config.write_text("verify_batch: all\ndraft_batch: null\n")
    from_yaml = load_settings(config)
    from_python = DecodeSpec(verify_batch=None, draft_batch="all")
    assert from_cli.decode == from_yaml.decode == from_python
    assert {from_cli.decode.verify_batch, from_yaml.decode.draft_batch, from_python.verify_batch} == {"all"}
    written = from_yaml.to_dict()  # summary.json keeps the word a person wrote
    assert (written["verify_batch"], written["draft_batch"]) == ("all", "all")


def test_a_spec_is_immutable_and_survives_pickling_for_ray_actors():
    spec = DecodeSpec(k_config=(2, 1), draft_policy="opt-tree", policy_options={"n": 8})
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.verify_batch = 3
    assert pickle.loads(pickle.dumps(spec)) == spec
    settings = RunSettings(decode=spec)
    assert pickle.loads(pickle.dumps(settings)).decode == spec and settings.k_config == (2, 1)


def test_parsing_a_spec_from_command_line_strings_imports_no_torch():
    code = ("import sys\nfrom seed_tot.engine.decode_spec import DecodeSpec\n"
            "DecodeSpec(mode='seed', k_config='2,2,1', n_workers='2', verify_batch='all', draft_batch='auto')\n"
            "print('torch' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "False", run.stderr[-2000:]


# --------------------------------------------------------------------------- errors at each door
def test_a_config_key_with_a_bad_value_names_the_file_the_key_and_what_it_accepts(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("n_workers: 0\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:1: key 'n_workers': n_workers must be a positive integer"):
        load_settings(config)


def test_a_bad_flag_is_a_usage_error_naming_the_flag_before_any_model_loads():
    result = CliRunner().invoke(main, ["generate", "--verify-batch", "0", "--target", "/no/such/model"])
    assert result.exit_code == 2
    assert "--verify-batch" in result.output and "verify_batch must be a positive integer" in result.output


def test_a_bad_bench_mode_entry_names_the_entry_and_the_setting():
    with pytest.raises(click.BadParameter, match=r"'seed@w0': n_workers must be a positive integer"):
        parse_modes("seed@w0", DecodeSpec())


# --------------------------------------------------------------------------- one object, end to end
class _SpecRecorder(ScriptedEngine):
    def __init__(self):
        super().__init__(lambda user, copy: "good. The answer is 7.")


def test_one_spec_object_travels_unchanged_from_the_command_line_and_config_to_every_engine_call(tmp_path,
                                                                                               monkeypatch):
    engine, solved = _SpecRecorder(), []
    real_solve = seed_tot.search.solve_dataset

    def spy(engine, task, examples, *, settings, **kwargs):
        solved.append(settings)
        return real_solve(engine, task, examples, settings=settings, **kwargs)

    monkeypatch.setattr("seed_tot.cli.load_engine", lambda *args, **kwargs: engine)
    monkeypatch.setattr(seed_tot.search, "solve_dataset", spy)
    config = tmp_path / "gsm8k.yaml"
    config.write_text("depth: 1\nn_generate: 2\nk_config: [2, 2, 1]\ndraft_batch: all\n")
    result = CliRunner().invoke(main, ["solve", "gsm8k", "--data", str(FIXTURES / "gsm8k_small.jsonl"), "--limit", "1",
                                       "--config", str(config), "--verify-batch", "3", "--n-workers", "2",
                                       "--output", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    [settings] = solved
    assert settings.decode == DecodeSpec(mode="seed", k_config=(2, 2, 1), n_workers=2, verify_batch=3, draft_batch="all")
    assert engine.calls and all(call.spec is settings.decode for call in engine.calls)


def test_the_engine_resolves_a_spec_once_and_hands_the_scheduler_the_callers_settings(llama_pair, monkeypatch):
    engine = Engine(*llama_pair)
    received, resolved = [], []
    real_submit, real_resolved = SeedScheduler.submit, Engine._resolved

    def submit(self, seqs, policy, spec, prepare=None):
        received.append(spec)
        return real_submit(self, seqs, policy, spec, prepare)

    def counting(self, spec):
        resolved.append(spec)
        return real_resolved(self, spec)

    monkeypatch.setattr(SeedScheduler, "submit", submit)
    monkeypatch.setattr(Engine, "_resolved", counting)
    spec = DecodeSpec(mode="seed", k_config=(2, 1), n_workers=1, verify_batch=2, draft_batch="auto")
    engine.generate(PROMPTS, GREEDY, spec=spec)
    assert resolved == [spec]  # once per call (it was decided twice per call before)
    # "auto" decided for this pair (batched masks are exact for llama); everything else as the caller gave it
    assert received == [dataclasses.replace(spec, draft_batch="all")]
    engine.generate(PROMPTS, GREEDY, spec=DecodeSpec(mode="sd"))
    assert len(resolved) == 2


# --------------------------------------------------------------------------- the older API
def test_keyword_settings_still_work_and_decode_as_the_same_spec(llama_pair):
    engine = Engine(*llama_pair)
    by_keywords = engine.generate(PROMPTS, GREEDY, mode="seed", k_config=(2, 1), verify_batch=None, draft_batch="all")
    by_spec = engine.generate(PROMPTS, GREEDY, spec=DecodeSpec(mode="seed", k_config=(2, 1), verify_batch="all",
                                                               draft_batch="all"))
    positional = engine.generate(PROMPTS, GREEDY, "sd", (1, 1))
    assert [r.token_ids for r in by_keywords] == [r.token_ids for r in by_spec] == [r.token_ids for r in positional]
    with pytest.raises(ValueError, match="either as spec=DecodeSpec"):
        engine.generate(PROMPTS, GREEDY, mode="sd", spec=DecodeSpec(mode="seed"))


def test_a_call_that_names_no_mode_runs_the_engines_default_sync_or_async(llama_pair):
    """seed where the engine can draft, parallel where it cannot; generate and agenerate agree."""
    seen = []

    class Spying(Engine):
        def _resolved(self, spec):
            seen.append(spec.mode)
            return super()._resolved(spec)

    drafting, plain = Spying(*llama_pair), Spying(llama_pair[0])
    assert (drafting.default_mode, plain.default_mode) == ("seed", "parallel")
    for engine in (drafting, plain):
        out = engine.generate(PROMPTS, GREEDY)
        out_async = asyncio.run(engine.agenerate(PROMPTS, GREEDY))
        assert [r.token_ids for r in out] == [r.token_ids for r in out_async] == [
            reference_greedy(llama_pair[0], p, GREEDY.max_new_tokens) for p in PROMPTS]
    assert seen == ["seed", "seed", "parallel", "parallel"]
    assert sum(r.stats.draft_forwards for r in drafting.generate(PROMPTS, GREEDY)) > 0
    assert drafting.generate(PROMPTS, GREEDY, spec=DecodeSpec(mode="ar"))[0].stats.draft_forwards == 0


def test_the_settings_objects_take_their_old_fields_with_a_deprecation_warning():
    with pytest.warns(DeprecationWarning, match="DecodingSettings"):
        decoding = DecodingSettings(mode="sd", verify_batch=None, max_new_tokens=16)
    assert decoding.spec == DecodeSpec(mode="sd", verify_batch="all") and decoding.max_new_tokens == 16
    with pytest.warns(DeprecationWarning, match="RunSettings"):
        settings = RunSettings(mode="ar", k_config=[2, 1])
    assert settings.decode == DecodeSpec(mode="ar", k_config=(2, 1)) and settings.mode == "ar"
    with pytest.raises(ConfigError, match="command line: key 'verify_batch'"):
        apply_overrides(settings, verify_batch="every")


def test_the_scheduler_still_takes_its_old_batch_keywords_with_a_deprecation_warning(llama_pair):
    engine = Engine(*llama_pair)
    seqs, k_config = engine._start(PROMPTS, GREEDY, "seed", (1,), verify_batch="all", draft_batch=2)
    policy = engine.policy("seed", k_config, GREEDY)
    with pytest.warns(DeprecationWarning, match="SeedScheduler.run"):
        asyncio.run(SeedScheduler(engine).run(seqs, policy, verify_batch=None, draft_batch=2))
    assert [seq.generated for seq in seqs] == [reference_greedy(engine.target, p, GREEDY.max_new_tokens)
                                                for p in PROMPTS]
