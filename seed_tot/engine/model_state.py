"""What the engine works out about a model, kept beside the model rather than on it.

Per model object: its attention layout (masks.py reads the modeling source once), the query padding
timed on this hardware (query_padding.py), its KV pool (kv_pool.py) and the forward hooks that
capture its hidden states (policies/base.py). The model is the user's stock transformers module:
nothing is set on it. The states live in a map keyed weakly by the model, so a state goes when its
model does, and two engines over one model object share what is a property of that model.
"""
from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ModelState:
    layout: Any = None  # masks.AttentionLayout
    row_padding: dict[int, int] | None = None  # query_padding: n entries -> the rows to run them at
    pool: Any = None  # kv_pool.KVPool
    captures: dict[str, Any] = field(default_factory=dict)  # hidden-state hooks by kind
    lock: threading.Lock = field(default_factory=threading.Lock)  # for what is worked out lazily
    attention_routes: int = 0  # batched forwards in flight that route its attention (row_attention.py)
    route_lock: threading.Lock = field(default_factory=threading.Lock)
    parameter: Any = None  # one floating-point parameter of the model: `placement` reads it
    windows: list | None = None  # every decoder layer's sliding window (row_attention.layer_windows)


_states: "weakref.WeakKeyDictionary[Any, ModelState]" = weakref.WeakKeyDictionary()
_states_lock = threading.Lock()


def state_of(model) -> ModelState:
    state = _states.get(model)
    if state is None:
        with _states_lock:
            state = _states.setdefault(model, ModelState())
    return state


def placement(model) -> tuple[Any, Any]:
    """The model's (device, dtype), read from one of its parameters found once. transformers'
    `device` and `dtype` properties walk the parameters on every read, a host cost per forward;
    `Module.to` swaps a parameter's data in place, so the same parameter always says where it is now."""
    state = state_of(model)
    parameter = state.parameter
    if parameter is None:
        parameter = state.parameter = next((p for p in model.parameters() if p.is_floating_point()),
                                           next(model.parameters()))
    return parameter.device, parameter.dtype
