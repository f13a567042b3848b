"""Attention over the rows of a KV pool: the batched forward of `kv_cache.forward_batch`.

The rows' new entries are packed into one query sequence, row b's at [starts[b], starts[b] + n_new[b])
(the linear layers and the LM head run on real entries only, however unequal the rows), and the model
is called with a `RowBatchCache`, whose `update` stores every row's new keys/values in the model's
pool (kv_pool.py) with one write per layer, and an attention function registered with transformers'
`AttentionInterface` runs one attention call per layer for all rows: their histories gathered from the
pool by one index, their masks (tree structure + the layer's sliding window, masks.py's rules) built
once per forward. No Python loop over rows runs inside a layer. Where a few rows verify drafts while
the rest decode one token, the one-query rows get a call of their own (`RowSplit`): one call would pad
every row's queries to the widest row's, and score each history that many times. With attention="pool"
(model_runtime.py) nothing is gathered: one FlexAttention call per layer reads the pool's storage
itself through a block mask over its slots, built once per forward (`_pool_attention`).

Per forward, not per model: the model's config names the registered implementation ("seed_tot+sdpa" /
"seed_tot+eager") only while a batched forward of it runs or an engine's scheduler has calls (`hold`
counts them, per config), and names its own again after, so the user's model is left as it was
given. Even meanwhile the registered function dispatches to the model's original attention unless *this thread* is inside a batched forward
of this model, so other threads' forwards of the same model and stock-attention forwards (pipeline
stages) are exactly what they were. Masks are still built by the original implementation's mask function.
"""
from __future__ import annotations

import sys
import threading

import torch
from transformers import AttentionInterface
from transformers.cache_utils import Cache
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .host_to_device import to_device
from .masks import AttentionLayout, pool_block_masks

PREFIX = "seed_tot+"
# Stock modules that append to the cache with `past_key_values.update` and then call
# ALL_ATTENTION_FUNCTIONS[config._attn_implementation] with the updated keys (checked in their source).
# Falcon is not one: its attention calls torch's sdpa itself, so it keeps the copying batched path.
ROW_ATTENTION_MODELS = ("llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2", "gemma3_text", "phi3",
                        "gpt2", "gpt_neox", "opt")

_active = threading.local()  # .batch: the RowBatchCache of this thread's batched forward, if any


def serves(model) -> bool:
    """Whether row attention serves `model`'s rows exactly (else the copying path: kv_cache.py)."""
    config = model.config
    name = _original(config._attn_implementation)
    return (config.model_type in ROW_ATTENTION_MODELS and name in ("sdpa", "eager")
            and not getattr(config, "reorder_and_upcast_attn", False))  # GPT-2's own upcast path is eager-only


def _original(name):
    return name[len(PREFIX):] if isinstance(name, str) and name.startswith(PREFIX) else name


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
    """The `past_key_values` of one packed batched forward over rows of one KV pool (kv_pool.py).

    The forward runs one sequence of n_query queries: row b's n_new[b] entries at [starts[b], starts[b] +
    n_new[b]), rows one after another, then any padding queries (which belong to no row). Everything per
    row is laid out once per forward, as index tensors, so that each layer costs the same handful of
    tensor ops however many rows there are:
      write_slots [n_write]     the pool slots of the first n_write queries' new entries, in packed order
      read_index  [B, K]        every row's history after the forward, padded (padding reads are masked)
      q_index     [B * Q]       packed query of row b's i-th new entry (any query for padding; none when
                                `one_each`: every row has one entry, packed query b is row b's)
      out_index               where packed query j sits in the [B * Q] layout (the real queries, or
                                every query of a fixed shape: graphed_forward.py)
      masks       {window: [B, 1, Q, K]} additive masks (tree structure + the layer's sliding window).
    `packed` lays out a forward of exactly its rows; graphed_forward.py builds one of a bucketed shape
    from its static buffers, whose padding queries write the pool's scratch slot."""

    def __init__(self, config, pool, write_slots: torch.Tensor, read_index: torch.Tensor, masks: dict,
                 windows: list[int | None], history: int, *, rows: int, width: int, n_query: int, n_write: int,
                 one_each: bool, q_index: torch.Tensor | None = None, out_index: torch.Tensor | None = None,
                 valid: torch.Tensor | None = None, shared: int = 0, shared_slots=None,
                 block_masks: dict | None = None, attend=None, split: "RowSplit | None" = None):
        super().__init__(layers=[])
        self.split = split  # rows of one query apart from the wider ones (RowSplit); None: one attention call
        # attention="pool": {window: BlockMask} over the pool's slots (masks.pool_block_masks) and the
        # FlexAttention function that reads the pool with them (ModelRuntime.flex); None: gather
        self.block_masks, self.attend = block_masks, attend
        self.shared, self.shared_slots = shared, shared_slots  # the history every row holds in the same slots
        self.config, self.pool, self.masks, self.windows, self.history = config, pool, masks, windows, history
        self.write_slots, self.read_index = write_slots, read_index
        self.rows, self.width, self.n_query, self.n_write, self.one_each = rows, width, n_query, n_write, one_each
        self.q_index, self.out_index, self.valid = q_index, out_index, valid
        # read once per forward, not once per layer: a transformers config attribute is a host cost
        self.sdpa = _original(config._attn_implementation) == "sdpa"

    @classmethod
    def packed(cls, config, pool, plan, n_new: list[int], starts: list[int], n_query: int, masks: dict,
               windows: list[int | None], history: int, attend=None) -> "RowBatchCache":
        """The cache of a forward of exactly these rows (padding queries, if any, reach no storage).
        attend: attention="pool"'s FlexAttention function; `pool_masks` then adds the block masks."""
        rows, width = len(n_new), max(n_new)
        layout = dict(rows=rows, width=width, n_query=n_query, n_write=sum(n_new), shared=plan.shared,
                      shared_slots=plan.shared_slots, attend=attend)
        # a decode step (one entry per row) is already in [rows, 1] order: no unpacking to index
        if all(n == 1 for n in n_new):
            return cls(config, pool, plan.write_slots, plan.read_index, masks, windows, history, one_each=True,
                       **layout)
        device = plan.read_index.device
        query = torch.arange(width)[None]
        valid = query < torch.tensor(n_new)[:, None]  # [B, Q]
        q_index = (torch.tensor(starts)[:, None] + query).masked_fill_(~valid, 0)
        out_index = (torch.arange(rows)[:, None] * width + query)[valid]
        split = RowSplit.of(n_new, starts, plan.read_index, masks) if attend is None else None
        return cls(config, pool, plan.write_slots, plan.read_index, masks, windows, history, one_each=False,
                   q_index=to_device(q_index.reshape(-1), device), out_index=to_device(out_index, device),
                   valid=to_device(valid, device), split=split,
                   **layout)

    def pool_masks(self, allowed: torch.Tensor, query_pos: torch.Tensor, key_pos: torch.Tensor) -> None:
        """Build, once for the forward, the block masks that attention="pool" reads the pool with, from the
        same row metadata the additive masks come from (masks.py); the cells' layout is this cache's."""
        out_index = None if self.one_each else self.out_index
        self.block_masks = pool_block_masks(allowed, query_pos, key_pos, self.read_index, out_index, self.n_query,
                                            self.pool.capacity, set(self.windows))

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        n = self.n_write  # a packed forward's padding queries' entries are never stored
        self.pool.write(layer_idx, self.write_slots, key_states[0, :, :n].transpose(0, 1),
                        value_states[0, :, :n].transpose(0, 1))
        return key_states, value_states  # unused: the attention reads the pool

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.history

    def get_mask_sizes(self, query_length: int, layer_idx: int) -> tuple[int, int]:
        return self.history + query_length, 0


# Split a forward's rows when that spares at least this many (query, key) pairs of padded attention:
# below it, a second attention call per layer costs more host time than the scores it spares.
SPLIT_MIN_PAIRS = 1024


class RowSplit:
    """A forward whose rows mostly decode one token while a few verify drafts: one attention call of
    every row at the widest row's query width would score each one-query row's history `width` times
    (on a CPU, with histories of hundreds of tokens, that padding is most of what a drafted token
    costs), so the one-query rows get an attention call of their own, at width 1, and the wider rows
    one at their width. Each row still attends to exactly its own keys under its own mask; only the
    padding queries, whose outputs were dropped, are no longer computed. Laid out once per forward:
      one, wide      the rows of each part (indices into the forward's rows)
      q_one, q_wide  packed query of each part's queries ([B1]; [Bw * W], 0 for padding)
      read           (read_index of the one-query rows, of the wide rows)
      masks          {window: (one-query rows' masks [B1, 1, 1, K], wide rows' [Bw, 1, W, K])}
      out            where packed query j sits in the two parts' outputs, one-query rows first."""

    def __init__(self, one, wide, q_one, q_wide, read, masks, out):
        self.one, self.wide, self.q_one, self.q_wide = one, wide, q_one, q_wide
        self.read, self.masks, self.out = read, masks, out

    @classmethod
    def of(cls, n_new: list[int], starts: list[int], read_index: torch.Tensor, masks: dict) -> "RowSplit | None":
        """The split of a forward with these rows, or None where one call is as good (no one-query row,
        no wider row, or too few padded pairs spared: SPLIT_MIN_PAIRS)."""
        width = max(n_new)
        one = [b for b, n in enumerate(n_new) if n == 1]
        wide = [b for b, n in enumerate(n_new) if n > 1]
        if not one or not wide or any(m is None for m in masks.values()):
            return None
        if len(one) * (width - 1) * read_index.shape[1] < SPLIT_MIN_PAIRS:
            return None
        device = read_index.device
        at_one = {b: i for i, b in enumerate(one)}
        at_wide = {b: i for i, b in enumerate(wide)}
        out = []  # packed order: row by row, each row's entries in order
        for b, n in enumerate(n_new):
            out += [at_one[b]] if n == 1 else [len(one) + at_wide[b] * width + t for t in range(n)]
        q_wide = [starts[b] + t if t < n_new[b] else 0 for b in wide for t in range(width)]
        one_t, wide_t = to_device(one, device), to_device(wide, device)
        split_masks = {w: (m.index_select(0, one_t)[:, :, :1], m.index_select(0, wide_t)) for w, m in masks.items()}
        return cls(one_t, wide_t, to_device([starts[b] for b in one], device), to_device(q_wide, device),
                   (read_index.index_select(0, one_t), read_index.index_select(0, wide_t)), split_masks,
                   to_device(out, device))


def _row_attention(batch: RowBatchCache, module, query, attention_mask, scaling=None, dropout=0.0,
                   softcap=None, **kwargs):
    """Every row's queries against its own history, in one attention call for all rows: the histories
    gathered from the pool, the queries unpacked to [rows, Q], one masked attention, the outputs packed
    back. Same arithmetic as the model's own implementation (sdpa, or eager: scale, soft-cap, additive
    mask, float32 softmax)."""
    if module.training:
        raise RuntimeError("row attention is for inference (no dropout)")
    if torch.is_grad_enabled():  # the pool may hold inference-mode tensors, which autograd refuses
        with torch.no_grad():  # (checked, not a decorator: a decorator costs host time every layer)
            return _row_attention(batch, module, query, attention_mask, scaling, dropout, softcap, **kwargs)
    if kwargs.get("s_aux") is not None:
        raise NotImplementedError("attention sinks are not supported by row attention")
    if batch.block_masks is not None:
        return _pool_attention(batch, module, query, scaling, softcap)
    _, n_heads, n_query, head_dim = query.shape  # one packed sequence of every row's queries
    rows, width = batch.rows, batch.width
    scaling = head_dim ** -0.5 if scaling is None else scaling
    layer, window = module.layer_idx, batch.windows[module.layer_idx]
    # no window can hide a shared key from any query: the shared history is read once (cascade)
    shared = bool(batch.shared) and window is None
    if batch.split is not None:
        return _split_attention(batch, layer, window, query, scaling, softcap, shared)
    mask = batch.masks[window]  # [B, 1, Q, K]
    decode = batch.one_each and n_query == rows  # one query per row, none padding: [1, H, B, D] in order
    if decode:
        q = query.transpose(0, 2)  # [B, H, 1, D]
    elif batch.one_each:
        q = query[0, :, :rows].transpose(0, 1).unsqueeze(2)  # [B, H, 1, D]
    else:
        q = query[0].index_select(1, batch.q_index).view(n_heads, rows, width, head_dim).transpose(0, 1)
    out = _attention_of_rows(batch, layer, q, batch.read_index, mask, scaling, softcap, shared)
    return _packed_output(batch, out, decode, n_query)


def _attention_of_rows(batch: RowBatchCache, layer: int, q: torch.Tensor, read_index: torch.Tensor,
                       mask: torch.Tensor | None, scaling: float, softcap: float | None, shared: bool) -> torch.Tensor:
    """Attention [B, H, Q, D] of rows' queries q [B, H, Q, D] over the histories `read_index` [B, K]
    names in the pool, under `mask` [B, 1, Q, K] (None: every key visible): one call for the rows."""
    if shared:
        return _shared_history_attention(batch, layer, q, mask, scaling, softcap, read_index)
    rows, n_heads, width, head_dim = q.shape
    keys, values = batch.pool.read(layer, read_index)  # [B, K, kv_heads, D]
    keys, values = keys.transpose(1, 2), values.transpose(1, 2)  # [B, kv_heads, K, D]
    n_kv = keys.shape[1]
    if softcap is None and batch.sdpa:
        return torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scaling,
                                                                enable_gqa=n_heads != n_kv)
    group = n_heads // n_kv
    # a KV head's query heads and query tokens form one matrix [group * Q, D]: no key is repeated
    scores = torch.matmul(q.reshape(rows, n_kv, group * width, head_dim), keys.transpose(-1, -2)) * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.view(rows, n_kv, group, width, -1)
    if mask is not None:  # None: every key visible to every query (kv_cache._sees_everything)
        scores = scores + mask[:, :, None]
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs.view(rows, n_kv, group * width, -1), values).view(rows, n_heads, width, head_dim)


def _split_attention(batch: RowBatchCache, layer: int, window, query: torch.Tensor, scaling: float,
                     softcap: float | None, shared: bool):
    """Row attention in two calls (RowSplit): the one-query rows at width 1, the wider rows at theirs,
    the outputs put back in the packed query layout the model expects, [1, n_query, H, D]."""
    split, (_, n_heads, n_query, head_dim) = batch.split, query.shape
    one_mask, wide_mask = split.masks[window]
    packed = query[0]  # [H, n_query, D]
    q_one = packed.index_select(1, split.q_one).transpose(0, 1).unsqueeze(2)  # [B1, H, 1, D]
    q_wide = packed.index_select(1, split.q_wide).view(n_heads, len(split.wide), batch.width, head_dim).transpose(0, 1)
    out_one = _attention_of_rows(batch, layer, q_one, split.read[0], one_mask, scaling, softcap, shared)
    out_wide = _attention_of_rows(batch, layer, q_wide, split.read[1], wide_mask, scaling, softcap, shared)
    out = torch.cat([out_one.reshape(-1, n_heads, head_dim),
                     out_wide.transpose(1, 2).reshape(-1, n_heads, head_dim)]).index_select(0, split.out)
    if n_query > out.shape[0]:  # padding queries (no row's) get zeros: their outputs are dropped
        out = torch.cat([out, out.new_zeros(n_query - out.shape[0], n_heads, head_dim)])
    return out[None], None


def _pool_attention(batch: RowBatchCache, module, query: torch.Tensor, scaling: float | None,
                    softcap: float | None):
    """attention="pool": every packed query against the pool's storage itself, no row's history gathered.
    One FlexAttention call over [1, H, n_query, D] queries and the layer's whole pool [1, kv_heads,
    slots, D] (a view of the storage), the block mask saying which slots each query sees
    (masks.pool_block_masks): the kernel reads only the pool tiles some query of its query tile sees,
    so a prompt that forked rows hold in common is read once per query tile. Same arithmetic as the
    model's own implementation: scale, Gemma-2's soft-cap (a score_mod), the softmax in float32.
    A padding query sees nothing and gets zeros (its output is dropped)."""
    layer = module.layer_idx
    # [1, kv_heads, slots, D]: views of the storage, nothing copied; detached (queries too), since a
    # forward run with autograd on records its writes into the storage, and FlexAttention's CPU kernel
    # refuses inputs that need grad even under no_grad
    keys = batch.pool.keys[layer].detach().permute(1, 0, 2)[None]
    values = batch.pool.values[layer].detach().permute(1, 0, 2)[None]
    score_mod = None
    if softcap is not None:
        def score_mod(score, b, h, q_idx, kv_idx):
            return torch.tanh(score / softcap) * softcap
    block_mask = batch.block_masks[batch.windows[layer]]
    out = batch.attend(query.detach(), keys, values, score_mod=score_mod, block_mask=block_mask, scale=scaling,
                       enable_gqa=query.shape[1] != keys.shape[1])
    return out.transpose(1, 2), None  # [1, n_query, H, D]: the packed layout the model expects


def pool_refusal(model) -> str | None:
    """Why attention="pool" cannot serve `model` exactly (None: it can). Checked once per runtime, before
    any forward; a refused model runs the gather path (ModelRuntime.flex logs it once). Every model row
    attention serves is one the pool path serves: what FlexAttention cannot express (ALiBi, attention
    sinks, GPT-2's reordered upcast) is already outside `serves` or refused per call (sinks)."""
    if not serves(model):
        return ("its attention does not go through transformers' attention interface with the pool's "
                "cache (or keeps its own upcast path): it runs the copying batched path")
    return None


def _shared_history_attention(batch: RowBatchCache, layer: int, q: torch.Tensor, mask: torch.Tensor | None,
                              scaling: float, softcap: float | None, read_index: torch.Tensor) -> torch.Tensor:
    """Attention [B, H, Q, D] of every row's queries q [B, H, Q, D] over its history, where the first
    `batch.shared` keys are the same slots in every row (forks of one prompt stretch): those are read
    once, in place when consecutive, and scored for all rows' queries in one matmul per KV head; only
    the rest of each row's history is gathered (cascade attention, as FlashInfer's and Hydragen's).
    One softmax over both parts, as the eager implementation computes it (float32, then the dtype)."""
    rows, n_heads, width, head_dim = q.shape
    shared = batch.shared
    shared_keys, shared_values = batch.pool.read_shared(layer, batch.shared_slots)  # [S, kv_heads, D]
    keys, values = batch.pool.read(layer, read_index[:, shared:])  # [B, K - S, kv_heads, D]
    n_kv = keys.shape[2]
    gq = n_heads // n_kv * width  # a KV head's query heads and query tokens: one matrix [G * Q, D]
    q = q.reshape(rows, n_kv, gq, head_dim)
    # the shared keys against every row's queries of a KV head at once: [kv, B, G * Q, S], left in this
    # layout (the per-query statistics move between layouts, never this tensor)
    common = torch.matmul(q.transpose(0, 1).reshape(n_kv, rows * gq, head_dim), shared_keys.permute(1, 2, 0))
    common = common.mul_(scaling).view(n_kv, rows, gq, shared)
    own = torch.matmul(q, keys.permute(0, 2, 3, 1)).mul_(scaling)  # [B, kv, G * Q, K - S]
    if softcap is not None:
        common, own = torch.tanh(common / softcap) * softcap, torch.tanh(own / softcap) * softcap
    if mask is not None:  # the shared keys are history every query sees: only the rest is masked
        own = (own.view(rows, n_kv, -1, width, own.shape[-1]) + mask[:, :, None, :, shared:]).view(own.shape)
    common, own = common.float(), own.float()  # the softmax in float32, as the eager implementation's
    top = torch.maximum(common.amax(-1).transpose(0, 1), own.amax(-1)).unsqueeze(-1)  # [B, kv, G * Q, 1]
    common, own = common.sub_(top.transpose(0, 1)).exp_(), own.sub_(top).exp_()
    total = common.sum(-1, keepdim=True).transpose(0, 1) + own.sum(-1, keepdim=True)
    common, own = common.div_(total.transpose(0, 1)).to(q.dtype), own.div_(total).to(q.dtype)
    out = torch.matmul(common.view(n_kv, rows * gq, shared), shared_values.transpose(0, 1))
    out = out.view(n_kv, rows, gq, head_dim).transpose(0, 1) + torch.matmul(own, values.transpose(1, 2))
    return out.reshape(rows, n_heads, width, head_dim)


def _packed_output(batch: RowBatchCache, out: torch.Tensor, decode: bool, n_query: int):
    """Attention outputs [B, H, Q, D] in the packed query layout the model expects, [1, n_query, H, D]."""
    rows, n_heads, width, head_dim = out.shape
    if decode:
        return out.permute(2, 0, 1, 3), None  # [1, B, H, D]: the packed layout the model expects
    if batch.one_each:
        out = out.reshape(rows, n_heads, head_dim)
    else:
        out = out.transpose(1, 2).reshape(rows * width, n_heads, head_dim).index_select(0, batch.out_index)
    if n_query > out.shape[0]:  # padding queries (no row's) get zeros: their outputs are dropped
        out = torch.cat([out, out.new_zeros(n_query - out.shape[0], n_heads, head_dim)])
    return out[None], None


def layer_windows(model, layout: AttentionLayout) -> list[int | None]:
    """The sliding window (in positions, None: full) of every decoder layer, by masks.py's layout rules
    (`ModelRuntime.windows` keeps them: reading a transformers config attribute is a host cost per forward)."""
    config = model.config
    n_layers = config.num_hidden_layers
    types = getattr(config, "layer_types", None)
    if layout.as_dict and types:
        return [layout.windows[types[i]] for i in range(n_layers)]
    return [next(iter(layout.windows.values()))] * n_layers  # one window for every layer (Mistral, Phi-3, Llama)


def unpacked(hidden: torch.Tensor) -> torch.Tensor:
    """Hidden states [1, queries, size] of this thread's packed batched forward as [rows, entries, size]
    (row b's n_new[b] entries first, right-padded with zeros): the layout a hidden-state capture's
    readers index. Anything else is returned as it is."""
    batch = getattr(_active, "batch", None)
    if batch is None or hidden.shape[:2] != (1, batch.n_query) or (batch.valid is None and not batch.one_each):
        return hidden  # a fixed-shape forward never runs under a capture hook (graphed_forward.py)
    if batch.one_each:
        return hidden[0, :batch.rows, None]
    rows = hidden[0].index_select(0, batch.q_index).view(batch.rows, batch.width, -1)
    return rows * batch.valid[..., None].to(rows.dtype)


# Counted per config, not per model runtime: `_attn_implementation` is an attribute of the model's
# config, which every engine (each with its runtime) over one model object shares, so one engine's
# release must not name the original again while another engine's forward of that model runs. Keyed
# by id (a config compares by value and is unhashable); an entry lives only while it is held, and a
# holder keeps the model, hence its config and the id, alive.
_routes: dict[int, int] = {}
_routes_lock = threading.Lock()


def hold(config) -> None:
    """Name row attention in `config` until the matching `release` (counted): the first holder
    renames, the last one to release names the original again. A scheduler holds its models' configs
    while it has calls, so that the forwards in between (each an `active_batch`) find it named already;
    setting the config's attribute goes through transformers' validating setter, a host cost per forward."""
    with _routes_lock:
        held = _routes.get(id(config), 0)
        if held == 0:
            name = _original(config._attn_implementation)
            wrapped = PREFIX + name
            if wrapped not in ALL_ATTENTION_FUNCTIONS:  # registered once per implementation, for every model
                AttentionInterface.register(wrapped, _dispatch)
                AttentionMaskInterface.register(wrapped, ALL_MASK_ATTENTION_FUNCTIONS[name])
            config._attn_implementation = wrapped
        _routes[id(config)] = held + 1


def release(config) -> None:
    with _routes_lock:
        held = _routes[id(config)] - 1
        if held:
            _routes[id(config)] = held
        else:
            del _routes[id(config)]
            config._attn_implementation = _original(config._attn_implementation)


class active_batch:
    """Context: this thread's forwards of `model` read rows from `batch`, with row attention named in
    the model's config for as long as it lasts (`hold`)."""

    def __init__(self, model, batch: RowBatchCache):
        self.model, self.batch = model, batch

    def __enter__(self):
        hold(self.model.config)
        self.previous = getattr(_active, "batch", None)
        _active.batch = self.batch
        return self.batch

    def __exit__(self, *exc):
        _active.batch = self.previous
        release(self.model.config)
        return False
