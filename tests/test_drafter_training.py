"""Drafter training: it learns a deterministic toy sequence, resumes exactly, and the CLI writes a
drafter that `--draft DIR` loads (tiny models only)."""
from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from conftest import reference_greedy, tiny_model
from seed_tot import Engine, SamplingParams
from seed_tot.engine.drafters import ParallelDrafter
from seed_tot.training.drafter_train import Sample, train_drafter

VOCAB = 96


def toy_samples() -> list[Sample]:
    """A deterministic sequence: token i+1 follows from token i (period 23), so every future token is predictable."""
    tokens = [(7 * i) % 23 + 5 for i in range(48)]
    return [Sample(tokens[s: s + 32], 4) for s in range(0, 16, 2)]


def test_training_on_a_deterministic_sequence_lowers_loss_and_beats_chance_at_every_mask(tmp_path):
    target = tiny_model("llama", seed=11)
    torch.manual_seed(0)
    drafter = ParallelDrafter(target, n_masks=3, n_layers=1)
    history = []
    result = train_drafter(drafter, toy_samples(), steps=60, out=tmp_path, batch=2, lr=3e-3, max_groups=16,
                           checkpoint_every=20, progress=lambda step, loss, acc: history.append((loss, acc)))
    first, last = history[0][0], sum(loss for loss, _ in history[-5:]) / 5
    assert last < 0.3 * first, (first, last)
    assert result.steps == 60 and len(result.accuracy) == 4
    assert min(result.accuracy) > 10 / VOCAB, result.accuracy  # every group position, masks included, beats chance
    assert history[0][1][3] < min(result.accuracy)  # and got there by training


def test_training_over_a_draft_vocabulary_is_cross_entropy_over_its_rows_with_outside_labels_missed():
    from torch.nn import functional as F

    from seed_tot.training.drafter_train import group_batch, sample_loss

    target = tiny_model("llama", seed=11)
    torch.manual_seed(0)
    drafter = ParallelDrafter(target, n_masks=2, n_layers=1)
    sample = toy_samples()[0]
    vocab = sorted(set(sample.tokens))[:-3]  # three of the sequence's tokens are outside: never draftable
    drafter.set_draft_vocab(torch.tensor(vocab))
    generator = torch.Generator().manual_seed(0)
    loss, stats = sample_loss(drafter, sample, None, generator)
    # the same thing by hand: logits of the vocabulary's rows only, labels as indices into it
    batch = group_batch(drafter, sample.tokens, list(range(sample.start - 1, len(sample.tokens) - 1)))
    hidden, _ = drafter.hidden(batch.input_ids, batch.position_ids, batch.mask)
    valid = batch.labels != -100
    logits = drafter.full_head(hidden[0, batch.rows[valid]])[:, vocab]
    labels = batch.labels[valid]
    inside = torch.tensor([t in vocab for t in labels.tolist()])
    index = torch.tensor([vocab.index(t) if t in vocab else 0 for t in labels.tolist()])
    torch.testing.assert_close(loss, F.cross_entropy(logits[inside], index[inside], reduction="sum"))
    assert stats.count == int(inside.sum()) < int(valid.sum()) == sum(stats.total)
    hits = (logits.argmax(-1) == index) & inside
    assert sum(stats.correct) == int(hits.sum())  # an outside label is a miss, whatever the argmax


def test_a_resumed_run_equals_an_uninterrupted_one(tmp_path):
    target = tiny_model("llama", seed=11)
    runs = {}
    for name, stops in (("straight", [6]), ("resumed", [3, 6])):
        for steps in stops:  # a fresh module each time: only the checkpoint carries the state
            torch.manual_seed(0)
            drafter = ParallelDrafter(target, n_masks=2, n_layers=1)
            train_drafter(drafter, toy_samples(), steps=steps, out=tmp_path / name, batch=2, lr=1e-3, max_groups=8,
                          checkpoint_every=3)
        runs[name] = drafter.state_dict()
    for key, value in runs["straight"].items():
        torch.testing.assert_close(runs["resumed"][key], value)


def test_a_run_resumed_at_its_last_step_reports_the_finished_runs_loss_not_an_empty_window(tmp_path):
    target = tiny_model("llama", seed=11)
    results = []
    for _ in range(2):  # the second call finds the checkpoint at step 4 and trains nothing
        torch.manual_seed(0)
        drafter = ParallelDrafter(target, n_masks=2, n_layers=1)
        results.append(train_drafter(drafter, toy_samples(), steps=4, out=tmp_path, batch=2, lr=1e-3, max_groups=8,
                                     checkpoint_every=2))
    assert results[0].loss > 0
    assert results[1] == results[0]


def test_train_drafter_command_writes_a_drafter_that_generate_loads(tmp_path, tiny_model_dirs):
    from seed_tot.cli import main

    target_dir, _ = tiny_model_dirs
    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(json.dumps({"question": q}) for q in [
        "Tom has 3 apples. He buys 4 more. How many apples does he have?",
        "A bus holds 20 people. Half get off. How many remain on the bus?",
        "Sara reads 5 pages a day. How many pages does she read in a week?"]) + "\n")
    out = tmp_path / "drafter"
    args = ["train-drafter", "--target", target_dir, "--data", str(data), "--k", "2", "--steps", "2", "--out", str(out),
            "--tasks", "gsm8k", "--heldout", "1", "--max-new-tokens", "6", "--context", "32", "--max-groups", "4",
            "--device", "cpu"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout[result.stdout.index("{"):])
    assert report["k"] == 2 and report["steps"] == 2 and report["heldout"]["tau"] >= 1.0
    config = json.loads((out / "drafter.json").read_text())
    assert config["target"] == target_dir and config["method"] == "parallelspec"
    assert config["training"]["samples"] == 4  # (3 questions - 1 held out) x (thought, answer)
    assert config["training"]["heldout"]["questions"] == 1 and config["training"]["heldout"]["prompts"] == 2
    from safetensors.torch import load_file

    from seed_tot.engine.drafters.draft_vocab import load_vocab
    from seed_tot.training.drafter_data import unpack
    written = {t for s in unpack(load_file(str(out / "data.safetensors"))) for t in s.tokens[s.start:]}
    vocab = set(load_vocab(out).tolist())  # every token the target wrote, then the train side's frequent ones
    assert written <= vocab and len(vocab) > len(written)
    card = (out / "MODEL_CARD.md").read_text()  # the model card reproduces the run and states its tau
    assert f"--data {data}" in card and "--k 2" in card and f"tau {report['heldout']['tau']:.2f}" in card
    assert "--heldout 1 " in card and "--context 32 " in card and "--max-groups 4 " in card  # what shaped it
    assert "Held out: the next 1 questions' 2 prompts, not trained on, nor counted in the draft vocabulary" in card
    engine = Engine.from_pretrained(target=target_dir, draft=str(out), device="cpu")
    prompt = engine.encode(["Tom has"])[0]
    generated = engine.generate([prompt], SamplingParams(max_new_tokens=10, temperature=0), mode="seed")[0]
    assert generated.token_ids == reference_greedy(engine.target, prompt, 10)
    # with soft labels into the same --out: its checkpoint (hard labels, finished) would be resumed at its last
    # step and saved under a card saying soft labels, so it is refused, naming the setting
    refused = CliRunner().invoke(main, args + ["--distill-temperature", "1.0"])
    assert refused.exit_code != 0 and "distill_temperature 0.0 -> 1.0" in refused.output, refused.output
    # into a new --out beside a copy of the cached data: the target's T=1 distributions computed, acceptance
    # measured at T=1 too and both in the card
    out = tmp_path / "soft"
    out.mkdir()
    for name in ("data.safetensors", "data.json", "data_cost.json"):
        (out / name).write_bytes((tmp_path / "drafter" / name).read_bytes())
    args[args.index("--out") + 1] = str(out)
    again = CliRunner().invoke(main, args + ["--distill-temperature", "1.0"])
    assert again.exit_code == 0 and "reusing 4 cached samples" in again.output, again.output
    sampled = json.loads(again.stdout[again.stdout.index("{"):])["heldout_sampled"]
    assert sampled["temperature"] == 1.0 and sampled["tau"] >= 1.0
    card = (out / "MODEL_CARD.md").read_text()
    assert "distributions at T=1" in card and "--distill-temperature 1" in card and f"At T=1: tau {sampled['tau']:.2f}" in card


def test_train_drafter_with_target_features_writes_a_drafter_that_reads_them(tmp_path, tiny_model_dirs):
    from seed_tot.cli import main

    target_dir, _ = tiny_model_dirs
    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(json.dumps({"question": q}) for q in [
        "Tom has 3 apples. He buys 4 more. How many apples does he have?",
        "Sara reads 5 pages a day. How many pages does she read in a week?"]) + "\n")
    out = tmp_path / "drafter"
    args = ["train-drafter", "--target", target_dir, "--data", str(data), "--k", "2", "--steps", "2", "--out", str(out),
            "--tasks", "gsm8k", "--heldout", "1", "--max-new-tokens", "6", "--context", "32", "--max-groups", "4",
            "--device", "cpu", "--target-features"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    config = json.loads((out / "drafter.json").read_text())
    assert config["target_features"] is True and config["training"]["target_features"] is True
    card = (out / "MODEL_CARD.md").read_text()
    assert "--target-features" in card and "final hidden state" in card
    engine = Engine.from_pretrained(target=target_dir, draft=str(out), device="cpu")
    assert engine.draft.uses_target_features and engine.target_hidden is not None
    prompt = engine.encode(["Tom has"])[0]
    for mode in ("sd", "seed"):
        generated = engine.generate([prompt], SamplingParams(max_new_tokens=10, temperature=0), mode=mode)[0]
        assert generated.token_ids == reference_greedy(engine.target, prompt, 10)
    refused = CliRunner().invoke(main, args[:-1] + ["--method", "autoregressive", "--target-features"])
    assert refused.exit_code != 0 and "only a parallelspec drafter" in refused.output


def test_train_drafter_refuses_a_test_split(tmp_path):
    from seed_tot.cli import main

    data = tmp_path / "test.jsonl"
    data.write_text(json.dumps({"question": "What is 2 + 2?"}) + "\n")
    result = CliRunner().invoke(main, ["train-drafter", "--data", str(data), "--out", str(tmp_path / "d")])
    assert result.exit_code == 2 and "looks like a test split" in result.output


def test_value_prompts_for_drafter_data_are_the_ones_a_tot_step_evaluates_built_from_train_solutions():
    from seed_tot.search.protocol import Example, State
    from seed_tot.tasks import get_task
    from seed_tot.training.drafter_data import task_prompts

    class Renderer:  # the engine's render_prompt, without a model
        @staticmethod
        def render_prompt(user, assistant_prefix):
            return f"{user}\n{assistant_prefix}"

    records = [json.loads(line) for line in open("tests/fixtures/gsm8k_small.jsonl", encoding="utf-8")][:3]
    prompts = task_prompts(Renderer, records, ("gsm8k_value",), seed=0)
    task = get_task("gsm8k")
    header = task.prompts["step_header"].format(k=1)
    expected = []
    for record in records:  # the fixture's solutions have one line besides "####": a one-step state
        line = record["answer"].splitlines()[0].strip()
        call = task.value_prompt(Example("x", {"question": record["question"], "answer": ""}), State((f"{header} {line}",)))
        expected.append(Renderer.render_prompt(call.user, call.assistant_prefix))
    assert sorted(prompts) == sorted(expected)
    with pytest.raises(ValueError, match="answer"):
        task_prompts(Renderer, [{"question": "q"}], ("gsm8k_value",))


def test_soft_labels_are_the_targets_tempered_distribution_at_each_response_position():
    from seed_tot.training.soft_labels import target_soft_labels

    target = tiny_model("llama", seed=11)
    sample = toy_samples()[0]
    (labels,) = target_soft_labels(target, [sample], temperature=0.7, top_k=5)
    with torch.no_grad():
        logits = target(torch.tensor([sample.tokens])).logits[0].float()
    p = torch.softmax(logits / 0.7, dim=-1)[sample.start - 1: len(sample.tokens) - 1]
    top = p.topk(5, dim=-1)
    assert labels.offset == sample.start - 1 and labels.ids.shape == (len(sample.tokens) - sample.start, 5)
    assert torch.equal(labels.ids, top.indices)
    torch.testing.assert_close(labels.probs, top.values / top.values.sum(-1, keepdim=True))


@pytest.mark.parametrize("draft_vocab", [False, True])
def test_one_hot_soft_labels_give_exactly_the_hard_label_loss(draft_vocab):
    from seed_tot.training.drafter_train import sample_loss
    from seed_tot.training.soft_labels import SoftLabels

    target = tiny_model("llama", seed=11)
    torch.manual_seed(0)
    drafter = ParallelDrafter(target, n_masks=2, n_layers=1)
    sample = toy_samples()[0]
    if draft_vocab:  # three of the sequence's tokens outside: both losses skip them
        drafter.set_draft_vocab(torch.tensor(sorted(set(sample.tokens))[:-3]))
    following = torch.tensor(sample.tokens[sample.start:])[:, None]  # position start-1+i predicts token start+i
    one_hot = SoftLabels(sample.start - 1, following, torch.ones(len(following), 1))
    hard, hard_stats = sample_loss(drafter, sample, None, torch.Generator().manual_seed(0))
    soft, soft_stats = sample_loss(drafter, sample, None, torch.Generator().manual_seed(0), one_hot)
    torch.testing.assert_close(soft, hard)
    assert (soft_stats.count, soft_stats.correct, soft_stats.total) == (hard_stats.count, hard_stats.correct,
                                                                        hard_stats.total)


def test_training_on_soft_labels_brings_the_drafters_q_toward_the_targets_p(tmp_path):
    from torch.nn import functional as F

    from seed_tot.training.drafter_train import group_batch
    from seed_tot.training.soft_labels import target_soft_labels

    target = tiny_model("llama", seed=11)
    torch.manual_seed(0)
    drafter = ParallelDrafter(target, n_masks=1, n_layers=1)
    samples = toy_samples()
    soft = target_soft_labels(target, samples, temperature=0.5, top_k=VOCAB)  # every token: p exactly

    def kl_to_target() -> float:  # KL(p || q) of q_1 (the real token's slot) over the first sample
        s = samples[0]
        anchors = list(range(s.start - 1, len(s.tokens) - 1))
        batch = group_batch(drafter, s.tokens, anchors)
        with torch.no_grad():
            hidden, _ = drafter.hidden(batch.input_ids, batch.position_ids, batch.mask)
            log_q = F.log_softmax(drafter.full_head(hidden[0, batch.rows[:, 0]]).float(), dim=-1)
        p = torch.zeros(len(anchors), log_q.shape[-1]).scatter_(1, soft[0].ids, soft[0].probs)
        return float((p * (p.clamp_min(1e-12).log() - log_q)).sum(-1).mean())

    before = kl_to_target()
    initial = {name: value.clone() for name, value in drafter.state_dict().items()}
    train_drafter(drafter, samples, steps=40, out=tmp_path / "soft", batch=2, lr=3e-3, max_groups=16, soft_labels=soft)
    soft_kl = kl_to_target()
    drafter.load_state_dict(initial)  # the same start and steps on the responses' tokens (hard labels)
    train_drafter(drafter, samples, steps=40, out=tmp_path / "hard", batch=2, lr=3e-3, max_groups=16)
    hard_kl = kl_to_target()
    assert soft_kl < 0.7 * before and soft_kl < hard_kl, (before, soft_kl, hard_kl)


def test_a_checkpoint_of_another_shape_is_refused_saying_what_differs(tmp_path):
    # e.g. a rerun with another --k into the same --out: the message was "(Error(s) in loading state_dict
    # for Linear:)", load_state_dict's first line alone, which names no difference
    from seed_tot.training import checkpoints

    old = torch.nn.Linear(2, 3)
    checkpoints.save(tmp_path, "model", old, torch.optim.SGD(old.parameters(), lr=0.1), step=3)
    new = torch.nn.Linear(2, 4)
    with pytest.raises(ValueError, match=r"checkpoint\.pt: a checkpoint of another model \(Error\(s\) in loading "
                                         r"state_dict for Linear: size mismatch for weight: .*\[3, 2\].*\[4, 2\]"):
        checkpoints.resume(tmp_path, "model", new, torch.optim.SGD(new.parameters(), lr=0.1))


def test_new_training_data_beside_a_checkpoint_trained_on_other_data_is_refused(tmp_path):
    # a rerun of train-head/train-drafter with another --draft into the same --out regenerated the data but
    # resumed the old checkpoint: a head trained on the other draft's data, saved as trained for this one
    from seed_tot.training import checkpoints

    meta_path = tmp_path / "data.json"
    checkpoints.check_same_data(tmp_path, meta_path, {"draft": "self"})  # no checkpoint: a fresh start
    model = torch.nn.Linear(2, 3)
    checkpoints.save(tmp_path, "head", model, torch.optim.SGD(model.parameters(), lr=0.1), step=5)
    meta_path.write_text(json.dumps({"draft": "shipped", "max_new_tokens": 8}), encoding="utf-8")
    with pytest.raises(ValueError, match=r"checkpoint\.pt: trained on data made with other settings \(draft "
                                         r"'shipped' -> 'self'\); use another --out or delete it"):
        checkpoints.check_same_data(tmp_path, meta_path, {"draft": "self", "max_new_tokens": 8})



def test_drafter_blocksworld_prompts_hold_no_problem_of_the_default_evaluation_set_and_no_6_step_one():
    """With 6-step generated instances, train-drafter's seed 0 (the shipped drafter's) drew all ten instances
    that `solve blocksworld` without --data evaluates on, so the drafter was trained on its test problems;
    PlanBench's step_6 instances are 6-step too, so no training instance may be."""
    from seed_tot.search.protocol import State
    from seed_tot.tasks import get_task
    from seed_tot.tasks.blocksworld_sim import optimal_plan, parse_problem
    from seed_tot.training.drafter_data import task_prompts

    class Renderer:  # the engine's render_prompt, without a model
        @staticmethod
        def render_prompt(user, assistant_prefix):
            return user

    evaluated = get_task("blocksworld")
    eval_prompts = {evaluated.thought_prompt(e, State()).user for e in evaluated.load(None)}
    statements = {}  # a thought prompt's problem statement -> its instance
    for seed in range(3):
        task = get_task("blocksworld")
        task.n_random, task.plan_length, task.seed = 48, 6, seed
        for length in (4, 6, 8):
            task.plan_length = length
            statements.update({task.thought_prompt(e, State()).user: e for e in task.load(None)})
        prompts = task_prompts(Renderer, [{"question": f"q{i}"} for i in range(96)], ("blocksworld",), seed=seed)
        assert len(prompts) == 48 and not eval_prompts & set(prompts)
        known = [statements[p] for p in prompts if p in statements]
        assert all(len(optimal_plan(parse_problem(e.data["problem_pddl"]))) != 6 for e in known)


def test_held_out_prompts_share_no_question_or_instance_with_the_training_prompts():
    """The held-out tau was measured on prompts drawn from the shuffled training list, so a held-out answer
    prompt could have its question's thought prompt trained on. Now the held-out questions are the ones
    after the training ones, and their Blocksworld instances are others."""
    from seed_tot.training.drafter_data import heldout_prompts, split_questions, task_prompts

    class Renderer:  # the engine's render_prompt, without a model
        @staticmethod
        def render_prompt(user, assistant_prefix):
            return f"{user}\n{assistant_prefix}"

    records = [{"question": f"Box {i} holds {i + 2} red pens and {i + 3} blue pens. How many pens are in box {i}?",
                "answer": f"Box {i} holds {i + 2} + {i + 3} = {2 * i + 5} pens.\n#### {2 * i + 5}"} for i in range(8)]
    tasks = ("gsm8k", "gsm8k_value", "blocksworld", "creative_writing")
    train, held = split_questions(records, max_examples=len(records) - 2, heldout=2)
    assert train == records[:-2] and held == records[-2:]
    trained = task_prompts(Renderer, train, tasks, seed=0)
    measured = heldout_prompts(Renderer, held, tasks, 0, set(trained))
    assert measured and not set(measured) & set(trained)
    for record in train:  # no held-out prompt holds a training question (thought, answer or value prompt)
        assert not any(record["question"] in p for p in measured)
    for record in held:  # and each held-out question is measured, never trained on
        assert any(record["question"] in p for p in measured) and not any(record["question"] in p for p in trained)
    assert split_questions(records, max_examples=100, heldout=2) == (records[:-2], records[-2:])  # a short file
    with pytest.raises(ValueError, match="none to train on"):
        split_questions(records[:2], max_examples=100, heldout=2)


def test_the_draft_vocabulary_counts_no_held_out_blocksworld_prompt():
    """Held-out questions were left out of the vocabulary's counts, but Blocksworld instances do not come
    from the questions: rendered for every counted record from the task's small pool, they held the
    held-out instances (all of them at the recipe's size), so the drafter's vocabulary had seen them."""
    from seed_tot.training.drafter_data import heldout_prompts, records_tokens, split_questions, task_prompts

    class Tokenless:  # render_prompt and encode without a model: the token lists are the texts
        render_prompt = staticmethod(lambda user, assistant_prefix: f"{user}\n{assistant_prefix}")
        encode = staticmethod(lambda texts: texts)

    records = [{"question": f"Crate {i} holds {i} jars. How many jars are there?"} for i in range(600)]
    train, held = split_questions(records[:200], max_examples=192, heldout=8)
    measured = heldout_prompts(Tokenless, held, ("blocksworld",), 0, set(task_prompts(Tokenless, train, ("blocksworld",))))
    counted = records[:192] + records[200:]
    assert set(measured) & set(records_tokens(Tokenless, counted, ("blocksworld",)))  # the pool holds them
    assert not set(measured) & set(records_tokens(Tokenless, counted, ("blocksworld",), frozenset(measured)))
