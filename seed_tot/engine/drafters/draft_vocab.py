"""A drafter's own vocabulary: score only the frequent tokens in the draft's LM head (after FR-Spec).

A small model's LM head is most of a one-layer drafter's forward (on the embedded SmolLM2-135M the
shared head is 49,152 x 576; docs/benchmarks.md has its share), and a product over only the most
frequent rows costs a fraction of it. FR-Spec (Zhao et al. 2025) drafts from such a
frequency-ranked subset; the target still verifies over the whole vocabulary.

Lossless as every other draft: `TrimmedHead` returns full-width logits with -inf outside the
subset, so q (what the policy samples from and what the verifier sees, processed by the same
`process_logits`) is exactly 0 there. A token outside the subset is never drafted; when the target
wants one, the draft is rejected at that position and the target's residual (p - q)+ emits it.
Greedy drafts take q's argmax over the subset and the verifier checks them against the target's.

On disk: DIR/draft_vocab.safetensors, one int64 tensor "token_ids" (sorted, unique), written by
`seed-tot drafter-vocab` or by `train-drafter` from the text the drafter was trained on.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Iterable

import torch
from torch import nn

VOCAB_FILE = "draft_vocab.safetensors"


class TrimmedHead(nn.Module):
    """The target's LM head restricted to `token_ids` rows; -inf logits for every other token.

    `weight` is still the full head's (its shape is what the engine checks vocabularies against);
    the restricted rows are a runtime copy (|subset| x hidden), never saved with the drafter."""

    def __init__(self, head: nn.Module, token_ids: torch.Tensor):
        super().__init__()
        rows = head.weight.shape[0]
        ids = torch.unique(token_ids.long().flatten())  # sorted, no duplicates
        if ids.numel() == 0 or int(ids[0]) < 0 or int(ids[-1]) >= rows:
            raise ValueError(f"a draft vocabulary holds token ids in 0..{rows - 1}, got "
                             f"{ids.numel()} ids in {int(ids.min()) if ids.numel() else '-'}.."
                             f"{int(ids.max()) if ids.numel() else '-'}")
        self.__dict__["full"] = head  # shared with the target: not a submodule, not saved
        device = head.weight.device
        self.register_buffer("token_ids", ids.to(device), persistent=False)
        self.register_buffer("rows", head.weight.detach()[self.token_ids].clone(), persistent=False)
        bias = getattr(head, "bias", None)
        self.register_buffer("bias", None if bias is None else bias.detach()[self.token_ids].clone(), persistent=False)

    @property
    def weight(self) -> torch.Tensor:
        return self.full.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        small = nn.functional.linear(hidden, self.rows, self.bias)
        out = small.new_full(hidden.shape[:-1] + (self.full.weight.shape[0],), float("-inf"))
        return out.index_copy_(-1, self.token_ids, small)


def frequent_tokens(token_lists: Iterable[Iterable[int]], size: int, always: Iterable[int] = (),
                    exclude: Iterable[int] = ()) -> torch.Tensor:
    """The `size` most frequent ids of `token_lists` that are not in `exclude` (ties: smaller id
    first), plus every id in `always` (special tokens: EOS must stay draftable), sorted."""
    if size < 1:
        raise ValueError(f"a draft vocabulary needs size >= 1, got {size}")
    skip = set(exclude)
    counts = Counter(t for tokens in token_lists for t in tokens if t not in skip)
    ranked = sorted(counts, key=lambda t: (-counts[t], t))[:size]
    return torch.tensor(sorted(set(ranked) | set(always)), dtype=torch.long)


def coverage(token_ids: torch.Tensor, token_lists: Iterable[Iterable[int]]) -> float:
    """The share of token occurrences in `token_lists` that the vocabulary holds."""
    keep = set(token_ids.tolist())
    total = hit = 0
    for tokens in token_lists:
        for t in tokens:
            total += 1
            hit += t in keep
    return hit / total if total else 0.0


def save_vocab(directory, token_ids: torch.Tensor) -> Path:
    from safetensors.torch import save_file

    path = Path(directory) / VOCAB_FILE
    save_file({"token_ids": token_ids.long().contiguous().cpu()}, str(path))
    return path


def load_vocab(directory) -> torch.Tensor | None:
    """DIR's draft vocabulary, or None when it has none."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(str(directory)).expanduser() / VOCAB_FILE
    if not path.is_file():
        return None
    try:
        tensors = load_file(str(path))
    except SafetensorError as err:
        raise ValueError(f"{path}: not a readable safetensors file ({err})") from None
    ids = tensors.get("token_ids")
    if ids is None or ids.dim() != 1 or ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"{path}: expected one 1-D integer tensor 'token_ids', found {sorted(tensors)}")
    return ids.long()
