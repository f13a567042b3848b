"""The target's own hidden states, handed to a drafter that reads them (EAGLE-style features).

A one-layer drafter that sees only token embeddings has to re-derive the context from scratch;
the target has already computed it. EAGLE (Li et al. 2024), and ParallelSpec on top of it, feed
the drafter the target's last hidden state: at the entry of token x_p the drafter reads
emb(x_p) and f_{p-1}, the target's final hidden state at position p-1 (the one that scored x_p).
Every f the drafter needs exists by the time it drafts:

    prompt    the target's prefill scores x_0..x_{P-2}: f_0..f_{P-2}
    a round   the target's verification scores its pending tokens and the tree; the entries it
              commits (pending + accepted path) give f for those positions, so the next round's
              pending tokens x_a..x_b (accepted drafts + the bonus token) have f_{a-1}..f_{b-1}

`TargetHidden` captures f from the target's base model (a forward hook: stock modeling code, and
it sees every position, also when the LM head runs on the last one only); `FeatureLog` keeps a
sequence's f by position until the drafter has consumed them. A [MASK] reads its anchor's f;
entries that have no f (the first prompt token, padding) read zeros. The drafter's q changes, the verifier does not, so
output stays exactly the target's (tests/test_target_features.py).
"""
from __future__ import annotations

import threading

import torch

from . import row_attention
from .hidden_capture import HiddenCapture


class TargetHidden(HiddenCapture):
    """The target's final hidden states [rows, entries, hidden] of the current thread's last forward
    (`take_rows`: a packed batched forward's rows unpacked and right-padded, row b's first n_b entries
    its own)."""

    def __init__(self, model):
        self._local = threading.local()
        self._handle = model.base_model.register_forward_hook(self._output_hook)

    def _output_hook(self, module, args, output) -> None:
        hidden = output.last_hidden_state if hasattr(output, "last_hidden_state") else output[0]
        self._local.hidden = row_attention.unpacked(hidden.detach())  # [rows, entries, hidden]


class FeatureLog:
    """One sequence's target hidden states by token position, kept until its drafter has read them."""

    def __init__(self, size: int):
        self.size = size
        self._by_pos: dict[int, torch.Tensor] = {}

    def put(self, start: int, hidden: torch.Tensor) -> None:
        """f for positions start, start+1, ... (hidden: [n, size])."""
        for j in range(hidden.shape[0]):
            self._by_pos[start + j] = hidden[j]

    def slots(self, start: int, end: int) -> torch.Tensor:
        """What the drafter's entries of tokens start..end-1 read: f_{p-1} each (zeros at p = 0)."""
        rows = []
        for p in range(start, end):
            if p == 0:
                rows.append(None)
                continue
            f = self._by_pos.get(p - 1)
            if f is None:
                raise RuntimeError(f"the target's hidden state at position {p - 1} was never recorded")
            rows.append(f)
        like = next((r for r in rows if r is not None), None)
        if like is None:
            return torch.zeros(end - start, self.size)
        return torch.stack([torch.zeros_like(like) if r is None else r for r in rows])

    def drop_before(self, position: int) -> None:
        for p in [p for p in self._by_pos if p < position]:
            del self._by_pos[p]


def placed_features(features: list[torch.Tensor | None], shape: tuple[int, int], slots: list[tuple[int, int]],
                    size: int, dtype, device) -> torch.Tensor:
    """[rows, entries, size] of zeros with features[i] at batch row slots[i][0], from entry slots[i][1]
    on (a packed batch: one row, each sequence at its offset; the copying fallback: a row each)."""
    out = torch.zeros(*shape, size, dtype=dtype, device=device)
    for f, (row, start) in zip(features, slots):
        if f is not None and f.shape[0]:
            out[row, start: start + f.shape[0]] = f.to(device=device, dtype=dtype)
    return out
