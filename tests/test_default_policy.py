"""Which draft policy a call runs when it names none, and which machine a calibration belongs to."""
from __future__ import annotations

import pytest

from conftest import noisy_copy, reference_greedy
from seed_tot import Engine, SamplingParams
from seed_tot.engine import cost_model
from seed_tot.engine.drafters.parallelspec import ParallelDrafter
from seed_tot.engine.policies import default_policy_name
from seed_tot.engine.policies.auto import AutoPolicy
from seed_tot.engine.policies.fixed import FixedPolicy

pytestmark = pytest.mark.seed_default_policy  # the product's default, not the other tests' fixed chains

GREEDY = SamplingParams(max_new_tokens=12, temperature=0)
PROMPT = [5, 17, 42, 9, 3, 77, 12]


def test_seed_on_a_cpu_with_a_draft_model_and_a_chain_runs_choose_and_keeps_greedy_output(llama_pair):
    from seed_tot.engine.policies.choose import ChoosePolicy
    engine = Engine(*llama_pair)
    assert engine.policy_name(None, "seed", (1, 1, 1)) == "choose"
    policy = engine.policy("seed", (1, 1, 1), GREEDY)
    assert isinstance(policy, ChoosePolicy) and policy.uses_draft_model  # the draft model's chains are one of its sources
    result = engine.generate([PROMPT], GREEDY, mode="seed")[0]
    assert result.token_ids == reference_greedy(llama_pair[0], PROMPT, 12)


def test_seed_on_a_cpu_with_models_that_cannot_score_trees_runs_auto_and_keeps_greedy_output():
    """choose may graft two branches (a tree), which an ALiBi model cannot score: the default there is
    auto, which drafts chains, rather than a refusal of the call that named no policy."""
    from test_up_front_checks import VOCAB as ALIBI_VOCAB, alibi_model
    target = alibi_model("bloom")
    engine = Engine(target, noisy_copy(target, 0.003), vocab_size=ALIBI_VOCAB)
    assert engine.policy_name(None, "seed", (1, 1, 1)) == "auto"
    assert isinstance(engine.policy("seed", (1, 1, 1), GREEDY), AutoPolicy)
    result = engine.generate([PROMPT], GREEDY, mode="seed")[0]
    assert result.token_ids == reference_greedy(target, PROMPT, 12)
    assert default_policy_name("seed", (1, 1, 1), "cpu", trees=False) == "auto"


@pytest.mark.parametrize("mode, k_config", [("sd", (1, 1, 1)), ("mcsd", (2, 2, 1)), ("seed", (2, 2, 1))])
def test_the_baselines_and_a_tree_shape_asked_for_keep_the_fixed_policy(llama_pair, mode, k_config):
    engine = Engine(*llama_pair)
    assert engine.policy_name(None, mode, k_config) == "fixed"
    assert isinstance(engine.policy(mode, k_config, GREEDY), FixedPolicy)


def test_seed_on_a_gpu_keeps_fixed_chains_until_a_gpu_run_measures_choose_there():
    assert default_policy_name("seed", (1, 1, 1), "cpu") == "choose"
    assert default_policy_name("seed", (1, 1, 1), "cuda") == "fixed"
    assert default_policy_name("seed", (2, 1), "cpu") == default_policy_name("sd", (1, 1), "cpu") == "fixed"


def test_a_named_policy_and_a_drafters_own_default_come_before_the_devices(llama_pair):
    engine = Engine(*llama_pair)
    assert engine.policy_name("fixed", "seed", (1, 1, 1)) == "fixed"
    target = llama_pair[0]
    drafter = Engine(target, ParallelDrafter(target, n_masks=2, n_layers=1).eval())
    assert drafter.policy_name(None, "seed", (1, 1, 1)) == "choose"
    lookup = Engine(target, None)
    lookup.default_policy = "lookup"  # what from_pretrained(draft="lookup") sets
    assert lookup.policy_name(None, "seed", (1, 1, 1)) == "lookup"


def _cpuinfo(path, flags: str) -> None:
    path.write_text(f"processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: {flags}\n\n"
                    f"processor\t: 1\nmodel name\t: AMD EPYC\nflags\t\t: {flags}\n", encoding="utf-8")


def test_two_cpus_of_one_name_and_host_but_other_instruction_sets_never_share_costs(tmp_path, monkeypatch, llama_pair):
    """Virtual machines share a host name ("vm"), and an AVX2 machine's forwards take up to 1.7x an
    AVX-512 one's: a cache directory carried between them must not hand one the other's costs."""
    engine = Engine(*llama_pair)
    info = tmp_path / "cpuinfo"
    monkeypatch.setattr(cost_model, "CPUINFO", info)
    _cpuinfo(info, "fpu sse2 avx avx2 fma")
    avx2 = cost_model.cache_key(engine)
    _cpuinfo(info, "fpu sse2 avx avx2 fma avx512f avx512bw")
    avx512 = cost_model.cache_key(engine)
    assert avx2 != avx512 and "AMD EPYC" in avx2
    _cpuinfo(info, "fpu sse2 avx avx2 fma")
    assert cost_model.cache_key(engine) == avx2  # the same machine keeps its entry
    monkeypatch.setattr(cost_model, "CPUINFO", tmp_path / "absent")  # not Linux: what platform names
    monkeypatch.setattr(cost_model.platform, "processor", lambda: "Apple M2")
    assert "/Apple M2/" in cost_model.cache_key(engine)


def test_a_parallelspec_drafter_runs_choose_with_its_rounds_options_and_keeps_greedy_output(llama_pair):
    """The embedded default's kind of drafter: `choose` drafts its rounds with the drafter (parallelspec
    rounds, whose cut, passes and lookup choose passes on) or the search's text, both or neither."""
    from seed_tot.engine.policies.choose import ChoosePolicy
    target = llama_pair[0]
    engine = Engine(target, ParallelDrafter(target, n_masks=2, n_layers=1).eval())
    policy = engine.policy("seed", (1, 1, 1), GREEDY)
    assert isinstance(policy, ChoosePolicy) and policy.model is not None
    options = {"lookup": "0", "cut": "none", "passes": "2"}
    named = engine.policy("seed", (1, 1, 1), GREEDY, "choose", options)
    assert (named.model.lookup, named.model.costs, named.model.passes) == (0, None, 2)
    for mode in ("sd", "seed"):
        for policy_options in (None, options):
            result = engine.generate([PROMPT], GREEDY, mode=mode, policy_options=policy_options)[0]
            assert result.token_ids == reference_greedy(target, PROMPT, 12)


def test_a_drafters_round_options_without_such_a_drafter_are_refused_before_any_forward(llama_pair):
    engine = Engine(*llama_pair)
    with pytest.raises(ValueError, match="option lookup applies to a ParallelSpec drafter's rounds"):
        engine.generate([PROMPT], GREEDY, mode="seed", draft_policy="choose", policy_options={"lookup": "2"})
    with pytest.raises(ValueError, match="option cut='deep' must be one of none, cost"):
        engine.generate([PROMPT], GREEDY, mode="seed", draft_policy="choose", policy_options={"cut": "deep"})
