"""A row's transformers `Cache`, backed by its model runtime's KV pool (kv_pool.py, model_runtime.py).

The keys and values live in the pool; a row holds only its table line (which slots, in order). A fork
of a prompt holds the same slots as its parent for the shared prefix (counted, never copied) and new
slots for what it adds. Batched forwards (row_attention.py) read the pool directly. The stock attention
path (models whose attention cannot read the pool, and pipeline stages, which call decoder layers
themselves) goes through `update`, which stores the new entries and returns the row's whole history
gathered from its slots (a copy, counted in `copy_s`).
"""
from __future__ import annotations

import time
import weakref
from contextlib import contextmanager

from transformers.cache_utils import Cache, CacheLayerMixin

from .kv_pool import KVPool, Line, ScoringPlan


class RowLayer(CacheLayerMixin):
    """One layer of one row, as transformers' cache bookkeeping and inspection see it."""

    is_sliding = False  # every entry is kept: windows are applied by the masks, as for DynamicLayer
    is_croppable = False

    def __init__(self, owner: "RowCache", layer_idx: int):
        # a proxy, not a reference: no cycle, so a row's slots are freed as soon as the row is dropped
        self.owner, self.layer_idx = weakref.proxy(owner), layer_idx
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states) -> None:
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        return self.owner.update(key_states, value_states, self.layer_idx)

    def _history(self, which: int):
        owner = self.owner
        if owner.line is None or not owner.line.length or not owner.pool.has_layer(self.layer_idx):
            return None
        entries = owner.pool.read(self.layer_idx, owner.pool.slots_of(owner.line).to(owner.pool.device))[which]
        return entries.transpose(0, 1)[None]  # [1, kv_heads, length, head_dim], as a DynamicLayer holds it

    @property
    def keys(self):
        """The row's keys of this layer [1, kv_heads, length, head_dim] (a copy; None before any entry)."""
        return self._history(0)

    @property
    def values(self):
        return self._history(1)

    def get_seq_length(self) -> int:
        return self.owner.get_seq_length()

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.get_seq_length() + query_length, 0

    def get_max_length(self) -> int:
        return -1


class RowCache(Cache):
    """One row's cache in one model: its pool line, bound on the row's first forward."""

    def __init__(self, pool: KVPool | None = None, parent: Line | None = None, length: int = 0):
        super().__init__(layers=[])
        self.copy_s = 0.0
        self.pool = pool
        self.line = None if pool is None else (pool.fork_line(self, parent, length) if parent is not None
                                               else pool.new_line(self))
        self._plan: ScoringPlan | None = None  # the forward in flight through `update` (stock attention)
        self._past = 0

    def bind(self, pool: KVPool) -> None:
        """Store this row in `pool` (its model runtime's); a row's entries never move between pools."""
        if self.pool is None:
            self.pool, self.line = pool, pool.new_line(self)
        elif self.pool is not pool:
            raise RuntimeError("this cache's entries live in another pool: a KVCache is scored through one "
                               "ModelRuntime (one model, one engine)")

    @property
    def length(self) -> int:
        return 0 if self.line is None else self.line.length

    def fork(self, length: int) -> "RowCache":
        if self.pool is None or not length:
            return RowCache(self.pool)
        return RowCache(self.pool, self.line, length)

    @property
    def layers(self) -> list[RowLayer]:
        """One RowLayer per layer the pool stores (transformers' bookkeeping and inspection)."""
        stored = 0 if self.pool is None else max(self.pool.keys, default=-1) + 1
        while len(self._layers) < stored:
            self._layers.append(RowLayer(self, len(self._layers)))
        return self._layers

    @layers.setter
    def layers(self, value) -> None:  # transformers' Cache.__init__ sets the list
        self._layers = list(value)

    def layer(self, layer_idx: int) -> RowLayer:
        while len(self._layers) <= layer_idx:
            self._layers.append(RowLayer(self, len(self._layers)))
        return self._layers[layer_idx]

    @contextmanager
    def scoring(self, pool: KVPool, n_new: int):
        """A stock-attention forward of `n_new` entries: `update` stores them and returns the history."""
        self.bind(pool)
        past = self.length
        with pool.scoring([self.line], [n_new]) as plan:
            self._plan, self._past = plan, past
            try:
                yield plan
            finally:
                self._plan = None

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        plan = self._plan
        if plan is None:
            raise RuntimeError("a RowCache is written inside `scoring` (KVCache.forward or a stage's run)")
        self.layer(layer_idx)
        self.pool.write(layer_idx, plan.write_slots, key_states[0].transpose(0, 1), value_states[0].transpose(0, 1))
        start = time.perf_counter()
        keys, values = self.pool.read(layer_idx, plan.read_index[0])
        self.copy_s += time.perf_counter() - start
        return keys.transpose(0, 1)[None], values.transpose(0, 1)[None]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._past if self._plan is not None else self.length

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0
