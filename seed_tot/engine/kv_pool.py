"""Preallocated KV storage of one model: every row's keys and values in one tensor per layer.

vLLM's paged layout at a page size of one token. Per layer, keys are one tensor [slots, kv_heads,
head_dim] (values likewise), and a row's history is its line of the slot table, `table[line, :length]`,
in sequence order. So one forward writes every row's new entries with one `index_copy_` per layer and
reads every row's history with one `index_select` per layer, however many rows it carries. A row
joins (a free table line), forks (its parent's line copied and the shared slots counted once more:
no KV is copied), reorders its uncommitted tail (commit: only slot ids move) and leaves (its slots
freed once no other line holds them) without touching another row's storage.

Threads: SEED's draft workers forward one model on several threads at once. Slots are handed out
under a lock when a forward begins (`scoring`), so concurrent forwards write disjoint slots. Growth
doubles a storage tensor and copies it, which would lose what a forward in flight writes into the old
one, so growth waits until no forward of the pool is in flight. The table and the counts live on the
CPU and are touched only under the lock; the storage lives on the model's device.

Slot SCRATCH is never handed to a row: it is what padding reads (masked keys) and where padding
entries write (graphed_forward.py's fixed shapes), so a padding entry never touches a real row's
slot. Every slot is zeroed when a layer's storage is made or grows, so a masked read of any slot is finite
(attention="pool" scores every slot of the pool tiles it reads, written or not).
`generation` counts the storage tensors' reallocations: a CUDA graph holds their addresses.
"""
from __future__ import annotations

import threading
import time
import weakref
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from .host_to_device import to_device

MIN_SLOTS = 1024
MIN_WIDTH = 256
MIN_LINES = 16
SCRATCH = 0  # the slot padding reads and writes (see the module doc)


class Line:
    """A row's place in the pool: its table line and how many slots it holds (its history length)."""

    __slots__ = ("index", "length")

    def __init__(self, index: int, length: int = 0):
        self.index, self.length = index, length


# A forward of several rows reads the history they all hold in the same slots (forks of one prompt
# stretch: shared_prefill.py) once, for every row, when it is at least this long (row_attention.py).
MIN_SHARED_READ = 64


@dataclass
class ScoringPlan:
    """The slots of one forward: where each row's new entries go and what every row reads afterwards."""

    write_slots: torch.Tensor  # [sum n_new] on the storage device, the rows' new entries in packed order
    read_index: torch.Tensor  # [rows, longest history] on the storage device; padding reads SCRATCH (masked)
    # the first `shared` columns of read_index are the same slots in every row, all of them history:
    # `shared_slots` says where (a slice when they are consecutive slots, else their slot ids)
    shared: int = 0
    shared_slots: "slice | torch.Tensor | None" = None


class KVPool:
    """The KV storage of one model (see the module doc)."""

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.keys: dict[int, torch.Tensor] = {}  # layer -> [capacity, kv_heads, head_dim]
        self.values: dict[int, torch.Tensor] = {}
        self.capacity = 0
        self.refs = torch.zeros(0, dtype=torch.int32)  # per slot: how many table lines hold it
        self.free = torch.zeros(0, dtype=torch.long)  # a stack of free slots: free[:n_free]
        self.n_free = 0
        self.table = torch.zeros(0, MIN_WIDTH, dtype=torch.long)
        self.free_lines: list[int] = []
        self.copy_s = 0.0  # seconds spent growing the storage (the one KV copy left)
        self.generation = 0  # bumped whenever a storage tensor is (re)allocated: graphs hold the old addresses
        self._cond = threading.Condition()
        self._create = threading.Lock()
        self._in_flight = 0
        self._released: list[Line] = []  # lines of rows collected since the last drain
        # (line index, start, end): uncommitted tails that commits dropped since the last drain, freed
        # together there (one gather and one count update per step, not a handful of ops per row)
        self._dropped: list[tuple[int, int, int]] = []

    # ------------------------------------------------------------------ lines
    # the table and counts are bookkeeping, updated in place from any mode: never inference tensors
    @torch.inference_mode(False)
    def new_line(self, owner) -> Line:
        """An empty line for the row `owner`; its slots are freed when `owner` is collected."""
        with self._cond:
            return self._line(owner, 0)

    @torch.inference_mode(False)
    def fork_line(self, owner, parent: Line, length: int) -> Line:
        """A line whose history is the first `length` slots of `parent`'s (shared: counted, not copied)."""
        with self._cond:
            line = self._line(owner, length)
            self._ensure_width(length)
            shared = self.table[parent.index, :length]
            self.table[line.index, :length] = shared
            self.refs.index_add_(0, shared, torch.ones(length, dtype=torch.int32))
            return line

    def _line(self, owner, length: int) -> Line:
        self._drain()
        if not self.free_lines:
            old = self.table.shape[0]
            grown = torch.zeros(max(MIN_LINES, 2 * old), self.table.shape[1], dtype=torch.long)
            grown[:old] = self.table
            self.table = grown
            self.free_lines = list(range(grown.shape[0] - 1, old - 1, -1))
        line = Line(self.free_lines.pop(), length)
        # a row is let go by the garbage collector, on any thread, maybe while this lock is held:
        # the finalizer only queues its line (list.append is atomic), the next pool call frees it
        weakref.finalize(owner, self._released.append, line)
        return line

    @torch.inference_mode(False)
    def collect(self) -> None:
        """Free now what rows collected since the last pool call held (every pool call does it first)."""
        with self._cond:
            self._drain()

    def _drain(self) -> None:
        """Free what was let go since the last pool call. Every call that writes the table drains
        first, so a dropped tail's slot ids are still in the table when they are read here."""
        if self._dropped:
            dropped, self._dropped = self._dropped, []
            rows = [index for index, start, end in dropped for _ in range(start, end)]
            cols = [col for _, start, end in dropped for col in range(start, end)]
            # no slot twice: an uncommitted entry's slot belongs to its line alone (forks share committed ones)
            self._unref(self.table[rows, cols])
        while self._released:
            line = self._released.pop()
            if line.length:
                self._unref(self.table[line.index, :line.length])
            line.length = 0
            self.free_lines.append(line.index)

    def _unref(self, slots: torch.Tensor) -> None:
        self.refs.index_add_(0, slots, torch.full(slots.shape, -1, dtype=torch.int32))
        freed = slots[self.refs[slots] == 0]
        self.free[self.n_free: self.n_free + freed.numel()] = freed
        self.n_free += freed.numel()

    def keep(self, line: Line, start: int, entries: list[int]) -> None:
        """Entries start+entries[i] of `line` move to start+i; every other entry from `start` on is dropped.
        Entries that are a prefix (every chain's acceptance) stay where they are: only the length moves,
        and the dropped rest is freed at the next drain with every other row's."""
        n = len(entries)
        if entries == list(range(n)):
            with self._cond:
                if start + n < line.length:
                    self._dropped.append((line.index, start + n, line.length))
                line.length = start + n
            return
        self._reorder(line, start, entries)

    @torch.inference_mode(False)
    def _reorder(self, line: Line, start: int, entries: list[int]) -> None:
        with self._cond:
            self._drain()  # this writes the line's table: none of its old slots may still wait to be freed
            tail = self.table[line.index, start:line.length].clone()
            kept = tail[torch.tensor(entries, dtype=torch.long)] if entries else tail[:0]
            dropped = torch.ones(tail.numel(), dtype=torch.bool)
            dropped[entries] = False
            self.table[line.index, start:start + len(entries)] = kept
            line.length = start + len(entries)
            if bool(dropped.any()):
                self._unref(tail[dropped])

    def slots_of(self, line: Line) -> torch.Tensor:
        with self._cond:
            return self.table[line.index, :line.length].clone()

    # ------------------------------------------------------------------ forwards
    @contextmanager
    def scoring(self, lines: list[Line], n_new: list[int], on_device: bool = True, find_shared: bool = True):
        """Hand out slots for a forward that adds n_new[b] entries to row b; yields a ScoringPlan
        (on the host where not on_device: a fixed-shape forward copies it into its own buffers).
        find_shared=False: the caller reads no shared history (the copied fallback), so none is looked for.
        The rows' lengths grow at once: the forward writes every layer before anyone reads them."""
        total = sum(n_new)
        with self._cond, torch.inference_mode(False):
            self._drain()
            if self.n_free < total:
                while self._in_flight:  # growth copies the storage: no forward may be writing into it
                    self._cond.wait()
                self._grow(total)
            slots = self.free[self.n_free - total: self.n_free].flip(0)  # lowest first: the stack's top
            self.n_free -= total
            self.refs[slots] = 1
            lengths = [line.length + n for line, n in zip(lines, n_new)]
            width = max(lengths, default=0)
            self._ensure_width(width)
            shared, shared_slots = 0, None
            if len(lines) == 1:  # one row (every forward of ar, sd and prefill): plain slices, no index tensors
                line = lines[0]
                self.table[line.index, line.length: width] = slots
                read = self.table[line.index: line.index + 1, :width].clone()
            else:
                if total:
                    rows = torch.tensor([line.index for line, n in zip(lines, n_new) for _ in range(n)])
                    cols = torch.tensor([line.length + i for line, n in zip(lines, n_new) for i in range(n)])
                    self.table[rows, cols] = slots
                read = self.table[[line.index for line in lines], :width]
                if on_device and find_shared:  # a fixed-shape forward (on_device=False) copies only the read table into its buffers
                    shared, shared_slots = _shared_history(read, min(line.length for line in lines))
                if min(lengths) < width:  # a row shorter than the longest reads SCRATCH past its end: its mask hides those keys
                    read = read.masked_fill(torch.arange(width)[None] >= torch.tensor(lengths)[:, None], SCRATCH)
            before = [line.length for line in lines]
            for line, length in zip(lines, lengths):
                line.length = length
            self._in_flight += 1
        try:
            on_host = self.device.type == "cpu" or not on_device  # no transfer to make, not even a no-op one
            if isinstance(shared_slots, torch.Tensor) and not on_host:
                shared_slots = to_device(shared_slots, self.device)
            yield ScoringPlan(slots if on_host else to_device(slots, self.device),
                              read if on_host else to_device(read, self.device), shared, shared_slots)
        except BaseException:
            # a forward that failed (an OOM half-way) wrote some layers' entries and no caller will
            # count them: each row's history is what it was, and the slots go back at the next drain
            # (a row retried alone must not read them as its own keys)
            with self._cond:
                for line, length in zip(lines, before):
                    if line.length > length:
                        self._dropped.append((line.index, length, line.length))
                    line.length = length
            raise
        finally:
            with self._cond:
                self._in_flight -= 1
                self._cond.notify_all()

    def read_shared(self, layer: int, slots: "slice | torch.Tensor") -> tuple[torch.Tensor, torch.Tensor]:
        """The entries at `slots` (a slice: a view of the storage, nothing copied): [n, kv_heads, head_dim] each."""
        if isinstance(slots, slice):
            return self.keys[layer][slots], self.values[layer][slots]
        return self.read(layer, slots)

    def _grow(self, need: int) -> None:
        start = time.perf_counter()
        old = self.capacity
        capacity = max(MIN_SLOTS, 2 * old, old + 2 * need)
        for store in (self.keys, self.values):
            for layer, tensor in store.items():
                grown = tensor.new_empty((capacity,) + tensor.shape[1:])
                grown[:old] = tensor
                grown[old:].zero_()  # never-written slots stay finite (see `write`)
                store[layer] = grown
        refs = torch.zeros(capacity, dtype=torch.int32)
        refs[:old] = self.refs
        free = torch.empty(capacity, dtype=torch.long)
        free[: self.n_free] = self.free[: self.n_free]
        first = max(old, SCRATCH + 1)  # the scratch slot is never free: no row ever holds it
        free[self.n_free: self.n_free + capacity - first] = torch.arange(capacity - 1, first - 1, -1)
        refs[SCRATCH] = 1
        self.refs, self.free, self.n_free, self.capacity = refs, free, self.n_free + capacity - first, capacity
        if self.keys:
            self.generation += 1
        if old:
            self.copy_s += time.perf_counter() - start

    def _ensure_width(self, width: int) -> None:
        if width > self.table.shape[1]:
            grown = torch.zeros(self.table.shape[0], max(2 * self.table.shape[1], width), dtype=torch.long)
            grown[:, : self.table.shape[1]] = self.table
            self.table = grown

    # ------------------------------------------------------------------ storage
    def write(self, layer: int, slots: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Store new entries keys [n, kv_heads, head_dim] (values likewise) at `slots`, in place."""
        if layer not in self.keys:
            # two threads may bring the same layer's first entries; a normal tensor, not an inference
            # one, so that a forward in any mode writes it without entering inference mode first
            with self._create, torch.inference_mode(False):
                if layer not in self.keys:
                    for store, like in ((self.values, values), (self.keys, keys)):
                        # zeros, not empty: masked reads must be finite (0 * NaN is NaN), and
                        # attention="pool" reads every slot of a pool tile, written or not
                        store[layer] = like.new_zeros((self.capacity,) + like.shape[1:])
                    self.generation += 1
        self.keys[layer].index_copy_(0, slots, keys)
        self.values[layer].index_copy_(0, slots, values)

    def read(self, layer: int, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The entries at `index` (any shape): keys [*index.shape, kv_heads, head_dim], values likewise."""
        keys, values = self.keys[layer], self.values[layer]
        flat = index.reshape(-1)
        return (keys.index_select(0, flat).view(*index.shape, *keys.shape[1:]),
                values.index_select(0, flat).view(*index.shape, *values.shape[1:]))

    def has_layer(self, layer: int) -> bool:
        return layer in self.keys

    def bytes_per_slot(self) -> int:
        return sum(t.shape[1:].numel() * t.element_size() for store in (self.keys, self.values) for t in store.values())


def _shared_history(read: torch.Tensor, history: int) -> tuple[int, "slice | torch.Tensor | None"]:
    """How many leading columns of `read` [rows, width] are the same slots in every row, within the
    first `history` columns (what every row held before this forward), if at least MIN_SHARED_READ,
    and where they are (a slice of the storage when consecutive, else their slot ids)."""
    if history < MIN_SHARED_READ:
        return 0, None
    # rows share slots only as forks share their parent's first ones, so what they share is a prefix:
    # rows that differ at the threshold's column share too little (one host read of a column, per forward)
    if len(set(read[:, MIN_SHARED_READ - 1].tolist())) > 1:
        return 0, None
    head = read[:, :history]
    differs = (head != head[:1]).any(0)
    shared = int(differs.int().argmax()) if bool(differs.any()) else history
    if shared < MIN_SHARED_READ:
        return 0, None
    slots = head[0, :shared]
    first = int(slots[0])
    if int(slots[-1]) - first == shared - 1 and bool((slots[1:] - slots[:-1] == 1).all()):
        return shared, slice(first, first + shared)
    return shared, slots.clone()
