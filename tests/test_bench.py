"""`seed-tot bench` on the tiny synthetic preset, the mode-spec syntax, and the acceptance oracle."""
from __future__ import annotations

import json
import random

import click
import pytest
import torch
from click.testing import CliRunner

from seed_tot import SamplingParams
from seed_tot.bench import parse_modes
from seed_tot.engine.decode_spec import DecodeSpec

ONE_BY_ONE = DecodeSpec(verify_batch=1, draft_batch=1)  # --modes defaults: the paper's SEED execution
from seed_tot.cli import main
from seed_tot.engine import summarize
from seed_tot.synthetic import PRESETS, build_model, build_synthetic_engine, expected_acceptance, target_token

MODES = ["ar", "parallel", "sd", "mcsd:2-2-1", "seed", "seed:2-2-1", "seed@vb3"]


def _bench(*args: str) -> str:
    result = CliRunner().invoke(main, ["bench", "--synthetic", "tiny", "--device", "cpu", *args],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.fixture(scope="module")
def thoughts_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    stdout = _bench("--modes", ",".join(MODES), "--max-new-tokens", "8", "--repeats", "2", "--alpha", "0.7",
                    "--json", str(out))
    return stdout, json.loads(out.read_text())


def _table_rows(stdout: str) -> dict[str, str]:
    return {line.split()[0]: line for line in stdout.splitlines() if line.split() and line.split()[0] in MODES}


def test_table_and_json_list_every_mode(thoughts_run):
    stdout, data = thoughts_run
    assert set(_table_rows(stdout)) == set(MODES)
    assert [m["label"] for m in data["modes"]] == MODES
    assert {m["label"]: m["k_config"] for m in data["modes"]}["mcsd:2-2-1"] == [2, 2, 1]
    assert {m["label"]: m["verify_batch"] for m in data["modes"]}["seed@vb3"] == 3
    for m in data["modes"]:
        assert len(m["walls_s"]) == 2 and m["wall_min_s"] <= m["wall_median_s"] <= m["wall_max_s"]
        assert m["new_tokens_per_run"] == 6 * 8  # 3 thoughts + 3 values, 8 tokens each, nothing stops early
        assert m["peak_memory_mib"] > 0


def test_synthetic_runs_say_so_with_preset_and_alpha(thoughts_run):
    stdout, data = thoughts_run
    assert stdout.count("SYNTHETIC") >= 3  # banner, title, table footer
    assert "alpha=0.7" in stdout and "preset tiny" in stdout
    assert data["kind"] == "SYNTHETIC" and data["title"].startswith("SYNTHETIC")
    assert data["synthetic"]["preset"] == "tiny" and data["synthetic"]["alpha"] == 0.7
    env = data["environment"]
    assert env["torch"] == torch.__version__ and env["date"] and env["device_name"]
    # whether drafting overlapped verification (draft_stream.py): off by default on the CPU, and said so
    assert env["overlap_drafting"] is False and "drafting and verification in turn" in stdout


def test_greedy_check_reports_every_mode_reproduces_ar(thoughts_run):
    stdout, data = thoughts_run
    assert "tokens == ar" in stdout
    rows = _table_rows(stdout)
    assert rows["ar"].rstrip().endswith("ref")
    assert all(rows[m].rstrip().endswith("yes") for m in MODES[1:])
    assert all(m["matches_ar"] is True for m in data["modes"])


def test_speedups_are_ratios_of_median_walls(thoughts_run):
    _, data = thoughts_run
    by = {m["label"]: m for m in data["modes"]}
    for m in data["modes"]:
        assert m["speedup_vs_ar"] == pytest.approx(by["ar"]["wall_median_s"] / m["wall_median_s"])
        assert m["speedup_vs_parallel"] == pytest.approx(by["parallel"]["wall_median_s"] / m["wall_median_s"])


def test_sampling_runs_do_not_claim_token_equality():
    stdout = _bench("--modes", "ar,sd", "--max-new-tokens", "4", "--repeats", "1", "--temperature", "1.0")
    assert "n/a (sampling)" in _table_rows(stdout)["sd"]


def test_tot_workload_compares_predictions_with_ar(tmp_path):
    out = tmp_path / "tot.json"
    stdout = _bench("--workload", "tot-gsm8k", "--data", "tests/fixtures/gsm8k_small.jsonl", "--limit", "1",
                    "--modes", "ar,seed", "--max-new-tokens", "6", "--repeats", "1", "--json", str(out),
                    "--output", str(tmp_path / "runs"))
    assert "predictions == ar" in stdout and "SYNTHETIC" in stdout
    summaries = sorted(p.parent.name for p in (tmp_path / "runs").glob("*/summary.json"))
    assert summaries == ["ar-0", "ar-1", "seed-0", "seed-1"]  # --output keeps warm-up and timed runs
    data = json.loads(out.read_text())
    assert [m["matches_ar"] for m in data["modes"]] == [True, True]
    assert data["modes"][1]["target_forwards"] > 0


def test_tot_workload_without_data_names_the_flag():
    result = CliRunner().invoke(main, ["bench", "--synthetic", "tiny", "--device", "cpu", "--workload",
                                       "tot-creative-writing", "--repeats", "1"])
    assert result.exit_code != 0 and "--data" in result.output


def test_bench_trace_has_one_panel_per_mode(tmp_path):
    _bench("--modes", "ar,seed:2-2-1", "--max-new-tokens", "4", "--repeats", "1", "--trace", str(tmp_path))
    trace = json.loads((tmp_path / "trace.json").read_text())
    calls = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["tid"] == 2]
    assert sorted({c["args"]["mode"] for c in calls}) == ["ar", "seed:2-2-1"]
    sections = [e["name"] for e in trace["traceEvents"] if e["ph"] == "X" and e["tid"] == 1]
    assert sections == ["ar run 1", "seed:2-2-1 run 1"]


def test_synthetic_refuses_real_model_flags():
    result = CliRunner().invoke(main, ["bench", "--synthetic", "tiny", "--target", "x"])
    assert result.exit_code != 0 and "--synthetic" in result.output


# --------------------------------------------------------------------------- mode specs
def test_mode_specs_carry_their_own_settings():
    specs = parse_modes("ar,mcsd:2-2-1,seed,seed:3-1@w2@vb4", ONE_BY_ONE)
    assert [(s.label, s.decode.mode, s.decode.k_config, s.decode.n_workers, s.decode.verify_batch) for s in specs] == [
        ("ar", "ar", (1, 1, 1), None, 1), ("mcsd:2-2-1", "mcsd", (2, 2, 1), None, 1),
        ("seed", "seed", (1, 1, 1), None, 1), ("seed:3-1@w2@vb4", "seed", (3, 1), 2, 4)]


@pytest.mark.parametrize("bad", ["beam", "ar:2-2", "sd@vb2", "seed:0-1", "seed@vb0", "seed,seed", "seed:2,2"])
def test_bad_mode_specs_are_rejected(bad):
    with pytest.raises(click.BadParameter):
        parse_modes(bad, ONE_BY_ONE)


# --------------------------------------------------------------------------- the oracle
@pytest.fixture(scope="module")
def random_prompts():
    rng = random.Random(0)
    return [[rng.randrange(8192) for _ in range(rng.randint(2, 20))] for _ in range(40)]


# The oracle's acceptance is measured through seed with batched forwards: greedy, it drafts and
# accepts exactly as sd and mcsd do round by round (the same counts), in a fraction of their time,
# since sd and mcsd run the 40 sequences one after another.
BATCHED = dict(mode="seed", draft_batch=None, verify_batch=None)


@pytest.mark.parametrize("alpha", [0.5, 0.8])
def test_chain_acceptance_is_close_to_alpha(alpha, random_prompts):
    engine = build_synthetic_engine("tiny", alpha, "cpu")
    params = SamplingParams(max_new_tokens=24, temperature=0)
    results = engine.generate(random_prompts, params, k_config=(1,), **BATCHED)
    stats = summarize(results)
    assert stats.draft_depth > 500  # enough rounds that 0.06 is > 3 standard errors
    assert stats.acceptance_rate == pytest.approx(alpha, abs=0.06)


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_extreme_alphas_accept_nothing_or_everything(alpha, random_prompts):
    engine = build_synthetic_engine("tiny", alpha, "cpu")
    stats = summarize(engine.generate(random_prompts[:4], SamplingParams(max_new_tokens=10, temperature=0),
                                      mode="sd", k_config=(1, 1)))
    assert stats.acceptance_rate == alpha


def test_deeper_chains_and_trees_match_the_oracles_expectation(random_prompts):
    engine = build_synthetic_engine("tiny", 0.7, "cpu")
    params = SamplingParams(max_new_tokens=24, temperature=0)
    for k in ((1, 1, 1), (2, 1)):  # a chain (sd's shape) and a tree (mcsd's)
        stats = summarize(engine.generate(random_prompts, params, k_config=k, **BATCHED))
        assert stats.acceptance_rate == pytest.approx(expected_acceptance(0.7, k), abs=0.06), k


def test_oracle_target_follows_its_hash_chain():
    engine = build_synthetic_engine("tiny", 0.5, "cpu")
    prompt = [11, 22, 33]
    tokens = engine.generate([prompt], SamplingParams(max_new_tokens=6, temperature=0), mode="ar")[0].token_ids
    expected, prev = [], prompt[-1]
    for pos in range(len(prompt) - 1, len(prompt) + 5):
        prev = int(target_token(torch.tensor(prev), torch.tensor(pos), 8192))
        expected.append(prev)
    assert tokens == expected


@pytest.mark.parametrize("preset,target_m,draft_m", [("llama2-7b+llama-160m", 6738, 162),
                                                     ("qwen2-1.5b+qwen2-0.5b", 1544, 494)])
def test_presets_have_the_real_models_parameter_counts(preset, target_m, draft_m):
    sizes = []
    for spec in PRESETS[preset]:
        model = build_model(spec, torch.device("meta"), torch.bfloat16)  # shapes only, no memory
        assert model.dtype == torch.bfloat16
        sizes.append(round(sum(p.numel() for p in model.parameters()) / 1e6))
    assert sizes == [target_m, draft_m]


def test_a_mode_with_different_tokens_is_reported_as_not_matching():
    from seed_tot.bench import ModeReport, ModeSpec, RunOutput
    from seed_tot.bench_report import format_table, summarize_reports
    from seed_tot.engine.params import GenerationStats

    def report(mode: str, tokens: list[list[int]]) -> ModeReport:
        stats = GenerationStats(new_tokens=2, verifications=2, target_forwards=2, target_busy_s=0.5, wall_s=1.0)
        return ModeReport(ModeSpec(mode, DecodeSpec(mode, (1,), verify_batch=1)), [RunOutput(1.0, stats, tokens, None)])

    reports = [report("ar", [[1, 2]]), report("sd", [[1, 2]]), report("seed", [[1, 3]])]
    rows = summarize_reports(reports, greedy=True, synthetic=None, tot=False)
    assert [r["matches_ar"] for r in rows] == [True, True, False]
    table = format_table(rows, greedy=True, tot=False, synthetic=None)
    assert table.splitlines()[-1].rstrip().endswith("NO") and "SYNTHETIC" not in table
    assert "rounding" not in table  # float32: a NO is a mismatch to look into, with no excuse printed
    half = format_table(rows, greedy=True, tot=False, synthetic=None, dtype="bfloat16")
    assert half.splitlines()[-1].startswith("bfloat16: a forward's rounding depends on its batch shape")


def test_tokens_per_second_uses_the_median_run(thoughts_run):
    _, data = thoughts_run
    for m in data["modes"]:
        assert m["tokens_per_s"] == pytest.approx(m["new_tokens_per_run"] / m["wall_median_s"])


def test_batch_suffixes_set_draft_and_verify_batch_per_mode():
    specs = parse_modes("seed@db1@vb1,seed@dball@vball,seed@db3", DecodeSpec(verify_batch=1, draft_batch="all"))
    assert [(s.label, s.decode.draft_batch, s.decode.verify_batch) for s in specs] == [
        ("seed@db1@vb1", 1, 1), ("seed@dball@vball", "all", "all"), ("seed@db3", 3, 1)]
    for bad in ("seed@db0", "seed@dbx", "sd@db2", "seed@wall"):
        with pytest.raises(click.BadParameter):
            parse_modes(bad, ONE_BY_ONE)


def test_tot_step_workload_runs_18_sequences_and_batched_seed_matches_ar(tmp_path):
    out = tmp_path / "step.json"
    _bench("--workload", "tot-step", "--modes", "ar,parallel,seed@db1@vb1,seed@dball@vball", "--max-new-tokens", "4",
           "--repeats", "1", "--warmup", "0", "--json", str(out))
    data = json.loads(out.read_text())
    rows = {m["label"]: m for m in data["modes"]}
    assert rows["ar"]["new_tokens_per_run"] == 18 * 4  # 9 thoughts + 9 values, nothing stops early
    assert all(m["matches_ar"] for m in data["modes"])
    assert rows["seed@dball@vball"]["rows_per_target_forward"] > 1 >= rows["seed@db1@vb1"]["rows_per_target_forward"] - 1e-9
    assert 0 <= rows["seed@dball@vball"]["cache_share"] < 1


def test_policy_suffix_names_a_draft_policy_and_its_options():
    specs = parse_modes("sd+auto,seed@dball+opt-tree:n=8:delta=0.2,mcsd:2-1", ONE_BY_ONE)
    assert [(s.label, s.decode.draft_policy, s.decode.policy_options) for s in specs] == [
        ("sd+auto", "auto", ()), ("seed@dball+opt-tree:n=8:delta=0.2", "opt-tree", (("delta", "0.2"), ("n", "8"))),
        ("mcsd:2-1", None, ())]
    assert specs[1].decode.options == {"n": "8", "delta": "0.2"} and specs[1].decode.draft_batch == "all"
    for bad in ("ar+auto", "sd+beam", "sd+auto:n"):
        with pytest.raises(click.BadParameter):
            parse_modes(bad, ONE_BY_ONE)


def test_bench_runs_policies_from_the_mode_spec_and_they_match_ar(tmp_path):
    out = tmp_path / "policies.json"
    _bench("--modes", "ar,sd+auto,seed+opt-tree:n=4", "--max-new-tokens", "6", "--repeats", "1", "--warmup", "0",
           "--json", str(out))
    assert all(m["matches_ar"] for m in json.loads(out.read_text())["modes"])


def test_timed_runs_go_in_rounds_so_drift_hits_every_mode_alike(tmp_path):
    _bench("--modes", "ar,sd", "--max-new-tokens", "3", "--repeats", "2", "--warmup", "0", "--trace", str(tmp_path))
    trace = json.loads((tmp_path / "trace.json").read_text())
    sections = [e["name"] for e in sorted((e for e in trace["traceEvents"] if e["ph"] == "X" and e["tid"] == 1),
                                          key=lambda e: e["ts"])]
    assert sections == ["ar run 1", "sd run 1", "ar run 2", "sd run 2"]


def test_first_stretch_keeps_a_panel_to_one_run_of_its_mode():
    from seed_tot.trace import _first_stretch

    class Call:
        def __init__(self, label):
            self.label = label

    calls = [Call(x) for x in ("ar", "ar", "sd", "ar", "sd", "sd")]
    assert [id(c) for c in _first_stretch(calls, "ar")] == [id(calls[0]), id(calls[1])]
    assert [id(c) for c in _first_stretch(calls, "sd")] == [id(calls[2])]


def test_concurrency_suffix_is_per_mode_and_only_for_whole_solves():
    specs = parse_modes("parallel,parallel@c4,seed@dball@vball@c3", ONE_BY_ONE)
    assert [(s.label, s.concurrency) for s in specs] == [("parallel", None), ("parallel@c4", 4),
                                                         ("seed@dball@vball@c3", 3)]
    with pytest.raises(click.BadParameter):
        parse_modes("seed@c0", ONE_BY_ONE)
    result = CliRunner().invoke(main, ["bench", "--synthetic", "tiny", "--device", "cpu", "--modes", "ar,ar@c2",
                                       "--repeats", "1"])
    assert result.exit_code != 0 and "@c" in result.output and "tot-gsm8k" in result.output


def test_concurrency_comparison_in_one_run_checks_predictions_against_parallel(tmp_path):
    out = tmp_path / "conc.json"
    stdout = _bench("--workload", "tot-gsm8k", "--data", "tests/fixtures/gsm8k_small.jsonl", "--limit", "3",
                    "--modes", "parallel,parallel@c3,seed@dball@vball@c3", "--max-new-tokens", "6",
                    "--repeats", "1", "--warmup", "0", "--json", str(out), "--output", str(tmp_path / "runs"))
    assert "predictions == parallel" in stdout and "problems/h" in stdout
    data = json.loads(out.read_text())
    assert [m["matches_ar"] for m in data["modes"]] == [True, True, True]
    assert {m["matches_reference"] for m in data["modes"]} == {"parallel"}
    for m in data["modes"]:
        assert m["problems_per_hour"] == pytest.approx(3 * 3600 / m["wall_median_s"])
    runs = sorted(p.parent.name for p in (tmp_path / "runs").glob("*/summary.json"))
    assert runs == ["parallel-1", "parallel_c3-1", "seed_dball_vball_c3-1"]
    # a spec's "all" reaches the solve as "all", not as "not given" (which meant the config's batch sizes)
    solved = json.loads((tmp_path / "runs" / "seed_dball_vball_c3-1" / "summary.json").read_text())["settings"]
    assert (solved["verify_batch"], solved["draft_batch"]) == ("all", "all")


def test_prefix_store_off_per_mode_scores_every_prompt_again_with_the_same_predictions(tmp_path):
    assert [s.prefix_cache for s in parse_modes("parallel,parallel@pc0,seed@pc0@c2", ONE_BY_ONE)] == \
        [True, False, False]
    out = tmp_path / "pc.json"
    _bench("--workload", "tot-gsm8k", "--data", "tests/fixtures/gsm8k_small.jsonl", "--limit", "2",
           "--modes", "parallel,parallel@pc0", "--max-new-tokens", "6", "--repeats", "1", "--warmup", "0",
           "--json", str(out))
    on, off = json.loads(out.read_text())["modes"]
    assert on["matches_ar"] and off["matches_ar"]
    # the second problem's few-shot text and each step's question come from the store
    assert 0 < on["prompt_tokens_scored_per_run"] < 0.8 * off["prompt_tokens_scored_per_run"]


def test_a_modes_draft_policy_is_built_before_its_first_run_so_no_timed_run_carries_a_calibration(tmp_path, monkeypatch):
    from seed_tot.bench import bench_modes
    from seed_tot.engine import cost_model

    monkeypatch.setenv("SEED_TOT_CACHE_DIR", str(tmp_path))  # no cached costs: auto calibrates
    events = []
    measure = cost_model.measure
    monkeypatch.setattr(cost_model, "measure", lambda *a, **k: events.append("calibrate") or measure(*a, **k))
    engine = build_synthetic_engine("tiny", 0.5, "cpu")
    params = SamplingParams(max_new_tokens=3, temperature=0)

    def run(eng, spec, index):
        events.append(f"{spec.label} run {index}")
        eng.generate([[1, 2, 3]], params, spec=spec.decode)

    bench_modes(engine, run, parse_modes("parallel,seed+auto", ONE_BY_ONE), repeats=2, warmup=0, params=params)
    assert events == ["parallel run 1", "calibrate", "seed+auto run 1", "parallel run 2", "seed+auto run 2"]
