"""Per-row KV storage that grows in place (issue 10): the layout under `kv_cache.KVCache`.

Per layer, a row's keys/values live in preallocated buffers with spare capacity, written in place
at [length, length + n) (growth by doubling: amortised O(1) per token, the rare regrowth counted
in `copy_s`). A fork of a prompt reads its parent's committed prefix as read-only segments (views
of the parent's buffers) and writes only into its own buffers; the parent only ever writes past
what it shared. So a row's history is a list of segments, which row_attention.py reads where they
lie; stock attention (single-row forwards) gets one view, or, for a forked row on a model that
cannot read segments, the segments joined (a copy, counted).
"""
from __future__ import annotations

import time

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

MIN_CAPACITY = 64


def _writable(buffer: torch.Tensor):
    """Buffers allocated under torch.inference_mode (pipeline stages) may only be written in it."""
    return torch.inference_mode(buffer.is_inference())


def _joined(parts: list[torch.Tensor]) -> torch.Tensor | None:
    if len(parts) <= 1:
        return parts[0] if parts else None
    return torch.cat(parts, dim=-2)


class RowLayer(CacheLayerMixin):
    """One layer of one row: read-only shared segments (a parent's prefix) + own growable buffers."""

    is_sliding = False  # every entry is kept: windows are applied by the masks, as for DynamicLayer
    is_croppable = False

    def __init__(self, owner: "RowCache", shared: list | None = None):
        self.owner = owner
        self.shared = list(shared or [])  # [(keys, values)] views [1, H, L, D] of others' storage: never written
        self.own_keys = self.own_values = None  # [1, H, capacity, D]
        self.n_own = 0
        self.is_initialized = bool(self.shared)

    def lazy_initialization(self, key_states, value_states) -> None:
        self.is_initialized = True

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Write new entries [1, H, n, D] after the row's last one, in place (regrow if full)."""
        n = keys.shape[-2]
        need = self.n_own + n
        if self.own_keys is None or need > self.own_keys.shape[-2]:
            start = time.perf_counter()
            capacity = max(MIN_CAPACITY, 2 * need)
            shape = (1, keys.shape[1], capacity, keys.shape[-1])
            new_keys, new_values = keys.new_empty(shape), values.new_empty(shape[:-1] + (values.shape[-1],))
            if self.n_own:
                new_keys[:, :, :self.n_own] = self.own_keys[:, :, :self.n_own]
                new_values[:, :, :self.n_own] = self.own_values[:, :, :self.n_own]
            self.own_keys, self.own_values = new_keys, new_values
            self.owner.copy_s += time.perf_counter() - start
        with _writable(self.own_keys):
            self.own_keys[:, :, self.n_own:need] = keys
            self.own_values[:, :, self.n_own:need] = values
        self.n_own = need
        self.is_initialized = True

    def segments(self) -> list:
        """The row's history as views, in order: shared prefix segments, then its own entries."""
        own = [(self.own_keys[:, :, :self.n_own], self.own_values[:, :, :self.n_own])] if self.n_own else []
        return self.shared + own

    def update(self, key_states, value_states, *args, **kwargs):
        """The stock attention's path (single-row forwards): append, return the whole history. A view
        of the own buffers; a forked row's history spans segments, so it is joined (a copy, counted)."""
        self.append(key_states, value_states)
        start = time.perf_counter()
        keys, values = self.keys, self.values
        if self.shared:
            self.owner.copy_s += time.perf_counter() - start
        return keys, values

    @property
    def keys(self):
        """The whole history (for inspection and the copying fallback): a view when it is one segment,
        else joined (a copy); None before any entry."""
        return _joined([k for k, _ in self.segments()])

    @property
    def values(self):
        return _joined([v for _, v in self.segments()])

    def get_seq_length(self) -> int:
        return sum(k.shape[-2] for k, _ in self.shared) + self.n_own

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_max_length(self) -> int:
        return -1

    def keep_tail(self, start: int, entries: list[int]) -> None:
        """Own entries start+entries[i] move to start+i, in place; everything after is dropped."""
        moved = next((i for i, e in enumerate(entries) if e != i), len(entries))  # entries before stay put
        if moved < len(entries):
            index = torch.tensor(entries[moved:], dtype=torch.long, device=self.own_keys.device) + start
            first, end = start + moved, start + len(entries)
            with _writable(self.own_keys):
                self.own_keys[:, :, first:end] = self.own_keys.index_select(2, index)  # gathered first: no overlap
                self.own_values[:, :, first:end] = self.own_values.index_select(2, index)
        self.n_own = start + len(entries)


class RowCache(Cache):
    """A row's transformers `Cache`: one RowLayer per decoder layer (created on first use)."""

    def __init__(self, shared_layers: list[list] | None = None):
        super().__init__(layers=[])
        self.copy_s = 0.0
        self.layers = [RowLayer(self, shared) for shared in (shared_layers or [])]

    def layer(self, layer_idx: int) -> RowLayer:
        while len(self.layers) <= layer_idx:
            self.layers.append(RowLayer(self))
        return self.layers[layer_idx]

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        return self.layer(layer_idx).update(key_states, value_states)

    @property
    def forked(self) -> bool:
        return any(layer.shared for layer in self.layers)
