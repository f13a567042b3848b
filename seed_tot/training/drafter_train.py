"""Training a ParallelSpec (or autoregressive) drafter: the paper's group-wise layout, resumable.

One training forward per sequence x_0..x_{n-1}. Entries are the real tokens (a chain) and, for
every anchor t, a group MASK_1..MASK_k hanging off x_t as a chain of its own:

    x_0 .. x_t .. x_{n-1}      real tokens, causal
           └ MASK_1 └ MASK_2 .. MASK_k    group of anchor t; MASK_j sits at position t + j

Read as a tree of entries this is exactly what the engine already masks (engine/masks.py:
`tree_visibility` gives every entry the prefix and its ancestors, i.e. MASK_j sees x_<=t and
MASK_1..MASK_{j-1} of its own group, never another group's masks; its position is its depth, t + j,
the position it has at inference). So the training forward at group t equals the inference forward
on [x_<=t, MASK_1..MASK_j] (tests/test_parallelspec.py proves it), with no second mask builder.
Labels: x_t's output predicts x_{t+1}, MASK_j's predicts x_{t+j+1}; anchors are the positions whose
next token is the target's response (self-distillation), labels past the end are ignored. With
k = 0 this is plain next-token training of the autoregressive drafter.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch.nn import functional as F

from seed_tot.engine.masks import AttentionLayout, build_attention_mask, tree_visibility

from . import checkpoints
from .samples import Sample

IGNORE = -100
WINDOW_FILE = "train_window.json"  # the last logged window's counters, beside checkpoint.pt


@dataclass
class GroupBatch:
    input_ids: torch.Tensor  # [1, Q]: real tokens, then each group's mask ids
    position_ids: torch.Tensor  # [1, Q]
    mask: torch.Tensor | dict  # the 4D mask from engine/masks.py
    rows: torch.Tensor  # [G, k+1] entry whose output is q_1..q_{k+1} of each group
    labels: torch.Tensor  # [G, k+1] x_{t+1..t+k+1}, IGNORE past the end
    features: torch.Tensor | None = None  # [1, Q, size]: x_t's entry reads f_{t-1}, its masks f_{t-1} too


def group_batch(drafter, tokens: list[int], anchors: list[int], hidden: torch.Tensor | None = None) -> GroupBatch:
    """The group-wise training layout of one sequence (see the module docstring). hidden: the target's
    final hidden states of `tokens`, for a drafter that reads them (engine/target_features.py)."""
    if drafter.uses_target_features and hidden is None:
        raise ValueError("this drafter reads the target's hidden states: its samples need them (Sample.hidden)")
    n, k = len(tokens), drafter.n_masks
    parents = [i - 1 for i in range(n)]
    rows, ids = [], list(tokens)
    for t in anchors:
        group = [t]
        for j in range(1, k + 1):
            parents.append(group[-1])
            group.append(len(parents) - 1)
            ids.append(drafter.mask_id(j))
        rows.append(group)
    allowed, query_pos, key_pos = tree_visibility(0, parents, 0)
    layout = AttentionLayout.of(drafter)
    layout.check_tree_masks("drafter training (the group-wise layout)")
    mask = build_attention_mask(layout, allowed[None], query_pos[None], key_pos[None], drafter.dtype, drafter.device)
    labels = [[tokens[t + 1 + j] if t + 1 + j < n else IGNORE for j in range(k + 1)] for t in anchors]
    features = None
    if drafter.uses_target_features:  # as at inference: x_p's entry reads f_{p-1} (x_0: zeros), a mask its anchor's
        features = torch.zeros(1, len(ids), drafter.feature_size, dtype=drafter.dtype, device=drafter.device)
        features[0, 1:n] = hidden[: n - 1].to(device=drafter.device, dtype=drafter.dtype)
        group = torch.tensor(rows, dtype=torch.long, device=drafter.device).reshape(len(anchors), k + 1)
        features[0, group[:, 1:]] = features[0, group[:, :1]].expand(-1, k, -1)
    return GroupBatch(torch.tensor([ids], device=drafter.device), query_pos[None].to(drafter.device), mask,
                      torch.tensor(rows, dtype=torch.long).reshape(len(anchors), k + 1),
                      torch.tensor(labels, dtype=torch.long).reshape(len(anchors), k + 1), features)


def group_logits(drafter, batch: GroupBatch) -> torch.Tensor:
    """[G, k+1, V] logits of every group element (the training forward)."""
    hidden, _ = drafter.hidden(batch.input_ids, batch.position_ids, batch.mask, target_features=batch.features)
    return drafter.full_head(hidden[0, batch.rows.to(hidden.device)])


def anchors_of(sample: Sample, max_groups: int | None, generator: torch.Generator) -> list[int]:
    """Positions t whose next token is in the response; at most `max_groups`, drawn at random."""
    anchors = list(range(max(sample.start - 1, 0), len(sample.tokens) - 1))
    if max_groups and len(anchors) > max_groups:
        pick = torch.randperm(len(anchors), generator=generator)[:max_groups].sort().values
        anchors = [anchors[i] for i in pick.tolist()]
    return anchors


@dataclass
class StepStats:
    loss_sum: float
    count: int
    correct: list[int]  # per group position (0: q_1 at the real token, j: MASK_j)
    total: list[int]


def _draft_rows(drafter, device) -> torch.Tensor | None:
    """token id -> the row of the draft vocabulary that scores it (IGNORE outside it); None without one."""
    head = drafter.trimmed_head
    if head is None:
        return None
    lookup = torch.full((head.weight.shape[0],), IGNORE, dtype=torch.long, device=device)
    lookup[head.token_ids.to(device)] = torch.arange(head.token_ids.numel(), device=device)
    return lookup


def _scored(drafter, hidden: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits and labels over what the drafter drafts from: with a draft vocabulary (draft_vocab.py) only
    its rows, as at inference, where q is the softmax over them (a label outside it becomes IGNORE: it
    can never be drafted); otherwise the whole shared head. Scoring 8k rows instead of 49k also makes
    a step several times cheaper on the embedded default (the head dominates a one-layer drafter)."""
    head = drafter.trimmed_head
    if head is None:
        return drafter.full_head(hidden).float(), labels
    return F.linear(hidden, head.rows, head.bias).float(), _draft_rows(drafter, labels.device)[labels]


def sample_loss(drafter, sample: Sample, max_groups: int | None, generator: torch.Generator, soft=None
                ) -> tuple[torch.Tensor | None, StepStats]:
    """Summed cross-entropy over the sample's labelled group positions, and per-position accuracy
    (a label the draft vocabulary lacks counts as a miss). soft: the target's distributions at the
    sample's positions (soft_labels.SoftLabels); the cross-entropy is then against them, not against
    the response's tokens (accuracy still counts the response's tokens)."""
    k = drafter.n_masks
    anchors = anchors_of(sample, max_groups, generator)
    if not anchors:
        return None, StepStats(0.0, 0, [0] * (k + 1), [0] * (k + 1))
    batch = group_batch(drafter, sample.tokens, anchors, sample.hidden)
    valid = batch.labels != IGNORE
    # only labelled rows go through the (large) LM head
    hidden, _ = drafter.hidden(batch.input_ids, batch.position_ids, batch.mask, target_features=batch.features)
    picked = hidden[0, batch.rows[valid].to(hidden.device)]
    logits, labels = _scored(drafter, picked, batch.labels[valid].to(picked.device))
    hits = ((logits.argmax(-1) == labels) & (labels != IGNORE)).cpu()
    slot = torch.arange(k + 1).expand_as(batch.labels)[valid]
    correct = torch.bincount(slot[hits], minlength=k + 1).tolist()
    total = torch.bincount(slot, minlength=k + 1).tolist()
    if soft is None:
        scored = labels != IGNORE
        loss = F.cross_entropy(logits, labels, ignore_index=IGNORE, reduction="sum")
    else:  # group t's slot j predicts the token after position t + j
        from .soft_labels import dense_targets

        positions = (torch.tensor(anchors)[:, None] + torch.arange(k + 1))[valid]
        targets, scored = dense_targets(soft, positions, _draft_rows(drafter, "cpu"), logits.shape[-1])
        loss = -(targets.to(logits.device) * F.log_softmax(logits[scored.to(logits.device)], dim=-1)).sum()
    if not bool(scored.any()):
        return None, StepStats(0.0, 0, [0] * (k + 1), total)
    return loss, StepStats(float(loss.detach()), int(scored.sum()), correct, total)


@dataclass
class TrainResult:
    steps: int
    loss: float  # mean over the last logged window
    accuracy: list[float]  # per group position, over the last window


def train_drafter(drafter, samples: list[Sample], steps: int, out: Path, batch: int = 8, lr: float = 5e-4,
                  max_groups: int | None = 64, seed: int = 0, checkpoint_every: int = 50, progress=None,
                  soft_labels: list | None = None) -> TrainResult:
    """AdamW on the drafter's own parameters (the shared embeddings and head stay frozen), resuming
    from out/checkpoint.pt when present. progress(step, loss, accuracies) after every step.
    soft_labels: per sample, the target's distributions to train against (soft_labels.py)."""
    if soft_labels is not None and len(soft_labels) != len(samples):
        raise ValueError(f"{len(soft_labels)} soft labels for {len(samples)} samples")
    if not samples:
        raise ValueError("no training samples")
    params = [p for p in drafter.parameters() if p.requires_grad]
    optim = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    out.mkdir(parents=True, exist_ok=True)
    step = checkpoints.resume(out, "drafter", drafter, optim)
    for module in drafter.shared:  # frozen: no gradient buffers for the target's big tables
        module.requires_grad_(False)
    k = drafter.n_masks
    window = StepStats(0.0, 0, [0] * (k + 1), [0] * (k + 1))
    drafter.train()
    while step < steps:
        generator = torch.Generator().manual_seed(seed * 1_000_003 + step)  # a resumed run draws what it would have
        idx = torch.randint(len(samples), (min(batch, len(samples)),), generator=generator).tolist()
        optim.zero_grad()
        stats = StepStats(0.0, 0, [0] * (k + 1), [0] * (k + 1))
        losses = []
        for i in idx:
            loss, s = sample_loss(drafter, samples[i], max_groups, generator,
                                  soft_labels[i] if soft_labels is not None else None)
            if loss is not None:
                losses.append(loss)
            stats = _add(stats, s)
        if stats.count:
            (torch.stack(losses).sum() / stats.count).backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optim.step()
        step += 1
        window = stats if step % checkpoint_every == 1 or checkpoint_every == 1 else _add(window, stats)
        if progress is not None:
            progress(step, stats.loss_sum / max(stats.count, 1), _accuracy(stats))
        if step % checkpoint_every == 0 or step == steps:
            checkpoints.save(out, "drafter", drafter, optim, step)
            (out / WINDOW_FILE).write_text(json.dumps({"step": step, **asdict(window)}) + "\n", encoding="utf-8")
    drafter.eval()
    if window.count == 0 and (out / WINDOW_FILE).is_file():  # resumed at its last step: report the window
        saved = json.loads((out / WINDOW_FILE).read_text())  # that step closed, not an empty one
        if saved.pop("step") == step:
            window = StepStats(**saved)
    return TrainResult(step, window.loss_sum / max(window.count, 1), _accuracy(window))


def _add(a: StepStats, b: StepStats) -> StepStats:
    return StepStats(a.loss_sum + b.loss_sum, a.count + b.count, [x + y for x, y in zip(a.correct, b.correct)],
                     [x + y for x, y in zip(a.total, b.total)])


def _accuracy(stats: StepStats) -> list[float]:
    return [c / t if t else 0.0 for c, t in zip(stats.correct, stats.total)]


@torch.inference_mode()
def heldout_tau(engine, prompts: list[list[int]], depth: int, max_new_tokens: int, temperature: float = 0.0) -> dict:
    """Held-out acceptance of the engine's drafter, sd with chains of `depth` (greedy unless a
    temperature is given): tau = tokens per target verification (the paper's average acceptance
    length) and accepted / drafted."""
    from seed_tot import SamplingParams

    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature)
    results = engine.generate(prompts, params, mode="sd", k_config=(1,) * depth)
    tokens = sum(r.stats.new_tokens for r in results)
    rounds = sum(r.stats.verifications for r in results)
    drafted = sum(r.stats.draft_depth for r in results)
    return {"tau": tokens / max(rounds, 1), "acceptance": sum(r.stats.accepted for r in results) / max(drafted, 1),
            "prompts": len(prompts), "tokens": tokens, "depth": depth, "temperature": temperature}
