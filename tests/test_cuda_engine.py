"""The engine on CUDA: every mode, through the step loop and the CUDA-graph forwards, gives the
target's own greedy tokens. Skipped where there is no CUDA device (CI's CPU); a GPU machine runs it."""
from __future__ import annotations

import warnings

import pytest
import torch

from conftest import noisy_copy, reference_greedy, tiny_model
from seed_tot import Engine, SamplingParams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

MODES = [dict(mode="ar"), dict(mode="parallel"), dict(mode="sd", k_config=(1, 1, 1)),
         dict(mode="mcsd", k_config=(2, 2, 1)), dict(mode="seed", k_config=(1, 1, 1)),
         dict(mode="seed", k_config=(2, 1), verify_batch=1, draft_batch=1)]


@pytest.fixture(scope="module")
def cuda_pair():
    target = tiny_model("llama", seed=11)
    draft = noisy_copy(target, 0.01)
    prompts = [[3, 1, 4, 1, 5], [9, 2, 6], [5, 3, 5, 8, 9, 7, 9], [3, 1, 4, 1, 5]]
    refs = [reference_greedy(target, p, 24) for p in prompts]  # on the CPU: the reference
    return target.cuda(), draft.cuda(), prompts, refs


@pytest.mark.parametrize("settings", MODES, ids=lambda s: "-".join(str(v) for v in s.values()))
def test_every_mode_on_cuda_gives_the_targets_greedy_tokens(cuda_pair, settings):
    target, draft, prompts, refs = cuda_pair
    results = Engine(target, draft).generate(prompts, SamplingParams(max_new_tokens=24, temperature=0), **settings)
    assert [r.token_ids for r in results] == refs


def test_sampled_rows_on_cuda_do_not_depend_on_what_shares_their_forwards(cuda_pair):
    target, draft, prompts, _ = cuda_pair
    params = SamplingParams(max_new_tokens=16, temperature=0.8, seed=4)
    engine = Engine(target, draft)
    together = engine.generate(prompts, params, mode="seed", k_config=(1, 1))
    alone = engine.generate(prompts, params, mode="sd", k_config=(1, 1))
    assert [r.token_ids for r in together] == [r.token_ids for r in alone]


@pytest.mark.parametrize("policy", ["fixed", "opt-tree"])
def test_sampled_drafting_on_cuda_draws_from_each_sequences_host_generator(cuda_pair, policy):
    """A sequence's generator lives on the host; drafting from a distribution on the GPU must still
    draw from it (torch refuses a generator of another device), trees included."""
    target, draft, prompts, _ = cuda_pair
    params = SamplingParams(max_new_tokens=12, temperature=0.9, seed=2)
    k_config = (2, 1)
    results = Engine(target, draft).generate(prompts, params, mode="seed", k_config=k_config, draft_policy=policy)
    assert all(len(r.token_ids) == 12 for r in results)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_on_cuda_a_seed_step_synchronises_only_in_its_verification(cuda_pair, temperature, monkeypatch):
    """torch's sync debug mode flags every call that makes the host wait for the GPU: drafting and the
    target's forward make none (their picks and draws stay on the device), each verification one."""
    from seed_tot.engine import seed as seed_module

    target, draft, prompts, _ = cuda_pair
    syncs: dict[str, list[int]] = {"draft_rows": [], "score_rows": [], "accept_rows": []}

    def counted(real, into):
        def run(*args, **kwargs):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    return real(*args, **kwargs)
                finally:
                    torch.cuda.set_sync_debug_mode("default")
                    into.append(sum("called a synchronizing" in str(w.message) for w in caught))
        return run

    params = SamplingParams(max_new_tokens=12, temperature=temperature, seed=3)
    engine = Engine(target, draft)

    def run():
        for k_config in [(1, 1, 1), (2, 2, 1)]:
            engine.generate(prompts, params, mode="seed", k_config=k_config, draft_batch=None, verify_batch=None)
    run()  # the first steps capture their buckets' graphs and grow the pools: both synchronise, once
    for name, into in syncs.items():
        monkeypatch.setattr(seed_module, name, counted(getattr(seed_module, name), into))
    run()
    assert syncs["draft_rows"] and set(syncs["draft_rows"]) == {0}, syncs
    assert syncs["score_rows"] and set(syncs["score_rows"]) == {0}, syncs
    assert syncs["accept_rows"] and set(syncs["accept_rows"]) == {1}, syncs


def test_on_cuda_a_greedy_row_picks_among_tied_logits_what_it_picks_alone(cuda_pair):
    """torch.topk on CUDA may choose its algorithm by the number of rows: a row batched with others
    must still pick among tied logits what it picks alone (the policies run one top-k per width)."""
    from seed_tot.engine import speculative
    from seed_tot.engine.model_runtime import ModelRuntime
    from test_device_picks import _rows, tied

    _, draft, _, _ = cuda_pair
    draft = tied(draft)  # every token ties its even neighbour
    runtime = ModelRuntime(draft)
    vocab = draft.config.vocab_size
    k_configs = [(2, 2, 1), (2, 2, 1), (3, 1), (2, 2, 1)]
    together = [tree for tree, _ in speculative.draft_rows(runtime, _rows(k_configs), vocab)]
    alone = [speculative.draft_rows(runtime, [row], vocab)[0][0] for row in _rows(k_configs)]
    assert [(t.tokens, t.parents) for t in together] == [(t.tokens, t.parents) for t in alone]


@pytest.mark.parametrize("overlap", [True, False])
def test_on_cuda_both_schedules_give_the_targets_greedy_tokens_and_drafts_run_on_their_stream(cuda_pair, overlap,
                                                                                              monkeypatch):
    """Overlapped (the CUDA default), the draft rounds run on the draft stream (draft_stream.py) and the
    tokens are the target's own; in turn, on the target's stream, the same tokens."""
    from seed_tot.engine import seed as seed_module

    target, draft, prompts, refs = cuda_pair
    engine = Engine(target, draft)
    assert engine.scheduler.overlap  # the default on CUDA
    engine.scheduler.overlap = overlap
    streams = []
    real = seed_module.draft_rows

    def draft_rows(*args, **kwargs):
        streams.append(torch.cuda.current_stream(target.device))
        return real(*args, **kwargs)

    monkeypatch.setattr(seed_module, "draft_rows", draft_rows)
    for k_config in [(1, 1, 1), (2, 2, 1)]:
        results = engine.generate(prompts, SamplingParams(max_new_tokens=24, temperature=0), mode="seed",
                                  k_config=k_config, draft_policy="fixed")
        assert [r.token_ids for r in results] == refs
    default = torch.cuda.default_stream(target.device)
    assert streams and all((stream != default) == overlap for stream in streams)
