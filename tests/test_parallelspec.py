"""ParallelSpec drafter: the training layout is the inference forward, one draft forward per round,
the drafter's cache never keeps a mask entry, greedy output is the target's, loading checks the target."""
from __future__ import annotations

import pytest
import torch

from conftest import reference_greedy, tiny_model
from seed_tot import Engine, SamplingParams
from seed_tot.engine.drafters import ParallelDrafter, load_drafter, save_drafter
from seed_tot.engine.kv_cache import KVCache
from seed_tot.engine.speculative import draft_round, prefill, verify_round
from seed_tot.training.drafter_train import group_batch, group_logits

PROMPT = [3, 17, 42, 8, 61, 5]


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", seed=3)


@pytest.fixture(scope="module")
def drafter(target):
    torch.manual_seed(0)
    return ParallelDrafter(target, n_masks=3, n_layers=1).eval()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@torch.no_grad()
def test_training_forward_at_every_group_equals_inference_on_context_and_masks(arch):
    target = tiny_model(arch, seed=5)
    drafter = ParallelDrafter(target, n_masks=3, n_layers=1).eval()
    tokens = torch.randint(0, 96, (12,), generator=torch.Generator().manual_seed(1)).tolist()
    anchors = list(range(len(tokens) - 1))
    trained = group_logits(drafter, group_batch(drafter, tokens, anchors))  # [G, k+1, V]
    for g, t in enumerate(anchors):
        for j in range(drafter.n_masks + 1):  # j = 0: q_1 at x_t itself; j >= 1: MASK_j
            ids = tokens[: t + 1] + [drafter.mask_id(i) for i in range(1, j + 1)]
            inference = drafter(input_ids=torch.tensor([ids])).logits[0, -1]
            torch.testing.assert_close(trained[g, j], inference, atol=2e-5, rtol=1e-4)
    # the masks really change the output (a layout that ignored them would pass the loop trivially)
    assert not torch.allclose(trained[:, 0], trained[:, 1], atol=1e-3)


def assert_drafter_cache_is_a_fresh_prefill(runtime, seq) -> None:
    """After a verification the drafter's cache holds no mask or rejected entry: it equals a prefill
    of the sequence's committed tokens (through the drafter's runtime)."""
    assert seq.draft.parents == [] and seq.draft.committed == len(seq.tokens) - len(seq.pending(seq.draft))
    fresh = KVCache()
    prefill(runtime, fresh, seq.tokens[: seq.draft.committed + 1])
    for mine, ref in zip(seq.draft.cache.layers, fresh.cache.layers):
        torch.testing.assert_close(mine.keys, ref.keys, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(mine.values, ref.values, atol=1e-5, rtol=1e-4)


def test_one_draft_forward_per_round_and_the_drafter_cache_equals_a_fresh_prefill(target, drafter):
    calls = []
    handle = drafter.register_forward_pre_hook(lambda module, args, kwargs: calls.append(1), with_kwargs=True)
    try:
        engine = Engine(target, drafter)
        params = SamplingParams(max_new_tokens=24, temperature=0)
        seqs, k_config = engine._start([PROMPT], params, "sd", (1, 1, 1, 1))
        seq, policy = seqs[0], engine.policy("sd", k_config, params, "parallelspec")
        rounds = 0
        while not seq.done:
            calls.clear()
            tree, node_entry = draft_round(engine.draft_runtime, seq, policy, params, engine.vocab_size)
            assert len(calls) == 1 and tree.depth() == min(4, params.max_new_tokens - len(seq.generated))
            verify_round(engine.target_runtime, seq, tree, params, engine.vocab_size, node_entry)
            rounds += 1
            assert_drafter_cache_is_a_fresh_prefill(engine.draft_runtime, seq)
        assert seq.stats.draft_forwards == rounds == seq.stats.verifications
    finally:
        handle.remove()


@pytest.mark.parametrize("mode,k_config,batch", [("sd", (1,), 1), ("mcsd", (2, 2), 1), ("seed", (1,), 1),
                                                 ("seed", (2, 2), None)])
def test_greedy_output_equals_the_target_alone_with_an_untrained_drafter(target, drafter, mode, k_config, batch):
    prompts = [PROMPT, [9, 1, 77], PROMPT[::-1]]
    params = SamplingParams(max_new_tokens=20, temperature=0)
    results = Engine(target, drafter).generate(prompts, params, mode=mode, k_config=k_config, draft_batch=batch,
                                               verify_batch=batch)
    for prompt, result in zip(prompts, results):
        assert result.token_ids == reference_greedy(target, prompt, 20)
    assert sum(r.stats.draft_forwards for r in results) <= sum(r.stats.verifications for r in results)


def test_a_tree_draws_depth_t_nodes_from_q_t(target, drafter):
    """Greedy tree (2,2): depth t's candidates are q_t's top-2, whatever their parent."""
    engine = Engine(target, drafter)
    params = SamplingParams(max_new_tokens=8, temperature=0)
    seqs, _ = engine._start([PROMPT], params, "seed", (2, 2))
    feed_logits = drafter(input_ids=torch.tensor([PROMPT + [drafter.mask_id(j) for j in (1, 2, 3)]])).logits[0]
    # named: the drafter's default, choose, would draft this round only where this machine's timings say it pays
    policy = engine.policy("seed", (2, 2), params, "parallelspec")
    tree, node_entry = draft_round(engine.draft_runtime, seqs[0], policy, params,
                                   engine.vocab_size)
    assert node_entry == {} and tree.depth() == 4 and len(tree) == 2 + 4 + 4 + 4
    depth = [0] * len(tree)
    for i, p in enumerate(tree.parents):
        depth[i] = 1 + (depth[p] if p >= 0 else 0)
    for i, tok in enumerate(tree.tokens):
        q_t = feed_logits[len(PROMPT) - 2 + depth[i]]
        width = 2 if depth[i] <= 2 else 1
        assert tok in torch.topk(q_t, width).indices.tolist()


def test_parallelspec_policy_needs_a_drafter_with_masks(target):
    engine = Engine(target, ParallelDrafter(target, n_masks=0))
    with pytest.raises(ValueError, match="needs a ParallelSpec drafter"):
        engine.generate([PROMPT], SamplingParams(max_new_tokens=4), mode="sd", draft_policy="parallelspec")


def test_a_saved_drafter_loads_with_its_weights_and_refuses_other_targets(tmp_path, target, drafter):
    save_drafter(drafter, tmp_path / "d", target, "tiny-target")
    loaded = load_drafter(tmp_path / "d", target, "tiny-target")
    ids = torch.tensor([PROMPT + [drafter.mask_id(1)]])
    torch.testing.assert_close(loaded(input_ids=ids).logits, drafter(input_ids=ids).logits)
    assert loaded.get_output_embeddings() is target.get_output_embeddings()  # shared, not copied
    assert set(loaded.state_dict()) == set(drafter.state_dict())
    assert not any("embed_tokens" in key or "lm_head" in key for key in loaded.state_dict())
    with pytest.raises(ValueError, match="trained for target 'tiny-target'.*other embeddings"):
        load_drafter(tmp_path / "d", tiny_model("llama", seed=4), "another")  # same shape, other weights
    with pytest.raises(ValueError, match="trained for target 'tiny-target'.*num_hidden_layers"):
        load_drafter(tmp_path / "d", tiny_model("llama", seed=3, layers=3), "deeper")
    (tmp_path / "d" / "drafter.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="drafter.safetensors: missing"):
        load_drafter(tmp_path / "d", target, "tiny-target")
    with pytest.raises(FileNotFoundError, match="drafter.json: missing"):
        load_drafter(tmp_path, target, "tiny-target")


def test_from_pretrained_takes_a_drafter_directory(tmp_path, tiny_model_dirs):
    target_dir, _ = tiny_model_dirs
    plain = Engine.from_pretrained(target=target_dir, device="cpu", load_draft=False)
    save_drafter(ParallelDrafter(plain.target, n_masks=2), tmp_path / "d", plain.target, target_dir)
    engine = Engine.from_pretrained(target=target_dir, draft=str(tmp_path / "d"), device="cpu")
    assert isinstance(engine.draft, ParallelDrafter) and engine.draft.n_masks == 2
    prompt = engine.encode(["abc"])[0]
    assert engine.policy_name(None, "sd", (1, 1, 1)) == "choose"  # the drafter's own default
    result = engine.generate([prompt], SamplingParams(max_new_tokens=12, temperature=0), mode="sd",
                             draft_policy="parallelspec")[0]
    assert result.token_ids == reference_greedy(engine.target, prompt, 12)
    assert result.stats.draft_forwards == result.stats.verifications  # one drafter forward per round
    other = tmp_path / "other"
    tiny_model("llama", seed=8, vocab=engine.vocab_size, layers=3).save_pretrained(other)
    from conftest import save_char_tokenizer
    save_char_tokenizer(other)
    with pytest.raises(ValueError, match="trained for target"):
        Engine.from_pretrained(target=str(other), draft=str(tmp_path / "d"), device="cpu")


def test_the_autoregressive_drafter_of_the_same_size_keeps_greedy_output(target):
    drafter = ParallelDrafter(target, n_masks=0, n_layers=1).eval()
    assert drafter.default_policy == "fixed"
    result = Engine(target, drafter).generate([PROMPT], SamplingParams(max_new_tokens=16, temperature=0), mode="sd",
                                              k_config=(1, 1, 1))[0]
    assert result.token_ids == reference_greedy(target, PROMPT, 16)
    assert result.stats.draft_forwards > result.stats.verifications  # one forward per drafted token


def _ps_rows(drafter, widths_per_row, params):
    from seed_tot.engine.policies.parallelspec import ParallelSpecPolicy
    from seed_tot.engine.sequence import Sequence, StopRule

    rule = StopRule(params, frozenset(), None)
    prompts = [PROMPT, [9, 4], [5, 5, 7, 1, 2, 8, 3], [11]]
    return [(Sequence(b, list(p), rule, torch.Generator().manual_seed(b), draft=KVCache()),
             ParallelSpecPolicy(drafter, k_config=w, depth=3))
            for b, (p, w) in enumerate(zip(prompts, widths_per_row))]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_one_pass_round_reads_the_device_once_for_every_row_and_draws_each_as_alone(drafter, temperature,
                                                                                       monkeypatch):
    """Every row's levels come from one transfer (tokens and p for the cut), not one read per node; a
    row batched with others draws what it draws alone, from its own generator."""
    from seed_tot.engine import speculative
    from seed_tot.engine.model_runtime import ModelRuntime
    from test_device_picks import _CountReads

    runtime = ModelRuntime(drafter)
    vocab = drafter.config.vocab_size
    widths = [(1,), (2, 1), (1,), (2, 2)]
    params = SamplingParams(max_new_tokens=8, temperature=temperature)
    reads = _CountReads(monkeypatch)
    together = [tree for tree, _ in speculative.draft_rows(runtime, _ps_rows(drafter, widths, params), vocab)]
    assert reads.n == 1
    monkeypatch.undo()
    alone = [speculative.draft_rows(runtime, [row], vocab)[0][0] for row in _ps_rows(drafter, widths, params)]
    assert [(t.tokens, t.parents) for t in together] == [(t.tokens, t.parents) for t in alone]
    for t, a in zip(together, alone):
        torch.testing.assert_close(t.draft_probs, a.draft_probs)
    # widths (2, 2) at depth 3: 2, 4 and 4 nodes (the last level one child per node)
    assert [len(t) for t in together] == [3, 2 + 2 + 2, 3, 2 + 4 + 4]


def test_a_greedy_row_picks_among_tied_logits_what_it_picks_alone(target):
    """torch.topk orders tied values differently for different k: rows of different widths batched
    together must still pick, level by level, exactly what each picks alone."""
    from seed_tot.engine import speculative
    from seed_tot.engine.model_runtime import ModelRuntime
    from test_device_picks import tied

    torch.manual_seed(0)
    drafter = ParallelDrafter(tied(target), n_masks=3, n_layers=1).eval()  # every token ties its even neighbour
    runtime = ModelRuntime(drafter)
    vocab = drafter.config.vocab_size
    widths = [(1,), (2, 1), (1,), (3, 2)]
    params = SamplingParams(max_new_tokens=8, temperature=0.0)
    together = [tree for tree, _ in speculative.draft_rows(runtime, _ps_rows(drafter, widths, params), vocab)]
    alone = [speculative.draft_rows(runtime, [row], vocab)[0][0] for row in _ps_rows(drafter, widths, params)]
    assert [(t.tokens, t.parents) for t in together] == [(t.tokens, t.parents) for t in alone]


def test_a_sampled_group_keeps_only_the_draws_q_has_mass_for_and_drops_the_subtrees_of_the_rest(target, drafter):
    """top_k leaves q_t fewer tokens than a group asks for: the draws past them (tokens of no mass,
    which the verifier would always reject) are dropped with their subtrees, so the round drafts
    only nodes q_t has mass for; with top_k=1 on both sides the output is still the target's."""
    from seed_tot.engine import speculative
    from seed_tot.engine.model_runtime import ModelRuntime

    runtime = ModelRuntime(drafter)
    vocab = drafter.config.vocab_size
    # top_k=2 under widths (3, 2, 1): 2 root nodes, 2 children each, 1 grandchild each: 2 + 4 + 4
    params = SamplingParams(max_new_tokens=8, temperature=1.0, top_k=2)
    for tree in [tree for tree, _ in speculative.draft_rows(runtime, _ps_rows(drafter, [(3, 2)] * 4, params), vocab)]:
        assert len(tree) == 2 + 4 + 4
        assert all(tree.q(n)[tree.tokens[n]] > 0 for n in range(len(tree)))
        assert [tree.parents.count(-1), *(tree.parents.count(n) for n in range(2))] == [2, 2, 2]
    params = SamplingParams(max_new_tokens=8, temperature=1.0, top_k=1)
    for tree in [tree for tree, _ in speculative.draft_rows(runtime, _ps_rows(drafter, [(2, 2)] * 4, params), vocab)]:
        assert tree.parents == [-1, 0, 1] and all(tree.q(n)[tree.tokens[n]] == 1.0 for n in range(3))
    engine = Engine(target, drafter)
    results = engine.generate([PROMPT], params, mode="seed", k_config=(2, 2), draft_policy="parallelspec")
    assert results[0].token_ids == reference_greedy(target, PROMPT, 8)
