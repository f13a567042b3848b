"""Greedy draft picks and sampled draws stay on the device: a draft round reads none of them
back before its next draft forward (each read would make the host wait for the device), the forwards
take rows of device tokens as they take host lists (packed, fixed-shape and stock paths alike), the
tokens read once, at the end, are the ones the policy picks or draws for the row alone, and the
device draws follow q."""
from __future__ import annotations

import asyncio
import copy
from collections import Counter

import pytest
import torch

from conftest import noisy_copy, tiny_model
from seed_tot import Engine
from seed_tot.engine import seed as seed_module
from seed_tot.engine import speculative, verify
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
from test_sampling_lossless import tv, tv_bound

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


def tied(model):
    """A copy whose LM head gives every token the logits of its even neighbour: each pick is a tie."""
    model = copy.deepcopy(model)
    with torch.no_grad():
        model.lm_head.weight[1::2] = model.lm_head.weight[0::2]
    return model.eval()


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("k_configs", [[(1, 1, 1)] * 4, [(2, 2, 1), (1, 1, 1), (3, 1), (2, 2, 1)]])
def test_a_greedy_draft_round_reads_nothing_back_and_its_picks_are_the_policys_own(draft, k_configs, ties,
                                                                                  monkeypatch):
    """...and a row picks what it picks alone, even among tied logits (torch.topk orders ties
    differently for different k, so rows of different widths must not share one top-k)."""
    draft = tied(draft) if ties else draft
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


@pytest.mark.parametrize("k_configs", [[(1, 1, 1)] * 4, [(1, 1), (1,), (1, 1, 1), (1, 1, 1, 1)],
                                       [(2, 2, 1), (1, 1, 1), (3, 1), (2, 2, 1)]])
def test_a_sampled_round_reads_nothing_back_and_draws_for_each_row_what_it_draws_alone(draft, k_configs,
                                                                                              monkeypatch):
    runtime = ModelRuntime(draft)
    vocab = draft.config.vocab_size
    reads = _CountReads(monkeypatch)
    deferred = speculative.draft_rows(runtime, _rows(k_configs, 1.0), vocab, defer_tokens=True)
    assert reads.n == 0
    trees = [tree for tree, _ in deferred]
    assert all(tree.device_tokens is not None and set(tree.tokens) == {UNREAD} for tree in trees)
    assert all(not tree.deterministic(i) for tree in trees for i in range(len(tree)))  # drawn from q, not picked
    read_tokens(trees)
    assert reads.n == 1
    # each row draws from its own generator: alone, it draws the same tokens from the same q
    for row, tree in zip(_rows(k_configs, 1.0), trees):
        alone, _ = speculative.draft_rows(runtime, [row], vocab)[0]
        assert alone.tokens == tree.tokens
        torch.testing.assert_close(alone.draft_probs, tree.draft_probs)


def test_device_draws_follow_the_draft_distribution_q():
    """Many rows of one prompt, each with its own generator, draft one token each: their tokens must
    follow q within the simulated null's TV bound, and a distribution barely different must not."""
    model = tiny_model("llama", seed=21, vocab=8)
    runtime = ModelRuntime(model)
    n = 1500
    rule = StopRule(SamplingParams(max_new_tokens=4, temperature=0.8), frozenset(), None)
    rows = [(Sequence(b, [1, 4, 2], rule, torch.Generator().manual_seed(1000 + b), draft=KVCache()), FixedPolicy((1,)))
            for b in range(n)]
    trees = [tree for tree, _ in speculative.draft_rows(runtime, rows, 8)]
    q = trees[0].draft_probs[0].double()
    exact = {(t,): float(q[t]) for t in range(8)}
    counts = Counter((tree.tokens[0],) for tree in trees)
    bound = tv_bound(exact, n)
    assert tv(counts, exact, n) < bound
    skewed = (q + 0.1 * torch.nn.functional.one_hot(q.argmin(), 8)) / 1.1  # 0.1 of the mass moved
    assert tv(counts, {(t,): float(skewed[t]) for t in range(8)}, n) > bound


def _trees(draft, params: SamplingParams, k_config):
    rule = StopRule(params, frozenset(), None)
    rows = [(Sequence(b, list(p), rule, torch.Generator().manual_seed(b), draft=KVCache()), FixedPolicy(k_config))
            for b, p in enumerate(PROMPTS)]
    return [tree for tree, _ in speculative.draft_rows(ModelRuntime(draft), rows, draft.config.vocab_size)]


def test_a_sampled_group_is_at_most_top_k_wide_so_no_node_is_drafted_without_mass(draft):
    """top_k=2 leaves q two tokens: a group of three keeps two (the third draw could only be a token
    of no mass, which the verifier always rejects), both of mass, and each still has its child."""
    for tree in _trees(draft, SamplingParams(max_new_tokens=8, temperature=1.0, top_k=2), (3, 1)):
        assert tree.parents == [-1, -1, 0, 1]
        q = tree.q(0)
        assert int((q > 0).sum()) == 2 and tree.tokens[0] != tree.tokens[1]
        assert q[tree.tokens[0]] > 0 and q[tree.tokens[1]] > 0


def test_a_sibling_group_wider_than_q_ends_in_tokens_of_no_mass_that_the_verifier_never_accepts(draft):
    """top_p leaves q a support that only the device knows: a group of three draws q's tokens, then
    tokens of no mass. The tree keeps its k_config's shape, and no verification accepts such a
    node, whatever the target says."""
    vocab = draft.config.vocab_size
    dead = 0
    for tree in _trees(draft, SamplingParams(max_new_tokens=8, temperature=0.05, top_p=0.5), (3, 1)):
        assert tree.parents == [-1, -1, -1, 0, 1, 2]
        q = tree.q(0)
        live = int((q > 0).sum())
        spent = q.clone()
        for c, token in enumerate(tree.tokens[:3]):
            assert (spent[token] > 0) == (c < live)  # q's tokens first, each once; then no mass
            spent[token] = 0
        for node in range(live, 3):
            dead += 1
            # a target that puts all its mass on the dead node's token: still never accepted
            p = torch.zeros(len(tree) + 1, vocab)
            p[0, tree.tokens[node]] = 1.0
            p[1:, 0] = 1.0
            for seed in range(20):
                acceptance = verify.decide_alone(tree, p, False, torch.Generator().manual_seed(seed))
                assert acceptance.path[:1] != [node]
    assert dead, "no group outgrew its q: the test did not reach a dead node"


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


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_seed_step_reads_the_device_once_its_verification_and_never_while_drafting(temperature, monkeypatch):
    """Everything computed from a forward's logits is marked (test_chain_acceptance's counter); a
    SEED step, greedy or sampled, chains and trees, reads marked data only in its verification's one
    transfer, which also brings the round's picks or draws: the draft forwards and the target's
    forward never wait for the device."""
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
    params = SamplingParams(max_new_tokens=8, temperature=temperature)
    k_configs = [(1, 1, 1), (2, 2, 1)]

    async def run():
        return await asyncio.gather(*(engine.agenerate(PROMPTS, params, mode="seed", k_config=k, draft_batch=None,
                                                       verify_batch=None) for k in k_configs))
    results = asyncio.run(run())
    if temperature == 0:
        reference = engine.generate(PROMPTS, params, mode="ar")
        assert [r.token_ids for r in results[0]] == [r.token_ids for r in results[1]] == [r.token_ids for r in reference]
    else:
        assert all(len(r.token_ids) == 8 for batch in results for r in batch)
        assert sum(r.stats.accepted for batch in results for r in batch) > 0  # drafts were really accepted
    assert draft_reads and set(draft_reads) == {0}
    assert score_reads and set(score_reads) == {0}  # the target's forward takes the picks as they are
    assert accept_reads and set(accept_reads) == {1}
