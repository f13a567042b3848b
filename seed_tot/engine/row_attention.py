"""Attention over each row's own KV storage: the batched forward of `kv_cache.forward_batch`.

A batched forward over m caches must not gather their histories into one padded tensor. So the
rows' new entries are packed into one query sequence, row b's at [starts[b], starts[b] + n_new[b])
(the linear layers and the LM head run on real entries only, however unequal the rows), and the
model is called with a `RowBatchCache`, whose `update` appends each row's new keys/values to that
row's own storage (in place), and an attention function registered with transformers'
`AttentionInterface` reads every row's storage as it is: a list of segments (the read-only prefix
shared with the forks of one prompt, then the row's own entries), one matmul per segment. Each row
gets its own mask (tree structure + sliding window of the layer), built by masks.py's rules.

Per call, not per model: the registered implementation ("seed_tot+sdpa" / "seed_tot+eager")
dispatches to the model's original attention unless *this thread* is inside a batched forward of
this model, so single-row forwards (and other threads' forwards of the same model, e.g. SEED's
draft workers) are exactly what they were. Installing it renames `config._attn_implementation`
once; masks are still built by the original implementation's mask function.
"""
from __future__ import annotations

import sys
import threading

import torch
from transformers import AttentionInterface
from transformers.cache_utils import Cache
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .masks import AttentionLayout

PREFIX = "seed_tot+"
# Stock modules that append to the cache with `past_key_values.update` and then call
# ALL_ATTENTION_FUNCTIONS[config._attn_implementation] with the updated keys (checked in their source).
# Falcon is not one: its attention calls torch's sdpa itself, so it keeps the copying batched path.
ROW_ATTENTION_MODELS = ("llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2", "gemma3_text", "phi3",
                        "gpt2", "gpt_neox", "opt")

_active = threading.local()  # .batch: the RowBatchCache of this thread's batched forward, if any


def install(model) -> bool:
    """Route `model`'s attention through the dispatcher; False where rows cannot be served exactly."""
    config = model.config
    name = config._attn_implementation
    if isinstance(name, str) and name.startswith(PREFIX):
        return True
    if config.model_type not in ROW_ATTENTION_MODELS or name not in ("sdpa", "eager") \
            or getattr(config, "reorder_and_upcast_attn", False):  # GPT-2's own upcast path is eager-only
        return False
    wrapped = PREFIX + name
    AttentionInterface.register(wrapped, _dispatch)
    AttentionMaskInterface.register(wrapped, ALL_MASK_ATTENTION_FUNCTIONS[name])
    config._attn_implementation = wrapped
    return True


def _dispatch(module, query, key, value, attention_mask, **kwargs):
    batch = getattr(_active, "batch", None)
    if batch is not None and batch.config is module.config:
        return _row_attention(batch, module, query, attention_mask, **kwargs)
    original = module.config._attn_implementation[len(PREFIX):]
    if original == "sdpa":
        function = ALL_ATTENTION_FUNCTIONS["sdpa"]
    else:  # each model's own eager function (Gemma-2's soft-caps, GPT-2 keeps its dtype...)
        function = sys.modules[type(module).__module__].eager_attention_forward
    return function(module, query, key, value, attention_mask, **kwargs)


class RowBatchCache(Cache):
    """The `past_key_values` of one packed batched forward: appends row b's new entries to row b's storage.

    The forward runs one sequence of queries: row b's n_new[b] entries at [starts[b], starts[b] + n_new[b]),
    rows one after another, then any padding queries (which belong to no row and reach no storage).
    rows[b] is a `kv_cache.RowCache`; masks[b] maps a window (None: full) to row b's additive mask
    [n_new[b], row length after the forward]."""

    def __init__(self, config, rows, n_new: list[int], starts: list[int], n_query: int, masks: list[dict],
                 windows: list[int | None]):
        super().__init__(layers=[])
        self.config, self.rows, self.n_new, self.starts, self.n_query = config, rows, n_new, starts, n_query
        self.masks, self.windows = masks, windows
        self.history = max(row.get_seq_length() for row in rows)

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        for row, start, n in zip(self.rows, self.starts, self.n_new):
            row.layer(layer_idx).append(key_states[:, :, start:start + n], value_states[:, :, start:start + n])
        return key_states, value_states  # unused: the attention reads each row's storage

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.history

    def get_mask_sizes(self, query_length: int, layer_idx: int) -> tuple[int, int]:
        return self.history + query_length, 0


@torch.no_grad()  # inference only; rows' storage may hold inference-mode tensors, which autograd refuses
def _row_attention(batch: RowBatchCache, module, query, attention_mask, scaling=None, dropout=0.0,
                   softcap=None, **kwargs):
    """Each row attends over its own segments: scores per segment, one softmax, values per segment.
    Same arithmetic as the stock eager attention (scale, soft-cap, additive mask, float32 softmax)."""
    if module.training:
        raise RuntimeError("row attention is for inference (no dropout)")
    if kwargs.get("s_aux") is not None:
        raise NotImplementedError("attention sinks are not supported by row attention")
    _, n_heads, n_query, head_dim = query.shape  # one packed sequence of every row's queries
    scaling = head_dim ** -0.5 if scaling is None else scaling
    window = batch.windows[module.layer_idx]
    out = query.new_zeros(1, n_query, n_heads, head_dim)  # padding queries (no row's) keep zeros: dropped
    for b, (row, start, n) in enumerate(zip(batch.rows, batch.starts, batch.n_new)):
        if n == 0:  # a row with nothing new
            continue
        segments = row.layer(module.layer_idx).segments()
        n_kv = segments[0][0].shape[1]
        group = n_heads // n_kv
        # GQA: a KV head's query heads and query tokens form one matrix [n_kv, group * n, D], so each
        # segment is one plain bmm (a broadcast matmul would expand every key group-fold: a copy)
        q = query[0, :, start:start + n].reshape(n_kv, group * n, head_dim)
        scores = torch.cat([torch.bmm(q, k[0].transpose(-1, -2)) for k, _ in segments], dim=-1)
        scores = scores * scaling
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        scores = (scores.view(n_kv, group, n, -1) + batch.masks[b][window]).view(n_kv, group * n, -1)  # mask [n, L]
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
        mixed, at = None, 0
        for _, v in segments:
            part = torch.bmm(probs[..., at:at + v.shape[-2]], v[0])
            mixed = part if mixed is None else mixed + part
            at += v.shape[-2]
        out[0, start:start + n] = mixed.reshape(n_heads, n, head_dim).transpose(0, 1)
    return out, None


def layer_windows(model, layout: AttentionLayout) -> list[int | None]:
    """The sliding window (in positions, None: full) of every decoder layer, by masks.py's layout rules."""
    config = model.config
    n_layers = config.num_hidden_layers
    types = getattr(config, "layer_types", None)
    if layout.as_dict and types:
        return [layout.windows[types[i]] for i in range(n_layers)]
    return [next(iter(layout.windows.values()))] * n_layers  # one window for every layer (Mistral, Phi-3, Llama)


def row_masks(allowed: torch.Tensor, query_pos: torch.Tensor, key_pos: torch.Tensor, windows: set,
              dtype: torch.dtype, device) -> dict:
    """One row's additive masks [Q, K] per window (masks.py's rule: key_pos > query_pos - window)."""
    masks = {}
    for window in windows:
        visible = allowed
        if window is not None:
            visible = allowed & ((query_pos[:, None] - key_pos[None, :]) < window)
        masks[window] = torch.zeros(visible.shape, dtype=dtype).masked_fill_(~visible, torch.finfo(dtype).min).to(device)
    return masks


def unpacked(hidden: torch.Tensor) -> torch.Tensor:
    """Hidden states [1, queries, size] of this thread's packed batched forward as [rows, entries, size]
    (row b's n_new[b] entries first, right-padded with zeros): the layout a hidden-state capture's
    readers index. Anything else is returned as it is."""
    batch = getattr(_active, "batch", None)
    if batch is None or hidden.shape[:2] != (1, batch.n_query):
        return hidden
    rows = hidden.new_zeros(len(batch.rows), max(batch.n_new), hidden.shape[-1])
    for b, (start, n) in enumerate(zip(batch.starts, batch.n_new)):
        rows[b, :n] = hidden[0, start:start + n]
    return rows


class active_batch:
    """Context: this thread's forwards of `batch.config`'s model read rows from `batch`."""

    def __init__(self, batch: RowBatchCache):
        self.batch = batch

    def __enter__(self):
        self.previous = getattr(_active, "batch", None)
        _active.batch = self.batch
        return self.batch

    def __exit__(self, *exc):
        _active.batch = self.previous
        return False
