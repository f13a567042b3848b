"""Greedy draft picks stay on the device: a draft round reads none of them back before its next draft
forward (each read would make the host wait for the device), the forwards take rows of device tokens
as they take host lists (packed, fixed-shape and stock paths alike), and the tokens read once, at the
end, are the ones the policy picks alone."""
from __future__ import annotations

import asyncio

import pytest
import torch

from conftest import noisy_copy, tiny_model
from seed_tot import Engine
from seed_tot.engine import seed as seed_module
from seed_tot.engine import speculative
from seed_tot.engine.draft_tree import UNREAD, read_tokens
from seed_tot.engine.graphed_forward import Buckets
from seed_tot.engine.kv_cache import KVCache, forward_batch
from seed_tot.engine.model_runtime import ModelRuntime
from seed_tot.engine.params import SamplingParams
from seed_tot.engine.policies import FixedPolicy
from seed_tot.engine.sequence import Sequence, StopRule
from test_attention_types import build
from test_kv_layout import prefill
from test_chain_acceptance import _on_device_marker

PROMPTS = [[4, 4, 2], [9], [3, 1, 4, 1, 5, 9, 2, 6], [7, 7]]


@pytest.fixture(scope="module")
def draft():
    return noisy_copy(tiny_model("qwen2", seed=7), 0.005)


def _rows(k_configs, temperature: float = 0.0):
    rule = StopRule(SamplingParams(max_new_tokens=16, temperature=temperature), frozenset(), None)
    return [(Sequence(b, list(p), rule, torch.Generator().manual_seed(b), draft=KVCache()), FixedPolicy(k))
            for b, (p, k) in enumerate(zip(PROMPTS, k_configs))]


class _CountReads:
    """Counts Tensor.tolist / Tensor.item calls (each a wait for the device on a GPU)."""

    def __init__(self, monkeypatch):
        self.n = 0
        for name in ("tolist", "item"):
            real = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, self._counted(real))

    def _counted(self, real):
        def read(tensor, *args, **kwargs):
            self.n += 1
            return real(tensor, *args, **kwargs)
        return read


@pytest.mark.parametrize("k_configs", [[(1, 1, 1)] * 4, [(2, 2, 1), (1, 1, 1), (3, 1), (2, 2, 1)]])
def test_a_greedy_draft_round_reads_nothing_back_and_its_picks_are_the_policys_own(draft, k_configs, monkeypatch):
    runtime = ModelRuntime(draft)
    vocab = draft.config.vocab_size
    host = [tree for tree, _ in speculative.draft_rows(runtime, _rows(k_configs), vocab)]
    reads = _CountReads(monkeypatch)
    deferred = [tree for tree, _ in speculative.draft_rows(runtime, _rows(k_configs), vocab, defer_tokens=True)]
    assert reads.n == 0
    assert all(tree.device_tokens is not None and set(tree.tokens) == {UNREAD} for tree in deferred)
    read_tokens(deferred)
    assert reads.n == 1  # every row's picks in one transfer
    assert [(t.tokens, t.parents) for t in deferred] == [(t.tokens, t.parents) for t in host]
    alone = [speculative.draft_rows(runtime, [row], vocab)[0][0] for row in _rows(k_configs)]
    assert [t.tokens for t in alone] == [t.tokens for t in host]


def test_sampled_rows_keep_drawing_on_the_host_from_their_own_generators(draft):
    runtime = ModelRuntime(draft)
    trees = [tree for tree, _ in speculative.draft_rows(runtime, _rows([(2, 1)] * 4, 1.0),
                                                        draft.config.vocab_size, defer_tokens=True)]
    assert all(tree.device_tokens is None and UNREAD not in tree.tokens for tree in trees)


@pytest.mark.parametrize("arch", ["llama", "mistral-sliding", "falcon-mqa"])
@pytest.mark.parametrize("fixed", [False, True])
@torch.inference_mode()
def test_rows_of_device_tokens_score_as_host_lists_do(arch, fixed):
    if fixed and arch == "falcon-mqa":
        pytest.skip("the copying fallback has no fixed shapes")
    model = build(arch) if arch != "llama" else tiny_model("llama", seed=3)
    runtime = ModelRuntime(model)
    prompts = [[3, 5, 7, 9], [4, 6], [1, 2, 3, 4, 5, 6]]
    tokens = [[10, 11, 12], [13], [14, 15]]
    parents = [[-1, 0, 0], [-1], [-1, 0]]
    shapes = Buckets() if fixed else False
    want = forward_batch(runtime, [prefill(runtime, p) for p in prompts], tokens, parents, fixed_shapes=shapes)
    mixed = [tokens[0], torch.tensor(tokens[1]), torch.tensor(tokens[2])]  # host and device rows together
    got = forward_batch(runtime, [prefill(runtime, p) for p in prompts], mixed, parents, fixed_shapes=shapes)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    alone = prefill(runtime, prompts[0])
    torch.testing.assert_close(alone.forward(runtime, torch.tensor(tokens[0]), parents[0]), want[0],
                               rtol=1e-5, atol=1e-5)


def test_a_greedy_seed_step_reads_the_device_once_its_verification_and_never_while_drafting(monkeypatch):
    """Everything computed from a forward's logits is marked (test_chain_acceptance's counter); a
    greedy SEED step reads marked data only in its verification's one transfer, which also brings the
    round's picks: the draft forwards and the target's forward never wait for the device."""
    target = tiny_model("qwen2", seed=7)
    engine = Engine(target, noisy_copy(target, 0.005))
    reads = [0]
    on_device = _on_device_marker(reads)
    real_forward_rows = speculative.forward_rows
    draft_reads, score_reads, accept_reads = [], [], []

    def marked_forward_rows(*args, **kwargs):
        return [logits.as_subclass(on_device) for logits in real_forward_rows(*args, **kwargs)]

    def counted(real, into):
        def run(*args, **kwargs):
            before = reads[0]
            out = real(*args, **kwargs)
            into.append(reads[0] - before)
            return out
        return run

    monkeypatch.setattr(speculative, "forward_rows", marked_forward_rows)
    for name, into in (("draft_rows", draft_reads), ("score_rows", score_reads), ("accept_rows", accept_reads)):
        monkeypatch.setattr(seed_module, name, counted(getattr(seed_module, name), into))
    params = SamplingParams(max_new_tokens=8, temperature=0)

    async def run():
        return await asyncio.gather(*(engine.agenerate(PROMPTS, params, mode="seed", k_config=k, draft_batch=None,
                                                       verify_batch=None) for k in [(1, 1, 1), (2, 2, 1)]))
    results = asyncio.run(run())
    reference = engine.generate(PROMPTS, params, mode="ar")
    assert [r.token_ids for r in results[0]] == [r.token_ids for r in results[1]] == [r.token_ids for r in reference]
    assert draft_reads and set(draft_reads) == {0}
    assert score_reads and set(score_reads) == {0}  # the target's forward takes the picks as they are
    assert accept_reads and set(accept_reads) == {1}
