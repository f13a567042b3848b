"""The target's own next-token distributions as drafter labels (distillation for sampled decoding).

A drafter trained on the target's greedy tokens (hard labels) learns to put nearly all of q on one
token. When the target samples at temperature T, the verifier accepts a drafted x with probability
min(1, p(x) / q(x)), so a round's first token is accepted with probability sum_x min(p(x), q(x)):
small when p is broad and q is peaked, which is why the shipped greedy-trained drafter is accepted
far less often at T=1 than greedy (docs/benchmarks.md). Trained on p itself (cross-entropy against
p = KL(p || q) + p's entropy), q spreads the way p does.

p is the distribution the engine samples from at that temperature: softmax(logits / T) over the
target's logits at each response position (engine/sampling.py processes the same way; top-k and
top-p are not applied here). Each position keeps p's `top_k` most likely tokens, renormalized,
so the labels take top_k numbers per training token instead of a whole vocabulary's.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .samples import Sample

DEFAULT_TOP_K = 32


@dataclass
class SoftLabels:
    """p at the sample's positions offset, offset+1, ...; row i is the target's distribution for the
    token after position offset + i (offset = the first anchor, `anchors_of`: start - 1)."""

    offset: int
    ids: torch.Tensor  # [m, K] long, p's most likely tokens
    probs: torch.Tensor  # [m, K] float32, their probabilities renormalized to sum to 1


@torch.inference_mode()
def target_soft_labels(target, samples: list[Sample], temperature: float, top_k: int = DEFAULT_TOP_K,
                       progress=None) -> list[SoftLabels]:
    """One target forward per sample (the response positions only go through the LM head)."""
    if temperature <= 0:
        raise ValueError(f"soft labels need a sampling temperature > 0, got {temperature} (greedy: train on the "
                         f"responses' tokens)")
    device = next(target.parameters()).device
    out = []
    for sample in samples:
        offset = max(sample.start - 1, 0)
        ids = torch.tensor([sample.tokens[:-1]], device=device)  # the last token predicts nothing labelled
        logits = target(input_ids=ids, logits_to_keep=len(sample.tokens) - 1 - offset).logits[0].float()
        p = torch.softmax(logits / temperature, dim=-1)
        top = p.topk(min(top_k, p.shape[-1]), dim=-1)
        out.append(SoftLabels(offset, top.indices.cpu(), (top.values / top.values.sum(-1, keepdim=True)).cpu()))
        if progress is not None:
            progress(1)
    return out


def dense_targets(labels: SoftLabels, positions: torch.Tensor, lookup: torch.Tensor | None, n_rows: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """[R, n_rows] soft targets for the given sequence positions over the rows the drafter scores
    (lookup: token id -> row, -1 outside a draft vocabulary, whose tokens are dropped and the rest
    renormalized; None: every token is its own row), and a [R] mask of the positions that kept mass."""
    ids = labels.ids[positions - labels.offset]
    probs = labels.probs[positions - labels.offset].clone()
    rows = ids if lookup is None else lookup[ids]
    probs[rows < 0] = 0.0
    dense = torch.zeros(len(positions), n_rows).scatter_add_(1, rows.clamp(min=0), probs)
    mass = dense.sum(-1)
    kept = mass > 0
    return dense[kept] / mass[kept, None], kept
