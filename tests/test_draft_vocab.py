"""A drafter's frequency-ranked draft vocabulary (FR-Spec): its head scores only the subset, q is 0
outside it, and every mode stays lossless (greedy identical, sampled distribution = the target's)
even when the target wants tokens the drafter can never propose. Saving, loading and the CLI."""
from __future__ import annotations

import json
from collections import Counter

import pytest
import torch
from click.testing import CliRunner

from conftest import reference_greedy, tiny_model
from test_sampling_lossless import SAMPLES, VOCAB, pair, sample_through_engine, tv, tv_bound  # noqa: F401 (pair: a fixture)
from seed_tot import Engine, SamplingParams
from seed_tot.cli import main
from seed_tot.engine.drafters import ParallelDrafter, load_drafter, save_drafter
from seed_tot.engine.drafters.draft_vocab import VOCAB_FILE, TrimmedHead, coverage, frequent_tokens, load_vocab, save_vocab


def test_the_trimmed_head_scores_the_subset_exactly_and_nothing_else():
    target = tiny_model("llama", seed=3)
    head = target.get_output_embeddings()
    ids = torch.tensor([7, 2, 40, 2, 11])  # unsorted, with a duplicate
    trimmed = TrimmedHead(head, ids)
    hidden = torch.randn(2, 3, head.weight.shape[1])
    full, out = head(hidden), trimmed(hidden)
    assert out.shape == full.shape and trimmed.weight is head.weight  # the engine reads the full vocabulary size
    keep = torch.tensor([2, 7, 11, 40])
    torch.testing.assert_close(out[..., keep], full[..., keep])
    rest = torch.ones(full.shape[-1], dtype=torch.bool)
    rest[keep] = False
    assert torch.isneginf(out[..., rest]).all()
    with pytest.raises(ValueError, match=r"token ids in 0\.\.95"):
        TrimmedHead(head, torch.tensor([3, 96]))


def test_frequent_tokens_rank_by_count_keep_special_tokens_and_report_coverage():
    lists = [[5, 5, 5, 9, 9, 1], [9, 3, 3]]  # counts: 5:3, 9:3, 3:2, 1:1
    ids = frequent_tokens(lists, 2, always=[0])
    assert ids.tolist() == [0, 5, 9]  # a tie goes to the smaller id; 0 (EOS) kept although never counted
    assert coverage(ids, lists) == pytest.approx(6 / 9)
    with pytest.raises(ValueError, match="size >= 1"):
        frequent_tokens(lists, 0)


def test_frequent_tokens_can_skip_ids_already_chosen():
    counts = [[5, 5, 5, 7, 7, 9, 2]]
    assert frequent_tokens(counts, 2, exclude=[5]).tolist() == [2, 7]  # 7 by count, then 2 (tie with 9: smaller id)
    assert frequent_tokens(counts, 2).tolist() == [5, 7]


def half_vocab_drafter(target, n_masks: int) -> ParallelDrafter:
    """An untrained drafter over the even tokens only (shared with test_mcsd_lossless)."""
    torch.manual_seed(0)
    drafter = ParallelDrafter(target, n_masks=n_masks, n_layers=1).eval()
    drafter.set_draft_vocab(torch.arange(0, target.config.vocab_size, 2))  # odd tokens can never be drafted
    return drafter


@pytest.mark.parametrize("mode,k_config,batch", [("sd", (1,), 1), ("seed", (2, 2), None)])
def test_greedy_output_equals_the_target_alone_when_the_target_wants_undraftable_tokens(mode, k_config, batch):
    target = tiny_model("llama", seed=3)
    drafter = half_vocab_drafter(target, 3)
    prompts = [[3, 17, 42, 8, 61, 5], [9, 1, 77]]
    results = Engine(target, drafter).generate(prompts, SamplingParams(max_new_tokens=20, temperature=0), mode=mode,
                                               k_config=k_config, draft_batch=batch, verify_batch=batch)
    emitted = []
    for prompt, result in zip(prompts, results):
        assert result.token_ids == reference_greedy(target, prompt, 20)
        emitted += result.token_ids
    assert any(t % 2 for t in emitted)  # the target did emit tokens outside the draft vocabulary


@pytest.mark.parametrize("mode,k_config,setting,batch", [("sd", (1,), "top_k", 1), ("seed", (2, 2), "top_p", None)])
def test_sampled_output_follows_the_target_distribution_with_a_draft_vocabulary(pair, mode, k_config, setting, batch):
    target, _ = pair
    drafter = half_vocab_drafter(target, 1)
    results, exact = sample_through_engine(target, drafter, setting, mode, k_config, batch, draft_policy="parallelspec")
    drafted_odd = Counter(t % 2 for r in results for t in r.token_ids)
    assert drafted_odd[1] > 0  # undraftable tokens are emitted (by the residual), at the target's rate below
    assert tv(Counter(tuple(r.token_ids) for r in results), exact, SAMPLES) < tv_bound(exact, SAMPLES)
    assert VOCAB % 2 == 0


def test_a_round_runs_the_head_only_on_the_positions_it_reads():
    target = tiny_model("llama", seed=3)
    drafter = half_vocab_drafter(target, 3)
    rows = []
    handle = drafter.get_output_embeddings().register_forward_pre_hook(lambda m, args: rows.append(args[0].shape[1]))
    try:
        result = Engine(target, drafter).generate([[3, 17, 42, 8, 61, 5]], SamplingParams(max_new_tokens=12), mode="sd",
                                                  draft_policy="parallelspec")[0]
    finally:
        handle.remove()
    assert rows[0] == 1  # the prompt's prefill keeps one position
    assert result.stats.draft_forwards == len(rows) - 1 > 0
    assert rows[1] == 4 and all(r <= 4 for r in rows[1:])  # q_1..q_4 of depth 4, never the pending tokens before


def test_the_vocabulary_is_saved_loaded_and_can_be_switched_off(tmp_path):
    target = tiny_model("llama", seed=3)
    drafter = half_vocab_drafter(target, 2)
    save_drafter(drafter, tmp_path / "d", target, "tiny", draft_vocab={"source": "test"})
    config = json.loads((tmp_path / "d" / "drafter.json").read_text())
    assert config["draft_vocab"] == {"size": 48, "source": "test"}
    loaded = load_drafter(tmp_path / "d", target, "tiny")
    assert loaded.draft_vocab_size == 48
    ids = torch.tensor([[3, 17, drafter.mask_id(1)]])
    torch.testing.assert_close(loaded(input_ids=ids).logits, drafter(input_ids=ids).logits)
    whole = load_drafter(tmp_path / "d", target, "tiny", draft_vocab=False)
    assert whole.draft_vocab_size is None and whole.get_output_embeddings() is target.get_output_embeddings()
    save_vocab(tmp_path / "d", torch.tensor([1, 500]))
    with pytest.raises(ValueError, match=r"draft_vocab\.safetensors: a draft vocabulary holds token ids in 0\.\.95"):
        load_drafter(tmp_path / "d", target, "tiny")
    (tmp_path / "d" / VOCAB_FILE).write_bytes(b"not safetensors")
    with pytest.raises(ValueError, match="draft_vocab.safetensors: not a readable safetensors file"):
        load_drafter(tmp_path / "d", target, "tiny")
    save_drafter(whole, tmp_path / "d", target, "tiny")  # saving a whole-vocabulary drafter drops the file
    assert not (tmp_path / "d" / VOCAB_FILE).exists()


def test_the_drafter_vocab_command_counts_train_records_and_refuses_test_data(tmp_path, tiny_model_dirs):
    target_dir, _ = tiny_model_dirs
    plain = Engine.from_pretrained(target=target_dir, device="cpu", load_draft=False)
    save_drafter(ParallelDrafter(plain.target, n_masks=2), tmp_path / "d", plain.target, target_dir)
    card = tmp_path / "d" / "MODEL_CARD.md"
    card.write_text("# drafter\n- **Draft vocabulary**: the whole vocabulary.\n- **Reproduce**: `seed-tot train-drafter`\n")
    train = tmp_path / "train.jsonl"
    train.write_text("\n".join(json.dumps({"question": f"Tom has {i} apples. How many?", "answer": f"{i} apples\n#### {i}"})
                               for i in range(6)) + "\n")
    runner = CliRunner()
    out = runner.invoke(main, ["drafter-vocab", "--drafter", str(tmp_path / "d"), "--target", target_dir,
                               "--data", str(train), "--size", "10", "--tasks", "gsm8k"])
    assert out.exit_code == 0, out.output
    report = json.loads(out.output[out.output.index("{"):])
    assert 10 <= report["size"] <= 10 + len(plain.tokenizer.all_special_ids) and 0 < report["coverage"] < 1
    engine = Engine.from_pretrained(target=target_dir, draft=str(tmp_path / "d"), device="cpu")
    assert engine.draft.draft_vocab_size == report["size"]
    # the card names the vocabulary the directory now holds (it kept saying "the whole vocabulary")
    vocab_lines = [ln for ln in card.read_text().splitlines() if ln.startswith("- **Draft vocabulary**")]
    assert len(vocab_lines) == 1 and f"the {report['size']} most frequent" in vocab_lines[0]
    assert "drafter-vocab" in vocab_lines[0]
    prompt = engine.encode(["abc"])[0]
    result = engine.generate([prompt], SamplingParams(max_new_tokens=12, temperature=0), mode="sd")[0]
    assert result.token_ids == reference_greedy(engine.target, prompt, 12)
    test = tmp_path / "test.jsonl"
    test.write_text(train.read_text())
    out = runner.invoke(main, ["drafter-vocab", "--drafter", str(tmp_path / "d"), "--target", target_dir,
                               "--data", str(test)])
    assert out.exit_code != 0 and "looks like a test split" in out.output
    out = runner.invoke(main, ["drafter-vocab", "--drafter", str(tmp_path / "d"), "--target", target_dir, "--size", "0"])
    assert out.exit_code == 0 and not (tmp_path / "d" / VOCAB_FILE).exists()
    assert "- **Draft vocabulary**: the whole vocabulary (set after training" in card.read_text()


def test_the_drafter_vocab_command_leaves_out_the_questions_training_held_out(tmp_path, tiny_model_dirs):
    """A drafter trained with --heldout reports a held-out tau: re-counting its vocabulary from the same
    train file must not count the held-out questions (it counted the first --max-examples records)."""
    from seed_tot.training.drafter_data import task_prompts

    target_dir, _ = tiny_model_dirs
    plain = Engine.from_pretrained(target=target_dir, device="cpu", load_draft=False)
    records = [{"question": f"Tom has {i} apples. How many?", "answer": f"{i} apples\n#### {i}"} for i in range(4)]
    seen = {c for text in task_prompts(plain, records, ["gsm8k"]) for c in text}
    seen |= {c for r in records for c in r["answer"]}
    rare = [c for c in "QXZ@^~|`" if c not in seen][:2]
    assert len(rare) == 2, "the test needs two characters no training prompt uses"
    held = [{"question": f"{rare[0]}{rare[0]} has 5 apples.", "answer": "5 apples\n#### 5"}]
    later = [{"question": f"{rare[1]} has 6 apples.", "answer": "6 apples\n#### 6"}]  # after the held-out ones: counted
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in records + held + later))
    save_drafter(ParallelDrafter(plain.target, n_masks=2), tmp_path / "d", plain.target, target_dir)
    config_path = tmp_path / "d" / "drafter.json"
    config = json.loads(config_path.read_text())
    config["training"] = {"data": str(train), "split": "by question", "train_questions": 4, "tasks": ["gsm8k"],
                          "seed": 0, "heldout": {"questions": 1, "tau": 1.5}}
    config_path.write_text(json.dumps(config))
    card = tmp_path / "d" / "MODEL_CARD.md"
    card.write_text("# drafter\n- **Held-out acceptance**: tau 1.5.\n- **Reproduce**: `seed-tot train-drafter`\n")
    out = CliRunner().invoke(main, ["drafter-vocab", "--drafter", str(tmp_path / "d"), "--target", target_dir,
                                    "--data", str(train), "--size", "90", "--tasks", "gsm8k"])
    assert out.exit_code == 0, out.output
    ids = set(load_vocab(tmp_path / "d").tolist())
    rare_ids = [plain.encode([c])[0][0] for c in rare]
    assert rare_ids[0] not in ids  # only the held-out question has it
    assert rare_ids[1] in ids  # a record after the held-out ones is training-side and counted
    assert "less the 1 questions held out in training" in out.output
    assert "tau 1.5. Measured with the vocabulary it was trained with" in card.read_text()  # the tau predates it
