"""The draft's final hidden states (the LM head's input) of a forward, captured by a hook.

Used by the policies that read the draft's hidden states (specdec, auto) and by target_features.py
for the target's; its own module so that the KV cache's layer does not reach the policy layer.
"""
from __future__ import annotations

import threading

import torch

from . import row_attention


class HiddenCapture:
    """The draft's final hidden states (the lm_head's input) of the current thread's last forward.
    A forward pre-hook, so the stock model and `KVCache.forward` stay as they are; thread-local
    because SEED runs several sequences' draft forwards on different threads at once. An engine's
    is its runtime's (`ModelRuntime.capture`), one per kind."""

    def __init__(self, model):
        self._local = threading.local()
        self._handle = model.get_output_embeddings().register_forward_pre_hook(self._hook)

    def _hook(self, module, args) -> None:
        self._local.hidden = row_attention.unpacked(args[0].detach())  # [rows, entries, hidden]

    def take_rows(self) -> torch.Tensor:
        """[rows, entries, hidden] of the last forward (a batched draft forward: one row per sequence,
        unpacked and right-padded; row b's first n_b entries are its own)."""
        hidden = getattr(self._local, "hidden", None)
        if hidden is None:
            raise RuntimeError(f"no hidden state was captured by {type(self).__name__}: the last forward on this "
                               f"thread did not reach the hooked layer")
        self._local.hidden = None
        return hidden

    def take(self) -> torch.Tensor:
        """[entries, hidden] of the last single-row forward."""
        return self.take_rows()[0]

    def remove(self) -> None:
        self._handle.remove()
