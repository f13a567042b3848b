"""Training SpecDec++'s head: weighted BCE on soft acceptance labels, resumable, with a held-out check.

loss = -(w_acc * y * log s + w_rej * (1 - y) * log(1 - s)) averaged over the rows (the Y positions;
the data module already dropped X positions). The held-out loss is reported beside the loss of the
best constant predictor, c = w_acc*E[y] / (w_acc*E[y] + w_rej*E[1-y]), which the head must beat to
have learned anything about *which* tokens get accepted.

Early stopping: a few thousand rows are easy to memorise (the first Qwen head reached train loss
0.08 and held-out 4.3 against the constant's 0.95), so the rows are split train / validation /
held-out, the head keeps the weights of its best validation loss (checked every `eval_every`
steps), and the held-out rows, never used for that choice, give the reported loss.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.nn import functional as F

from seed_tot.engine.policies.head import AcceptanceHead

from . import checkpoints
from .specdec_data import HeadData

CHECKPOINT = checkpoints.CHECKPOINT


def weighted_bce(logits: torch.Tensor, labels: torch.Tensor, w_acc: float, w_rej: float,
                 mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean weighted BCE over the positions where `mask` is True (all when None)."""
    per = -(w_acc * labels * F.logsigmoid(logits) + w_rej * (1 - labels) * F.logsigmoid(-logits))
    if mask is not None:
        per = per[mask]
    return per.mean()


def best_constant_loss(labels: torch.Tensor, w_acc: float, w_rej: float) -> tuple[float, float]:
    """(c, loss) of the best constant prediction c for these labels under the weighted BCE."""
    acc, rej = w_acc * float(labels.mean()), w_rej * float((1 - labels).mean())
    c = min(max(acc / (acc + rej), 1e-6), 1 - 1e-6)
    return c, -(acc * math.log(c) + rej * math.log(1 - c))


@dataclass
class TrainResult:
    steps: int
    heldout_loss: float
    constant_loss: float
    constant: float


def split(data: HeadData, heldout_fraction: float, seed: int) -> tuple[HeadData, HeadData]:
    """(train, held) by prompt: a held-out fraction of the prompts, with every row of each."""
    groups = data.groups()
    ids = torch.unique(groups)
    order = ids[torch.randperm(len(ids), generator=torch.Generator().manual_seed(seed))]
    n_held = max(1, int(len(ids) * heldout_fraction))
    if len(ids) - n_held < 1:
        raise ValueError(f"{len(ids)} training prompts are too few to hold out {heldout_fraction:.0%} for evaluation")
    held = torch.isin(groups, order[:n_held])
    return data.subset(~held), data.subset(held)


def train_head(head: AcceptanceHead, data: HeadData, steps: int, out: Path, w_acc: float = 1.0, w_rej: float = 6.0,
               batch: int = 256, lr: float = 1e-3, heldout_fraction: float = 0.1, seed: int = 0,
               checkpoint_every: int = 100, eval_every: int = 5, progress=None) -> TrainResult:
    """Train (resuming from out/checkpoint.pt when present), keep the weights of the best validation
    loss, and evaluate them on the held-out rows."""
    train, held = split(data, heldout_fraction, seed)
    train, val = split(train, heldout_fraction, seed + 1)
    optim = torch.optim.AdamW(head.parameters(), lr=lr)
    out.mkdir(parents=True, exist_ok=True)
    kept: dict = {}
    step = checkpoints.resume(out, "head", head, optim, kept)

    def val_loss() -> float:
        head.eval()
        with torch.no_grad():
            loss = float(weighted_bce(head(val.hidden), val.labels, w_acc, w_rej))
        head.train()
        return loss

    # the best weights so far live in the checkpoint beside the last ones: a run resumed after an interruption
    # (or extended with more --steps) goes on from the last weights and still knows the best before it
    if "best" in kept:
        best_loss, best_state = float(kept["best_loss"]), kept["best"]
    else:
        best_loss, best_state = val_loss(), copy.deepcopy(head.state_dict())

    def save() -> None:
        checkpoints.save(out, "head", head, optim, step, {"best": best_state, "best_loss": torch.tensor(best_loss)})

    head.train()
    while step < steps:
        # one generator per step, as the drafter's: a resumed run draws the batches an uninterrupted one draws
        generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
        idx = torch.randint(len(train.labels), (min(batch, len(train.labels)),), generator=generator)
        loss = weighted_bce(head(train.hidden[idx]), train.labels[idx], w_acc, w_rej)
        optim.zero_grad()
        loss.backward()
        optim.step()
        step += 1
        if progress is not None:
            progress(step, loss.item())
        if step % eval_every == 0 or step == steps:
            current = val_loss()
            if current < best_loss:
                best_loss, best_state = current, copy.deepcopy(head.state_dict())
        if step % checkpoint_every == 0 or step == steps:
            save()  # the last weights: a rerun with more --steps goes on from them as one longer run would
    head.load_state_dict(best_state)  # early stopping: the weights of the best validation loss
    head.eval()
    with torch.no_grad():
        held_loss = float(weighted_bce(head(held.hidden), held.labels, w_acc, w_rej))
    c, _ = best_constant_loss(train.labels, w_acc, w_rej)
    const_held = float(weighted_bce(torch.full_like(held.labels, math.log(c / (1 - c))), held.labels, w_acc, w_rej))
    return TrainResult(step, held_loss, const_held, c)
