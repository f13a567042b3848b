"""SpecDec++: the stopping rule, the training labels, the loss, the head's training and loading."""
from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
from click.testing import CliRunner

from conftest import noisy_copy, reference_greedy, tiny_model
from seed_tot import Engine, SamplingParams
from seed_tot.cli import main
from seed_tot.engine.policies.base import HiddenCapture
from seed_tot.engine.policies.head import AcceptanceHead, load_head, save_head
from seed_tot.engine.policies.specdec import SpecDecPolicy
from seed_tot.training.specdec_data import HeadData, acceptance_labels, mix
from seed_tot.training.specdec_train import best_constant_loss, train_head, weighted_bce


class ConstantHead(torch.nn.Module):
    def __init__(self, a: float):
        super().__init__()
        self.logit = torch.nn.Parameter(torch.tensor(math.log(a / (1 - a))))

    def forward(self, hidden):
        return self.logit.expand(hidden.shape[:-1])


def drafted_length(a: float, h: float, min_len: int = 2, max_len: int = 20) -> int:
    kv = SimpleNamespace(parents=[], committed=3)
    seq = SimpleNamespace(draft=kv, generated=[], generator=torch.Generator().manual_seed(0), pending=lambda c: [1])
    rnd = SpecDecPolicy(ConstantHead(a), h, min_len, max_len).begin(seq, SamplingParams(temperature=0), 8)
    feed = rnd.first_feed()
    while feed is not None:
        kv.parents += feed.parents
        feed = rnd.step(torch.randn(len(feed.tokens), 8), torch.zeros(len(feed.tokens), 4))
    return len(rnd.finish()[0])


@pytest.mark.parametrize("a,h", [(0.9, 0.5), (0.5, 0.3), (0.99, 0.9), (0.7, 0.05), (0.3, 0.9)])
def test_stopping_rule_with_a_constant_head(a, h):
    expected = next(i for i in range(2, 21) if 1 - a ** (i - 1) > h) if 1 - a ** 19 > h else 20
    assert drafted_length(a, h) == expected


def test_length_bounds_hold():
    assert drafted_length(0.999, 0.5, max_len=6) == 6
    assert drafted_length(0.01, 0.5, min_len=3) == 3


def test_labels_match_a_hand_computation():
    p = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]])
    q = torch.tensor([[0.9, 0.05, 0.05], [0.2, 0.2, 0.6]])
    y = torch.tensor([0, 2])
    assert acceptance_labels(p, q, y, greedy=False).tolist() == pytest.approx([0.5 / 0.9, 1.0])
    assert acceptance_labels(p, q, torch.tensor([1, 2]), greedy=True).tolist() == [0.0, 1.0]


def test_mixing_keeps_target_tokens_at_rate_r_and_masks_them():
    x, y = torch.zeros(20000, dtype=torch.long), torch.ones(20000, dtype=torch.long)
    z, is_y = mix(x, y, 0.15, torch.Generator().manual_seed(0))
    assert abs(float((z == 0).float().mean()) - 0.15) < 0.01
    assert torch.equal(is_y, z == 1)


def test_loss_applies_weights_and_mask():
    logits, labels = torch.tensor([0.0, 2.0, -1.0]), torch.tensor([1.0, 0.0, 0.3])
    by_hand = [-math.log(0.5), -3 * math.log(1 - 1 / (1 + math.exp(-2.0))),
               -(0.3 * math.log(1 / (1 + math.exp(1.0))) + 3 * 0.7 * math.log(1 - 1 / (1 + math.exp(1.0))))]
    assert float(weighted_bce(logits, labels, 1.0, 3.0)) == pytest.approx(sum(by_hand) / 3, rel=1e-5)
    mask = torch.tensor([True, False, True])
    assert float(weighted_bce(logits, labels, 1.0, 3.0, mask)) == pytest.approx((by_hand[0] + by_hand[2]) / 2, rel=1e-5)


def test_training_beats_the_best_constant_on_a_known_label_function(tmp_path):
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(3000, 16, generator=gen)
    labels = torch.sigmoid(3 * hidden[:, 0] - 2 * hidden[:, 1])  # acceptance depends on the state
    head = AcceptanceHead(16, layers=1, width=32)
    result = train_head(head, HeadData(hidden, labels), steps=300, out=tmp_path, w_rej=3.0, lr=3e-3)
    assert result.heldout_loss < 0.8 * result.constant_loss
    c, _ = best_constant_loss(labels, 1.0, 3.0)
    assert 0 < c < 1 and result.constant == pytest.approx(c, abs=0.02)
    resumed = train_head(AcceptanceHead(16, layers=1, width=32), HeadData(hidden, labels), steps=300, out=tmp_path,
                         w_rej=3.0)
    assert resumed.heldout_loss == pytest.approx(result.heldout_loss, rel=1e-4)  # resumed at step 300: no more steps



def test_an_interrupted_and_resumed_head_training_equals_an_uninterrupted_one(tmp_path):
    """A resumed run drew its batches from a generator seeded with the resumed step (not the one an
    uninterrupted run had advanced) and forgot the best validation weights found before the interruption."""
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(600, 16, generator=gen)
    data = HeadData(hidden, torch.sigmoid(3 * hidden[:, 0] - 2 * hidden[:, 1]))

    def run(out, stop_at=None):
        def progress(step, loss):
            if step == stop_at:
                raise KeyboardInterrupt
        torch.manual_seed(0)
        head = AcceptanceHead(16, layers=1, width=32)
        return head, train_head(head, data, steps=30, out=out, lr=1e-2, batch=32, checkpoint_every=10,
                                progress=progress)

    straight, straight_result = run(tmp_path / "straight")
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "resumed", stop_at=17)  # the checkpoint holds step 10
    resumed, resumed_result = run(tmp_path / "resumed")
    assert resumed_result == straight_result
    for key, value in straight.state_dict().items():
        assert torch.equal(resumed.state_dict()[key], value), key


def test_head_trained_for_other_models_is_refused(tmp_path):
    save_head(AcceptanceHead(8, layers=1), tmp_path, {"target": "T", "draft": "D"})
    load_head(tmp_path, "T", "D")
    with pytest.raises(ValueError, match="trained for target 'T', not 'other'"):
        load_head(tmp_path, "other", "D")
    with pytest.raises(ValueError, match="no head here"):
        load_head(tmp_path / "missing")


@pytest.mark.parametrize("mode", ["sd", "seed"])
def test_greedy_specdec_equals_target_alone(mode):
    target = tiny_model("llama", seed=3)
    draft = noisy_copy(target, 0.005)
    prompts = [[5], [1, 2, 3, 4, 5, 6, 7]]
    refs = [reference_greedy(target, p, 24) for p in prompts]
    policy = SpecDecPolicy(ConstantHead(0.8), h=0.5, capture=HiddenCapture(draft))
    results = Engine(target, draft).generate(prompts, SamplingParams(max_new_tokens=24, temperature=0), mode=mode,
                                             draft_policy=policy)
    assert [r.token_ids for r in results] == refs
    assert 5 in {r["drafted"] for r in policy.records}  # 1 - 0.8^4 > 0.5 >= 1 - 0.8^3: chains of five


def test_train_head_command_writes_a_loadable_head(tiny_model_dirs, tmp_path):
    target, draft = tiny_model_dirs
    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(json.dumps({"question": q}) for q in ["What is 2+3?", "Add 4 and 5.", "Is 7 odd?"]))
    out = tmp_path / "head"
    args = ["train-head", "--target", target, "--draft", draft, "--data", str(data), "--max-examples", "3",
            "--steps", "20", "--max-new-tokens", "12", "--out", str(out), "--device", "cpu"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout[result.stdout.index("{"):])
    assert report["steps"] == 20 and report["rows"] > 0
    head, trained_for = load_head(out, target, draft)
    assert trained_for["temperature"] == 0.0
    card = (out / "MODEL_CARD.md").read_text()  # a model card beside the weights, stating the command and the loss
    assert f"--data {data}" in card and "--steps 20" in card and f"{report['heldout_loss']:.4f}" in card
    again = CliRunner().invoke(main, args)  # cached data, finished checkpoint: resumes
    assert again.exit_code == 0 and "reusing" in again.output



def test_train_head_refuses_a_test_split(tmp_path):
    """train-drafter and drafter-vocab refused a file named like a test split; train-head read GSM8K test."""
    data = tmp_path / "test.jsonl"
    data.write_text(json.dumps({"question": "What is 2 + 2?"}) + "\n")
    result = CliRunner().invoke(main, ["train-head", "--data", str(data), "--out", str(tmp_path / "h")])
    assert result.exit_code == 2 and "looks like a test split" in result.output


def test_train_head_with_fewer_than_three_prompts_is_refused_before_generating(tmp_path):
    """Held-out and validation rows are whole prompts, so 2 prompts failed in training, after generation."""
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {i} + 2?"}) + "\n" for i in range(5)))
    result = CliRunner().invoke(main, ["train-head", "--data", str(data), "--out", str(tmp_path / "h"),
                                       "--max-examples", "2"])
    assert result.exit_code == 2 and "--max-examples" in result.output and not (tmp_path / "h").exists()


def test_train_head_with_another_seed_does_not_resume_the_first_seeds_data_and_checkpoint(tiny_model_dirs, tmp_path):
    """--seed draws the responses and the mixing, but was not among the cached data's settings: a rerun with
    --seed 1 into the same --out reused seed 0's rows and checkpoint and saved them as its own."""
    target, draft = tiny_model_dirs
    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(json.dumps({"question": q}) for q in ["What is 2+3?", "Add 4 and 5.", "Is 7 odd?"]))
    args = ["train-head", "--target", target, "--draft", draft, "--data", str(data), "--max-examples", "3",
            "--steps", "2", "--max-new-tokens", "8", "--out", str(tmp_path / "head"), "--device", "cpu"]
    assert CliRunner().invoke(main, args).exit_code == 0
    other = CliRunner().invoke(main, args + ["--seed", "1"])
    assert other.exit_code != 0 and "seed 0 -> 1" in other.output, other.output

    """A policy that reads the draft's hidden states keeps batched drafting (one capture holds the
    batch, each row reads its own entries) and stays exact."""
    target = tiny_model("llama", seed=3)
    draft = noisy_copy(target, 0.005)
    prompts = [[5], [1, 2, 3, 4, 5, 6, 7], [9, 9, 2], [4, 4]]
    refs = [reference_greedy(target, p, 24) for p in prompts]
    engine = Engine(target, draft)
    params = SamplingParams(max_new_tokens=24, temperature=0)
    batched_policy = SpecDecPolicy(ConstantHead(0.8), h=0.5, capture=engine.draft_runtime.capture(HiddenCapture))
    batched = engine.generate(prompts, params, mode="seed", draft_policy=batched_policy, draft_batch=None,
                              verify_batch=None)
    assert [r.token_ids for r in batched] == refs
    assert 5 in {r["drafted"] for r in batched_policy.records}  # the head still decides: chains of five
    one_policy = SpecDecPolicy(ConstantHead(0.8), h=0.5, capture=engine.draft_runtime.capture(HiddenCapture))
    one = engine.generate(prompts, params, mode="seed", draft_policy=one_policy, draft_batch=1, verify_batch=1)
    assert sum(r.stats.draft_forwards for r in batched) < sum(r.stats.draft_forwards for r in one) / 2


def test_held_out_and_validation_rows_are_whole_prompts_never_a_trained_prompts_neighbours():
    """A response's neighbouring positions are near copies; split by row, the held-out loss was measured on
    positions of responses the head was trained on."""
    from seed_tot.training.specdec_train import split

    prompt = torch.arange(40).repeat_interleave(5)  # 40 prompts of 5 rows each
    data = HeadData(torch.randn(200, 4), torch.rand(200), prompt)
    train, held = split(data, 0.1, seed=0)
    train, val = split(train, 0.1, seed=1)
    sides = [set(part.prompt.tolist()) for part in (train, val, held)]
    assert [len(s) for s in sides] == [33, 3, 4]  # whole prompts: 5 rows each
    assert not (sides[0] & sides[1] or sides[0] & sides[2] or sides[1] & sides[2])
    assert len(train.labels) + len(val.labels) + len(held.labels) == 200
    row = 7  # rows keep their own hidden state and label
    side = next(part for part in (train, val, held) if int(prompt[row]) in set(part.prompt.tolist()))
    at = [i for i, h in enumerate(side.hidden) if torch.equal(h, data.hidden[row])]
    assert at and side.labels[at[0]] == data.labels[row]
