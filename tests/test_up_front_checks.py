"""Settings a model cannot serve are refused before any forward; settings it can serve run, and
calibrate within its limits, keyed by what it is (issue 42).

Every refusal test counts forwards with hooks on both models: a refusal that comes after prefill or
calibration is the defect these tests guard against.
"""
from __future__ import annotations

import copy
import json

import pytest
import torch
import transformers as tf

from conftest import noisy_copy, reference_greedy, tiny_model
from seed_tot import Engine, SamplingParams
from seed_tot.engine.drafters.parallelspec import ParallelDrafter
from seed_tot.engine.masks import UnsupportedAttention
from seed_tot.engine.policies.auto import cache_key, cache_path, load_costs
from seed_tot.engine.policies.opt_tree import OptTreePolicy

VOCAB = 128
PROMPTS = [[5, 6, 7], [9, 1, 4, 4, 2]]
GREEDY = SamplingParams(max_new_tokens=8, temperature=0)
_SMALL = dict(vocab_size=VOCAB, initializer_range=0.15, bos_token_id=None, eos_token_id=None, pad_token_id=None)


def _finish(model):
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.eval()


def alibi_model(arch: str):
    torch.manual_seed(0)
    if arch == "bloom":
        return _finish(tf.BloomForCausalLM(tf.BloomConfig(**_SMALL, hidden_size=64, n_layer=2, n_head=4)))
    return _finish(tf.FalconForCausalLM(tf.FalconConfig(**_SMALL, hidden_size=64, num_hidden_layers=2,
                                                        num_attention_heads=4, alibi=True,
                                                        new_decoder_architecture=False, parallel_attn=True)))


def gpt2(positions: int):
    torch.manual_seed(0)
    return _finish(tf.GPT2LMHeadModel(tf.GPT2Config(**_SMALL, n_embd=64, n_layer=2, n_head=4, n_positions=positions)))


class ForwardCounter:
    """Counts forwards of the given models (forward hooks on each whole model)."""

    def __init__(self, *models):
        self.count = 0
        self.handles = [m.register_forward_hook(self._hook) for m in models]

    def _hook(self, module, args, output) -> None:
        self.count += 1

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """An empty calibration cache for this test alone: a cached entry would hide a calibration."""
    monkeypatch.setenv("SEED_TOT_CACHE_DIR", str(tmp_path))
    return tmp_path


@pytest.fixture(scope="module", params=["bloom", "falcon-alibi"])
def alibi_engines(request):
    """An ALiBi target with a draft model, and the same target with a ParallelSpec drafter."""
    target = alibi_model(request.param)
    torch.manual_seed(1)
    drafter = ParallelDrafter(target, n_masks=2, n_layers=1).eval()
    return Engine(target, noisy_copy(target, 0.003), vocab_size=VOCAB), Engine(target, drafter, vocab_size=VOCAB)


# mode, k_config, policy, options, whether the ParallelSpec engine runs it
TREE_POLICIES = [
    ("seed", (1, 1, 1), "opt-tree", {}, False),  # the example: a SeedError after prefill
    ("sd", (1, 1, 1), "opt-tree", {}, False),
    ("mcsd", (1, 1), "opt-tree", {"n": "auto"}, False),  # n=auto calibrates: forwards unless refused first
    ("seed", (1, 1), "opt-tree", {"n": "auto", "delta": "auto"}, False),
    ("sd", (1, 1), "parallelspec", {"lookup": "3"}, True),  # a lookup guess grafted beside the drafted chain
    ("seed", (1, 1), "parallelspec", {"passes": "2"}, True),  # a drafted node fed after the masks
    ("seed", (2, 1), "parallelspec", {"cut": "cost"}, True),  # a tree k_config, and cut=cost calibrates
]


@pytest.mark.parametrize("mode,k_config,policy,options,parallelspec", TREE_POLICIES, ids=lambda v: str(v))
def test_tree_policies_on_alibi_models_are_refused_before_any_forward(alibi_engines, own_cache, mode, k_config,
                                                                       policy, options, parallelspec):
    engine = alibi_engines[1 if parallelspec else 0]
    counter = ForwardCounter(engine.target, engine.draft)
    try:
        with pytest.raises(UnsupportedAttention, match=rf"ALiBi.*draft policy '{policy}', whose rounds may draft "
                                                       rf"trees.*Policies that draft chains"):
            engine.generate(PROMPTS, GREEDY, mode=mode, k_config=k_config, draft_policy=policy,
                            policy_options=options)
    finally:
        counter.remove()
    assert counter.count == 0
    assert not cache_path().exists()  # nothing calibrated either


def test_a_tree_policy_object_on_an_alibi_model_is_refused_before_any_forward(alibi_engines):
    engine = alibi_engines[0]
    counter = ForwardCounter(engine.target, engine.draft)
    try:
        for mode in ("sd", "seed"):
            with pytest.raises(UnsupportedAttention, match="draft policy 'opt-tree'"):
                engine.generate(PROMPTS, GREEDY, mode=mode, draft_policy=OptTreePolicy(n=4))
    finally:
        counter.remove()
    assert counter.count == 0


# policies whose rounds are chains: exact on ALiBi models, so they must not be refused
CHAIN_POLICIES = [
    ("sd", "auto", {}, False), ("seed", "auto", {}, False), ("seed", "lookup", {}, False),
    ("sd", "opt-tree", {"n": "1"}, False), ("seed", "fixed", {}, False), ("sd", "parallelspec", {}, True),
]


@pytest.mark.parametrize("mode,policy,options,parallelspec", CHAIN_POLICIES, ids=lambda v: str(v))
def test_chain_policies_on_alibi_models_run_and_equal_the_target_alone(alibi_engines, mode, policy, options,
                                                                       parallelspec):
    engine = alibi_engines[1 if parallelspec else 0]
    out = engine.generate(PROMPTS, GREEDY, mode=mode, k_config=(1, 1, 1), draft_policy=policy, policy_options=options)
    assert [r.token_ids for r in out] == [reference_greedy(engine.target, p, GREEDY.max_new_tokens) for p in PROMPTS]


@pytest.mark.parametrize("mode,policy,options", [("sd", "auto", {}), ("seed", "auto", {}),
                                                 ("sd", "opt-tree", {"n": "auto", "delta": "auto"})])
def test_calibration_fits_a_learned_position_table_shorter_than_128(own_cache, mode, policy, options):
    target = gpt2(positions=100)  # calibrating at 64 context + 64 query tokens would index past its table
    engine = Engine(target, noisy_copy(target, 0.003), vocab_size=VOCAB)
    params = SamplingParams(max_new_tokens=12, temperature=0)
    prompts = [[5, 6, 7, 8], [3, 1, 2]]
    out = engine.generate(prompts, params, mode=mode, draft_policy=policy, policy_options=options)
    assert [r.token_ids for r in out] == [reference_greedy(target, p, params.max_new_tokens) for p in prompts]
    assert cache_path().is_file()  # it did calibrate (nothing was cached before)


def test_costs_calibrated_within_a_short_position_table_are_read_back_not_measured_again(own_cache):
    target = gpt2(positions=40)
    engine = Engine(target, noisy_copy(target, 0.003), vocab_size=VOCAB)
    first = load_costs(engine)
    assert first.target_points[-1][0] < 40  # the sizes that fit, not the full 64
    counter = ForwardCounter(engine.target, engine.draft)
    try:
        again = load_costs(engine)
    finally:
        counter.remove()
    assert again == first and counter.count == 0


def _calibrations(engine) -> int:
    """Forwards that load_costs runs for `engine` (0: its costs came from the cache)."""
    counter = ForwardCounter(engine.target, engine.draft)
    try:
        load_costs(engine)
    finally:
        counter.remove()
    return counter.count


def test_different_models_never_share_a_calibration_entry(own_cache, llama_pair):
    target, draft = llama_pair
    deeper = tiny_model("llama", seed=0, layers=3)
    other_arch = tiny_model("qwen2", seed=0)  # the same shapes as the Llama: only the class differs
    engines = [Engine(target, draft), Engine(deeper, draft), Engine(other_arch, draft), Engine(target, deeper)]
    assert len({cache_key(e) for e in engines}) == len(engines)
    half = Engine(copy.deepcopy(target).to(torch.bfloat16), copy.deepcopy(draft).to(torch.bfloat16))
    assert cache_key(half) != cache_key(engines[0])  # dtype
    # all named "target"/"draft", as Engine(model, draft) names every pair: each still measures its own
    assert all(_calibrations(e) > 0 for e in engines[:2])
    assert len(json.loads(cache_path().read_text())) == 2


def test_the_same_model_shares_its_entry_whatever_its_engine_is_named(own_cache, llama_pair, tmp_path):
    target, draft = llama_pair
    engine = Engine(target, draft)
    assert _calibrations(engine) > 0
    engine.generate(PROMPTS, GREEDY, mode="sd")  # running the models leaves their key as it was
    assert _calibrations(Engine(target, draft)) == 0
    # a copy with other weights and other names: the same architecture and shapes cost the same
    renamed = Engine(noisy_copy(target, 0.01), copy.deepcopy(draft), target_name="mine", draft_name="small")
    assert _calibrations(renamed) == 0
    # the same model saved and loaded again (its config then names a path and architectures)
    target.save_pretrained(tmp_path / "t")
    draft.save_pretrained(tmp_path / "d")
    loaded = Engine(tf.AutoModelForCausalLM.from_pretrained(tmp_path / "t"),
                    tf.AutoModelForCausalLM.from_pretrained(tmp_path / "d"))
    assert cache_key(loaded) == cache_key(renamed) and _calibrations(loaded) == 0


def test_a_cache_file_keyed_by_display_names_is_neither_reused_nor_broken(own_cache, llama_pair):
    old_key = f"target|draft|{llama_pair[0].device}|{llama_pair[0].dtype}"
    points = [[n, 9.0] for n in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)]
    old_entry = {"target_fixed_s": 9.0, "target_per_token_s": 0.0, "draft_step_s": 9.0,
                 "target_points": points, "draft_points": [[n, 9.0] for n in (1, 2, 4, 8, 16, 32)]}
    cache_path().write_text(json.dumps({old_key: old_entry}))
    costs = load_costs(Engine(*llama_pair))
    assert costs.draft_step_s != 9.0 and costs.target(1) != 9.0  # measured for this pair, not borrowed
    cached = json.loads(cache_path().read_text())
    assert cached[old_key] == old_entry and len(cached) == 2


def test_all_is_accepted_for_seed_batches_and_means_every_one(llama_pair):
    engine = Engine(*llama_pair)
    assert engine.resolve_batches("seed", "all", "all") == (None, None)
    assert engine.resolve_batches("seed", "all", 2) == (None, 2)
    every = engine.generate(PROMPTS, GREEDY, mode="seed", verify_batch="all", draft_batch="all")
    assert [r.token_ids for r in every] == [reference_greedy(engine.target, p, GREEDY.max_new_tokens) for p in PROMPTS]
    # and for the modes without SEED batches, as "auto" is
    assert [r.token_ids for r in engine.generate(PROMPTS, GREEDY, mode="sd", verify_batch="all",
                                                 draft_batch="all")] == [r.token_ids for r in every]


def test_all_is_refused_before_any_forward_where_batches_are_not_exact(alibi_engines):
    engine = alibi_engines[0]
    counter = ForwardCounter(engine.target, engine.draft)
    try:
        for batches in (dict(verify_batch="all"), dict(draft_batch="all")):
            with pytest.raises(UnsupportedAttention, match="ALiBi"):
                engine.generate(PROMPTS, GREEDY, mode="seed", **batches)
    finally:
        counter.remove()
    assert counter.count == 0


def test_an_unknown_batch_word_is_refused_naming_the_accepted_ones(llama_pair):
    with pytest.raises(ValueError, match="None or 'all'.*'auto'"):
        Engine(*llama_pair).generate(PROMPTS, GREEDY, mode="seed", verify_batch="every")


def test_cancelling_an_async_static_parallel_call_stops_its_batch():
    """parallel on an ALiBi target runs as one static batch in a thread, which no cancel reaches: the
    cancelled call's batch ends at its next step instead of decoding its whole budget."""
    import asyncio
    import time
    target = alibi_model("bloom")
    engine = Engine(target, vocab_size=VOCAB)
    counter = ForwardCounter(target)
    budget = 4000

    async def cancel_soon():
        task = asyncio.create_task(engine.agenerate([[1, 2, 3], [4, 5]], SamplingParams(max_new_tokens=budget),
                                                    mode="parallel"))
        while counter.count < 3:  # the batch is decoding
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        asyncio.run(cancel_soon())  # asyncio.run waits for the default executor's threads at its end
        stopped_at = counter.count
        time.sleep(0.2)
        assert counter.count == stopped_at < budget // 4
    finally:
        counter.remove()
