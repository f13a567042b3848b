"""`ModelRuntime`: one model as an engine runs it, with what the engine works out about it.

The model is the user's stock transformers module, and nothing is set on it. What the engine needs
beside it is kept here, made on first use: its attention layout (masks.py reads the modeling
source) and every layer's window, where its parameters live, the query padding timed on this
hardware (query_padding.py), the KV pool its rows live in (kv_pool.py), the forward hooks that
capture its hidden states (hidden_capture.py) and its fixed-shape runner (graphed_forward.py).

An `Engine` makes one runtime per model it runs and owns them; code that runs a model without an
engine (tests, benchmarks, PipeDec's draft role) makes its own. Runtimes do not share: two
engines over one model object each have their own pool, and a row scored through one cannot be
scored through the other. What is shared is the model's config, whose attention name row_attention.py
counts per config for that reason.
"""
from __future__ import annotations

import logging
import threading
import weakref

import torch
from torch.nn.attention.flex_attention import flex_attention

from . import row_attention
from .compiled_forward import CompileSettings
from .engine_settings import ATTENTION_PATHS
from .graphed_forward import GraphedForward
from .kv_pool import KVPool
from .masks import AttentionLayout
from .query_padding import measure_padding

log = logging.getLogger(__name__)


def check_attention_path(attention: str) -> str:
    """`attention` when it names a path, else a ValueError naming the setting and the paths."""
    if attention not in ATTENTION_PATHS:
        raise ValueError(f"attention={attention!r}: expected one of {', '.join(ATTENTION_PATHS)}")
    return attention


class ModelRuntime:
    """One model and the state the engine keeps about it (see the module doc).

    attention: how a batched forward's attention reads the rows' history (row_attention.py):
    "gather" copies every row's history out of the pool per layer and runs masked attention on the
    copy; "pool" runs FlexAttention on the pool's storage itself with one block mask per forward
    (masks.pool_block_masks). "gather" stays the default: the pool path's eager CPU kernel scores
    every slot of the pool, and it has not been timed against the gather on any device yet.
    compile_attention: run that FlexAttention compiled (inductor); None: on CUDA. Compiled on CUDA
    only: on the CPU, torch 2.13's inductor FlexAttention template aborted the test process with a
    glibc heap assertion inside its brgemm kernel (2026-11-28), so a CPU asks for it in vain, said once.
    compile: whether its fixed-shape forwards are compiled (compiled_forward.py)."""

    def __init__(self, model, attention: str = "gather", compile_attention: bool | None = None,
                 compile: CompileSettings = CompileSettings()):
        self.model = model
        self.attention = check_attention_path(attention)
        self.compile_attention = compile_attention
        self._flex = None  # (device type, the FlexAttention function) of attention="pool", made on first use
        self._flex_refused: str | None = None
        self.compile = compile
        self._lock = threading.Lock()  # for what is made on first use: threads forward one model at once
        self._layout: AttentionLayout | None = None
        self._windows: list[int | None] | None = None
        self._parameter: torch.nn.Parameter | None = None  # the one `placement` reads
        self._padding: dict[int, int] | None = None  # n entries -> the rows to run them at
        self._pool: KVPool | None = None
        self._captures: dict[type, object] = {}  # hidden-state captures by kind
        self._graphed: GraphedForward | None = None

    def __repr__(self) -> str:
        return f"ModelRuntime({type(self.model).__name__})"

    @property
    def config(self):
        return self.model.config

    @property
    def layout(self) -> AttentionLayout:
        """The model's attention layout (AttentionLayout.of is pure: a race only computes it twice)."""
        if self._layout is None:
            self._layout = AttentionLayout.of(self.model)
        return self._layout

    @property
    def windows(self) -> list[int | None]:
        """Every decoder layer's sliding window (row_attention.layer_windows; None: full attention)."""
        if self._windows is None:
            self._windows = row_attention.layer_windows(self.model, self.layout)
        return self._windows

    @property
    def placement(self) -> tuple[torch.device, torch.dtype]:
        """The model's (device, dtype), read from one of its parameters found once: transformers'
        `device` and `dtype` properties walk the parameters on every read, a host cost per forward;
        `Module.to` swaps a parameter's data in place, so the same parameter always says where it is now."""
        parameter = self._parameter
        if parameter is None:
            parameters = self.model.parameters
            parameter = self._parameter = next((p for p in parameters() if p.is_floating_point()),
                                               next(parameters()))
        return parameter.device, parameter.dtype

    @property
    def pool(self) -> KVPool:
        """The KV storage of every row scored through this runtime."""
        if self._pool is None:
            with self._lock:
                if self._pool is None:
                    self._pool = KVPool(self.placement[0])
        return self._pool

    @property
    def flex(self):
        """The FlexAttention function batched forwards read the pool with (attention="pool"), or None:
        the gather path (attention="gather", or a model the pool path cannot serve exactly: logged once,
        at the first batched forward, before it runs). Compiled on CUDA unless `compile_attention` is
        False (only the compiled kernel is fused there; the eager one scores every slot), eager elsewhere."""
        if self.attention != "pool" or self._flex_refused is not None:
            return None
        device = self.placement[0].type
        if self._flex is None or self._flex[0] != device:  # made anew when the model moves (CPU -> CUDA)
            with self._lock:
                if (self._flex is None or self._flex[0] != device) and self._flex_refused is None:
                    refused = row_attention.pool_refusal(self.model)
                    if refused is not None:
                        self._flex_refused = refused
                        log.warning("%s reads its history by gathering it (attention=gather): attention=pool "
                                    "cannot serve it exactly: %s", type(self.model).__name__, refused)
                        return None
                    compiled = device == "cuda" and self.compile_attention is not False
                    if self.compile_attention and not compiled:
                        log.warning("%s's FlexAttention runs eagerly on %s: compiled FlexAttention is used on CUDA "
                                    "only (model_runtime.py says why)", type(self.model).__name__, device)
                    self._flex = (device, torch.compile(flex_attention) if compiled else flex_attention)
        return self._flex[1]

    # ------------------------------------------------------------------ query padding
    def padded_rows(self, n: int) -> int:
        """The row count to run a forward of `n` new entries at (>= n). The first call measures, whatever
        its n: that is a model's first forward (a prefill, before any draft worker runs beside it)."""
        table = self._padding
        if table is None:
            with self._lock:
                if self._padding is None:
                    self._padding = measure_padding(self.model)
                table = self._padding
        return table.get(n, n)

    def set_padding(self, table: dict[int, int] | None) -> None:
        """Fix the query padding instead of measuring it (tests; a caller that knows its hardware);
        None: measure it again on the next forward."""
        if table is not None:
            for n, m in table.items():
                if not 1 <= n <= m:
                    raise ValueError(f"row padding {n} -> {m}: a forward can only be padded up")
            table = dict(table)
        self._padding = table

    # ------------------------------------------------------------------ hidden states
    def capture(self, kind):
        """The runtime's one capture of `kind` (a HiddenCapture class), hooked on first use: one per
        policy or call would pile hooks up on the model. Its hook goes when the runtime does."""
        capture = self._captures.get(kind)
        if capture is None:
            with self._lock:
                capture = self._captures.get(kind)
                if capture is None:
                    capture = self._captures[kind] = kind(self.model)
                    weakref.finalize(self, capture.remove)
        return capture

    @property
    def capturing(self) -> bool:
        """Whether this runtime hooked the model (Python that a replayed CUDA graph would skip)."""
        return bool(self._captures)

    # ------------------------------------------------------------------ fixed shapes
    @property
    def graphed(self) -> GraphedForward | None:
        """The fixed-shape runner, once a fixed-shape forward has made one (tests, counters)."""
        return self._graphed

    def graph_runner(self) -> GraphedForward:
        """The fixed-shape runner, made anew when the model was moved or cast, or its compile setting
        changed, since the last one."""
        found, placement = self._graphed, self.placement
        if found is None or (found.device, found.dtype) != placement or found.compile_settings != self.compile:
            attend = self.flex  # resolved before the lock, which `flex` takes itself
            with self._lock:
                found = self._graphed
                if found is None or (found.device, found.dtype) != placement or found.compile_settings != self.compile:
                    found = self._graphed = GraphedForward(self.model, attend, self.compile)
        return found
