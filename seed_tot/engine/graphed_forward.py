"""Fixed-shape batched forwards, replayed as CUDA graphs on CUDA (the host cost of a step is one replay).

An eager forward of a stock transformers model launches every kernel from Python: about a thousand
launches per step, whatever the rows carry, and on a GPU that host time is most of a decode step. A
CUDA graph records the kernels of one forward once and replays them for tens of microseconds, but a
graph has fixed shapes and fixed addresses. So `kv_cache.forward_batch` runs at a bucketed shape
(`Buckets`: rows, query entries per row, packed queries, history length, each rounded up), and the
rows' metadata is copied into static buffers of that bucket before each replay:

  ids, pos      [T]          the packed queries' tokens and positions (padding: token 0, position 0)
  write         [T]          where each packed query's keys/values go (padding: the pool's SCRATCH slot)
  out_index     [T]          where packed query j sits in the [R * W] layout (padding: cell 0, dropped)
  q_index       [R * W]      which packed query cell (b, i) is (padding cells: query 0, seeing nothing)
  read, key_pos [R, K]       every row's history slots and their positions (padding: SCRATCH, masked)
  query_pos     [R, W]       each cell's position
  allowed       [R, W, K]    who sees whom (tree structure); padding rows and cells see nothing

The additive masks (sliding windows included) are built from them inside the graph (masks.additive_masks).
Padding never changes a real row: a real query's mask hides every padding key, a padding query's keys
and values land in the scratch slot only, and its logits are dropped; every other op of a decoder is
per entry. On CUDA the graph's warm-up and capture run on the first step of a bucket, and every later
step of that bucket replays it; growth of the pool reallocates the storage the graph points into, so
its graphs are dropped and captured again. On the CPU the same static path runs eagerly (no capture),
and only where asked (`forward_batch(..., fixed_shapes=True)`, or compiled forwards): padding adds
arithmetic there, with no launch cost to save, so the CPU default stays the exact-size packed forward.
Where the runtime compiles (compiled_forward.py; on CUDA by default), the bucket's forward is the
inductor-compiled one, and the captured graph records its fused kernels.

What a graph cannot serve runs at its exact size (`bucket` returns None): a drafter's target features
(an extra per-row input), a model with hidden-state capture hooks (Python a replay would skip), a
forward above the buckets (a long prompt's prefill). A model whose forward cannot be captured (a hook
found on it, a rotary embedding that branches on positions on the host, a capture that fails) runs
its fixed shapes eagerly, logged once.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import NamedTuple

import torch

from . import row_attention
from .cache_argument import cache_kwargs
from .compiled_forward import CompiledForward, CompileSettings
from .kv_pool import SCRATCH
from .masks import AttentionLayout, additive_masks

log = logging.getLogger(__name__)

WARMUP = 2  # eager runs before a capture: the first may take lazy-initialisation paths (cuBLAS workspaces)
# rotary embeddings that compare the largest position with a cached length on the host every forward
HOST_BRANCHING_ROPE = ("dynamic", "longrope")


class Shape(NamedTuple):
    rows: int  # R: the rows of the forward; rows past the real ones are padding rows
    width: int  # W: query entries per row in the attention's [R, W] layout
    tokens: int  # T: packed queries the linear layers run
    keys: int  # K: history entries every row reads


def _round_up(n: int, fine: int) -> int:
    """Powers of two up to `fine`, then multiples of `fine`."""
    if n <= fine:
        return 1 << max(n - 1, 0).bit_length()
    return -(-n // fine) * fine


@dataclass(frozen=True)
class Buckets:
    """The rule that rounds a forward's sizes up to a bucket (each bucket is one CUDA graph).

    Few buckets, because each costs a capture and its own graph; little padding, because padding is
    arithmetic spent on nothing. A decode step is memory-bound (the weights are read once whatever
    the rows), so rows and queries round to powers of two and then to multiples of `fine_*` (vLLM's
    batch sizes follow the same rule); histories round to multiples of `history_step`, coarser as they
    grow so the padding stays under an eighth and the number of history buckets grows with log(K).
    A forward above the maxima (a long prompt's prefill) runs eagerly: its cost is arithmetic, not
    launches, and its shape is seen once."""

    fine_rows: int = 8
    max_rows: int = 256
    max_width: int = 64
    fine_tokens: int = 32
    max_tokens: int = 512
    max_cells: int = 4096  # R * W: the attention's layout (a lone wide row among many short ones wastes it)
    history_step: int = 256

    def shape(self, n_new: list[int], n_keys: int) -> Shape | None:
        """The bucket of a forward of rows adding n_new[b] entries and reading n_keys history entries
        at most (None: too large for a fixed shape)."""
        rows = _round_up(len(n_new), self.fine_rows)
        width = _round_up(max(n_new), self.max_width)
        n_real = sum(n_new)
        # one entry per row: packed query b is row b's, so the packed sequence has one query per row
        tokens = rows if width == 1 else min(_round_up(n_real, self.fine_tokens), rows * width)
        if rows > self.max_rows or width > self.max_width or tokens > self.max_tokens or rows * width > self.max_cells:
            return None
        step = max(self.history_step, (1 << (n_keys - 1).bit_length()) // 8)
        return Shape(rows, width, tokens, max(1, -(-n_keys // step) * step))


DEFAULT_BUCKETS = Buckets()


class _Static:
    """One bucket's input buffers: a host copy filled each step, the device copy the forward reads
    (one buffer on the CPU), and on CUDA the captured graph and its output."""

    NAMES = ("ids", "pos", "write", "out_index", "read", "key_pos", "q_index", "query_pos")

    def __init__(self, shape: Shape, device: torch.device, dtype: torch.dtype):
        rows, width, tokens, keys = shape
        dims = [(tokens,)] * 4 + [(rows, keys)] * 2 + [(rows * width,), (rows, width)]
        sizes = [torch.Size(d).numel() for d in dims]
        # every integer input in one tensor: one host-to-device copy per step, not eight
        self.host = torch.zeros(sum(sizes), dtype=torch.long)
        self.host_allowed = torch.zeros(rows, width, keys, dtype=torch.bool)
        on_host = device.type == "cpu"
        self.meta = self.host if on_host else torch.zeros_like(self.host, device=device)
        self.allowed = self.host_allowed if on_host else torch.zeros_like(self.host_allowed, device=device)
        self.h = dict(zip(self.NAMES, (v.view(d) for v, d in zip(self.host.split(sizes), dims))))
        self.d = dict(zip(self.NAMES, (v.view(d) for v, d in zip(self.meta.split(sizes), dims))))
        self.placeholder = torch.zeros(1, 1, tokens, 1, dtype=dtype, device=device)  # masks are per row: never read
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None  # the graph's output [T, V], overwritten by every replay


class GraphedForward:
    """The fixed-shape forwards of one model: static buffers per bucket and, on CUDA, a graph per bucket."""

    def __init__(self, model, attend=None, compile: CompileSettings = CompileSettings()):
        self.device, self.dtype = model.device, model.dtype  # no reference to the model: it owns this
        self.attend = attend  # attention="pool"'s FlexAttention function (ModelRuntime.flex); None: gather
        # the bucket's forward compiled by inductor (compiled_forward.py); None: the stock forward
        self.compile_settings = compile
        # a forward that holds FlexAttention compiles it with inductor's FlexAttention template, used on
        # CUDA only (model_runtime.py says why): on other devices those forwards run uncompiled, said once
        pooled_off_cuda = attend is not None and self.device.type != "cuda"
        self.compiled = (CompiledForward(type(model).__name__, compile)
                         if compile.on(self.device) and not pooled_off_cuda else None)
        if compile.on(self.device) and pooled_off_cuda:
            log.warning("%s's fixed-shape forwards run uncompiled on %s with attention=pool: compiled "
                        "FlexAttention is used on CUDA only (model_runtime.py says why)", type(model).__name__,
                        self.device.type)
        self.graphs_on = self.device.type == "cuda"
        self.refused = graph_refusal(model) if self.graphs_on else None
        if self.refused:
            log.info("%s runs its fixed-shape forwards eagerly: %s", type(model).__name__, self.refused)
        self.statics: dict[Shape, _Static] = {}
        self.lock = threading.Lock()  # one set of static buffers per bucket: steps of one model take turns
        self.generation = -1  # the pool generation the graphs were captured against
        self.mempool = None  # one memory pool for every graph: replays never overlap (the lock, one stream)
        self.captures = 0  # graphs captured so far (a replayed bucket does not add one)
        self.replays = 0

    def run(self, model, layout: AttentionLayout, windows: list[int | None], pool, plan, shape: Shape,
            tokens: list[list[int]], n_new: list[int], allowed: torch.Tensor, query_pos: torch.Tensor,
            key_pos: torch.Tensor, keep: int = 0) -> torch.Tensor:
        """The logits [sum(n_new), V] of the real queries (the last `keep` of them where keep), with the
        rows' entries written to their plan's slots."""
        n_real = sum(n_new)
        first = n_real - keep if keep else 0
        with self.lock:
            static = self.statics.get(shape)
            if static is None:
                with torch.inference_mode(False):  # buffers every later step writes, in any mode
                    static = self.statics[shape] = _Static(shape, self.device, self.dtype)
            _fill(static, shape, plan, tokens, n_new, allowed, query_pos, key_pos)
            if static.meta is not static.host:  # pageable: staged at once, the host buffer is free again
                static.meta.copy_(static.host, non_blocking=True)
                static.allowed.copy_(static.host_allowed, non_blocking=True)
            at = 0
            for row in tokens:  # draft picks still on the device: copied there, into their place
                if isinstance(row, torch.Tensor):
                    static.d["ids"][at: at + len(row)].copy_(row)
                at += len(row)
            if not self.graphs_on or self.refused:
                return self._forward(model, layout, windows, pool, static, shape)[first:n_real]
            if pool.generation != self.generation:
                self._drop_graphs(pool, "the KV pool's storage was reallocated")
            if static.graph is None:
                try:
                    self._capture(model, layout, windows, pool, static, shape)
                except RuntimeError as exc:  # e.g. a host sync inside the forward: serve it eagerly from now on
                    self.refused = f"capturing its forward failed ({exc})"
                    log.warning("%s runs its fixed-shape forwards eagerly: %s", type(model).__name__, self.refused)
                    self._drop_graphs(pool, "a capture failed")
                    return self._forward(model, layout, windows, pool, static, shape)[first:n_real]
            static.graph.replay()
            self.replays += 1
            # a copy: the next replay of any bucket may reuse the output's memory (one shared pool)
            return static.logits[first:n_real].clone()

    @torch.no_grad()
    def _forward(self, model, layout, windows, pool, static: _Static, shape: Shape) -> torch.Tensor:
        """The forward of one bucket from its static device buffers; the graph records exactly this."""
        d = static.d
        pooled = self.attend is not None
        masks = {} if pooled else additive_masks(static.allowed, d["query_pos"], d["key_pos"], set(windows),
                                                  model.dtype)
        batch = row_attention.RowBatchCache(
            model.config, pool, d["write"], d["read"], masks, windows, shape.keys, rows=shape.rows,
            width=shape.width, n_query=shape.tokens, n_write=shape.tokens, one_each=shape.width == 1,
            q_index=d["q_index"], out_index=d["out_index"], attend=self.attend)
        if pooled:  # fixed shapes per bucket and pool generation (the graphs are captured again when it grows)
            batch.pool_masks(static.allowed, d["query_pos"], d["key_pos"])
        placeholder = static.placeholder
        mask = {t: placeholder for t in layout.windows} if layout.as_dict else placeholder
        inputs = dict(input_ids=d["ids"][None], position_ids=d["pos"][None], attention_mask=mask, use_cache=True,
                      **cache_kwargs(model, batch))
        with row_attention.active_batch(model, batch):
            # a model's first forward makes the pool's storage (under a lock): that one runs uncompiled
            compiled = self.compiled is not None and pool.has_layer(0)
            out = self.compiled(model, shape, inputs) if compiled else model(**inputs)
        return out.logits[0]

    def _capture(self, model, layout, windows, pool, static: _Static, shape: Shape) -> None:
        # warm-up on a side stream (torch.cuda.graphs' recipe); each run is this step's forward, and
        # writing the same keys/values to the same slots again changes nothing
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(WARMUP):
                self._forward(model, layout, windows, pool, static, shape)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        if pool.generation != self.generation:  # a model's first forward makes the pool's layers
            self._drop_graphs(pool, "the KV pool's storage was made")
        if self.mempool is None:
            self.mempool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        # thread_local: SEED's other threads may launch their own work while this thread captures
        with torch.cuda.graph(graph, pool=self.mempool, capture_error_mode="thread_local"):
            logits = self._forward(model, layout, windows, pool, static, shape)
        static.graph, static.logits = graph, logits
        self.captures += 1
        log.debug("captured %s's forward at %s (%d graphs)", type(model).__name__, shape, self.captures)

    def _drop_graphs(self, pool, why: str) -> None:
        """Forget every graph: they point into storage the pool no longer uses."""
        dropped = sum(s.graph is not None for s in self.statics.values())
        if dropped:
            log.info("dropping %d CUDA graphs: %s", dropped, why)
        for static in self.statics.values():
            static.graph = static.logits = None
        self.mempool = None  # its memory goes with the graphs that held it
        self.generation = pool.generation


def _fill(static: _Static, shape: Shape, plan, tokens: list[list[int]], n_new: list[int],
          allowed: torch.Tensor, query_pos: torch.Tensor, key_pos: torch.Tensor) -> None:
    """This step's rows into the bucket's host buffers: the real rows first, padding everywhere else.
    A fixed number of tensor ops, however many rows."""
    h = static.h
    rows, width = shape.rows, shape.width
    n_rows, n_query, n_keys = allowed.shape
    n_real = sum(n_new)
    static.host.zero_()
    if n_query == 1:  # one entry per row: packed query b is row b's
        packed = query_pos[:, 0]
        valid = None
    else:
        query = torch.arange(n_query)[None]
        valid = query < torch.tensor(n_new)[:, None]  # [B, Q]
        packed = query_pos[valid]  # row-major: the packed order
    # rows on the device are left as zeros here: `run` copies them in after the staging copy
    h["ids"][:n_real] = torch.tensor([t for row in tokens
                                      for t in ([0] * len(row) if isinstance(row, torch.Tensor) else row)])
    h["pos"][:n_real] = packed
    h["write"][:n_real] = plan.write_slots
    h["write"][n_real:] = SCRATCH
    h["read"].fill_(SCRATCH)
    h["read"][:n_rows, :n_keys] = plan.read_index
    h["key_pos"][:n_rows, :n_keys] = key_pos
    h["query_pos"][:n_rows, :n_query] = query_pos
    static.host_allowed.zero_()
    static.host_allowed[:n_rows, :n_query, :n_keys] = allowed
    if valid is not None:  # several entries in some row (width > 1): the [R, W] layout's indices
        starts = torch.tensor(n_new).cumsum(0) - torch.tensor(n_new)
        h["out_index"][:n_real] = (torch.arange(n_rows)[:, None] * width + query)[valid]  # padding: cell 0
        h["q_index"].view(rows, width)[:n_rows, :n_query] = (starts[:, None] + query).masked_fill_(~valid, 0)


def graph_refusal(model) -> str | None:
    """Why `model`'s forward cannot be captured (None: it can)."""
    for module in model.modules():
        if getattr(module, "rope_type", None) in HOST_BRANCHING_ROPE:
            return f"its {module.rope_type} rotary embedding compares positions on the host every forward"
        if module._forward_hooks or module._forward_pre_hooks:
            return "a forward hook on it runs Python that a replayed graph would skip"
    return None


def bucket(runtime, fixed_shapes: "bool | Buckets | None", features, n_new: list[int], n_keys: int
           ) -> tuple[GraphedForward, Shape] | None:
    """The runner of a model runtime (model_runtime.py) and the shape of a forward of rows adding
    n_new[b] entries (n_keys: the longest history after it), where this forward runs at a fixed shape;
    None: at its exact size. fixed_shapes None: on CUDA (graphs) and where the runtime's forwards are
    compiled (`ModelRuntime.compile`); True: the default buckets anywhere; a Buckets: those."""
    if fixed_shapes is False or (fixed_shapes is None and runtime.placement[0].type != "cuda"
                                 and not runtime.compile.enabled):  # compiled on the CPU: asked for
        return None
    if features is not None:  # a drafter's target_features input: its own per-row layout, not bucketed
        return None
    if runtime.capturing:  # hidden-state hooks run in Python: a replayed graph would not call them
        return None
    shape = (fixed_shapes if isinstance(fixed_shapes, Buckets) else DEFAULT_BUCKETS).shape(n_new, n_keys)
    if shape is None:
        return None
    return runtime.graph_runner(), shape
