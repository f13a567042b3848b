"""The one builder of the engine's 4D attention masks (single and batched forwards).

Stock transformers models take a 4D mask as it is: they do not add their sliding window to it. So
every mask the engine builds must already say everything a layer may see:
  structure  a query sees the committed prefix and its own ancestors in the tree (the caller's
             boolean `allowed`, which also hides batch padding)
  window     a sliding-window layer also hides keys whose position is `window` or more behind
             the query's position (transformers' rule: key_pos > query_pos - window)
Windows are measured in *positions*, not cache indices: a tree node at depth d sits at position
prefix + d - 1 whatever its index in the cache, and its ancestors are exactly the tokens of its
own sequence. Models that mix sliding and full layers (Gemma-2/3, Qwen2 with max_window_layers)
take a dict {layer type: mask}; models whose layers all slide (Mistral, Phi-3) take one tensor.
The same rules, placed over the KV pool's slots instead of each row's history columns, give the
FlexAttention block masks of attention that reads the pool in place (`pool_block_masks`).

ALiBi models (Bloom, MPT, Falcon with alibi=True) derive their position biases from a 2D padding
mask inside the model, which a tree cannot express without forking the modeling code: they are
refused for the paths that need a 4D mask, with the modes that do work named in the error.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from torch.nn.attention.flex_attention import BlockMask

from .host_to_device import to_device
from .kv_pool import SCRATCH

FULL = "full_attention"
SLIDING = "sliding_attention"


class UnsupportedAttention(ValueError):
    """The model's attention cannot be expressed exactly by the engine's masks for this setting."""


def _takes_mask_dict(model) -> bool:
    """Whether the model's decoder reads a {layer type: mask} dict (transformers' mixed-layer models)."""
    inner = getattr(model, "model", None)
    inner = getattr(inner, "model", inner)  # an engine wrapper (e.g. synthetic OracleLM) holds the HF model
    for module in (inner, getattr(inner, "language_model", None)):
        if module is None:
            continue
        try:
            source = inspect.getsource(type(module).forward)
        except (OSError, TypeError):
            continue
        if "causal_mask_mapping := attention_mask, dict" in source:
            return True
    return False


def _uses_alibi(config) -> bool:
    return bool(getattr(config, "alibi", False)) or config.model_type in ("bloom", "mpt") \
        or getattr(config, "position_embedding_type", None) == "alibi"


@dataclass(frozen=True)
class AttentionLayout:
    """What a model's layers need from a 4D mask: the window of each layer type it uses."""

    model_name: str
    windows: dict[str, int | None]  # layer type -> sliding window in positions (None: full attention)
    as_dict: bool  # the model takes {layer type: mask}; else one mask for every layer
    alibi: bool
    max_positions: int | None  # learned absolute position embeddings: the longest sequence; None: rotary etc.

    @classmethod
    def of(cls, model) -> "AttentionLayout":
        config = model.config
        window = getattr(config, "sliding_window", None)
        if isinstance(window, bool) or (window is not None and window <= 0):
            window = None  # some configs store a flag or 0 for "off"
        layer_types = getattr(config, "layer_types", None)
        if layer_types and SLIDING in layer_types and window is not None:
            windows = {t: (window if t == SLIDING else None) for t in set(layer_types)}
            as_dict = len(windows) > 1 or _takes_mask_dict(model)
            if as_dict and not _takes_mask_dict(model):
                raise UnsupportedAttention(
                    f"{type(model).__name__} mixes sliding-window and full-attention layers but does not "
                    f"take one mask per layer type; only ar, parallel, sd and seed with a chain k_config "
                    f"and verify_batch=1 are exact for it")
        else:
            # no per-layer types: every layer slides when the config has a window (Mistral, Phi-3)
            windows = {FULL: window}
            as_dict = False
        return cls(type(model).__name__, windows, as_dict, _uses_alibi(config), _absolute_positions(model))

    @property
    def sliding(self) -> bool:
        return any(w is not None for w in self.windows.values())

    def check_tree_masks(self, what: str) -> None:
        """Refuse, before generating, a path that needs 4D masks on a model they cannot serve."""
        if self.alibi:
            raise UnsupportedAttention(
                f"{self.model_name} uses ALiBi position biases, which it computes from a 2D padding mask: "
                f"{what} needs tree/batched 4D masks that such a model cannot take without forked modeling "
                f"code. Modes that are exact for it: ar, parallel, sd, and seed with a chain k_config "
                f"(e.g. 1,1,1), verify_batch=1 and draft_batch=1")


def _absolute_positions(model) -> int | None:
    """The position limit of a model with learned absolute position embeddings (GPT-2, OPT, GPT-BigCode...)."""
    config = model.config
    if getattr(config, "rope_theta", None) is not None or getattr(config, "rope_parameters", None) is not None \
            or getattr(config, "rotary_pct", None) is not None or getattr(config, "rotary_dim", None) is not None:
        return None
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("wpe", "embed_positions", "position_embeddings") and isinstance(module, torch.nn.Embedding):
            limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
            return int(limit) if limit else module.num_embeddings
    return None


def build_attention_mask(layout: AttentionLayout, allowed: torch.Tensor, query_pos: torch.Tensor,
                         key_pos: torch.Tensor, dtype: torch.dtype, device) -> torch.Tensor | dict[str, torch.Tensor]:
    """allowed [B, Q, K] bool (structure + padding), query_pos [B, Q], key_pos [B, K] -> the additive
    mask [B, 1, Q, K] (or one per layer type) that every layer of the model must use."""
    masks: dict[str, torch.Tensor] = {}
    by_window: dict[int | None, torch.Tensor] = {}
    for layer_type, window in layout.windows.items():
        if window not in by_window:
            visible = allowed
            if window is not None:
                distance = query_pos[:, :, None] - key_pos[:, None, :]
                # a query always keeps itself (distance 0), so no row is ever fully masked
                visible = allowed & (distance < window)
            mask = torch.zeros(visible.shape, dtype=dtype).masked_fill_(~visible, torch.finfo(dtype).min)
            by_window[window] = to_device(mask[:, None], device)
        masks[layer_type] = by_window[window]
    if layout.as_dict:
        return masks
    return next(iter(masks.values()))


def tree_visibility(committed: int, all_parents: list[int], n_old: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One sequence: the new entries (all_parents[n_old:]) see the prefix and their ancestors.
    Returns allowed [Q, K], query positions [Q] and key positions [K] (K = committed + len(all_parents))."""
    n = len(all_parents)
    depth: list[int] = []
    for p in all_parents:
        depth.append(1 + (depth[p] if p >= 0 else 0))
    entry_pos = torch.tensor([committed + d - 1 for d in depth], dtype=torch.long)
    key_pos = torch.cat([torch.arange(committed), entry_pos])
    allowed = torch.zeros(n - n_old, committed + n, dtype=torch.bool)
    allowed[:, :committed] = True
    if all(p == i - 1 for i, p in enumerate(all_parents)):  # a chain (e.g. a prompt): plain causal, no walk
        allowed[:, committed:] = torch.ones(n, n, dtype=torch.bool).tril()[n_old:]
        return allowed, entry_pos[n_old:], key_pos
    ancestors = torch.zeros(n, n, dtype=torch.bool)  # row i: entry i and its ancestors, built from its parent's row
    for i, p in enumerate(all_parents):
        if p >= 0:
            ancestors[i] = ancestors[p]
        ancestors[i, i] = True
    allowed[:, committed:] = ancestors[n_old:]
    return allowed, entry_pos[n_old:], key_pos


def batched_visibility(committed: list[int], parents: list[list[int]], n_old: list[int]
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`tree_visibility` of every row of a batched forward at once, in a fixed number of tensor ops.

    Row b has committed[b] prefix entries and uncommitted entries with parents[b] (old then new), of
    which the last len(parents[b]) - n_old[b] are this forward's queries. Returns allowed [B, Q, K],
    query positions [B, Q] and key positions [B, K], with Q the most queries of a row and K the
    longest history after the forward. A row's padding queries see nothing; its padding keys are
    seen by nobody.
    """
    rows = len(committed)
    n_tree = [len(p) for p in parents]
    n_query = max(t - o for t, o in zip(n_tree, n_old))
    n_key = max(ci + t for ci, t in zip(committed, n_tree))
    if all(p == i - 1 for row in parents for i, p in enumerate(row)):  # chains: entry e sits at c + e
        # worked out on the host: a decode step is this path, and its op count is host cost
        query_pos = torch.tensor([[ci + o + i if o + i < t else -1 for i in range(n_query)]
                                  for ci, o, t in zip(committed, n_old, n_tree)])  # -1: a padding query
        key = torch.arange(n_key)
        allowed = key <= query_pos[:, :, None]  # a padding query (-1) sees nothing
        return allowed, query_pos.clamp(min=0), key.expand(rows, n_key)
    c = torch.tensor(committed)
    n_old_t = torch.tensor(n_old)
    n_new = torch.tensor(n_tree) - n_old_t
    key = torch.arange(n_key)[None]  # [1, K]
    query = torch.arange(n_query)[None]  # [1, Q]
    query_valid = query < n_new[:, None]  # [B, Q]
    widest = max(n_tree)
    # ancestor-or-self closure of each row's tree: one-hot parents, then squaring (paths of 2^k steps)
    reach = torch.zeros(rows, widest, widest)
    b_idx = [b for b, row in enumerate(parents) for p in row if p >= 0]
    e_idx = [i for row in parents for i, p in enumerate(row) if p >= 0]
    p_idx = [p for row in parents for p in row if p >= 0]
    reach[b_idx, e_idx, p_idx] = 1.0
    reach += torch.eye(widest)
    steps = 1
    while steps < widest:
        reach = torch.bmm(reach, reach).clamp_(max=1.0)
        steps *= 2
    depth = reach.sum(-1).long()  # ancestors counted with the entry itself
    entry_pos = c[:, None] + depth - 1  # [B, T]
    entry = key - c[:, None]  # [B, K]: the uncommitted entry a key is, where it is one
    in_tree = (entry >= 0) & (entry < torch.tensor(n_tree)[:, None])
    entry_c = entry.clamp(0, widest - 1)
    key_pos = torch.where(in_tree, entry_pos.gather(1, entry_c), key.expand(rows, n_key))
    query_entry = (n_old_t[:, None] + query).clamp(max=widest - 1)  # [B, Q]
    query_pos = entry_pos.gather(1, query_entry)
    reach_q = reach.gather(1, query_entry[:, :, None].expand(rows, n_query, widest))  # [B, Q, T]
    ancestor = reach_q.gather(2, entry_c[:, None, :].expand(rows, n_query, n_key)) > 0  # [B, Q, K]
    allowed = ((key < c[:, None])[:, None, :] | (ancestor & in_tree[:, None, :])) & query_valid[:, :, None]
    return allowed, query_pos, key_pos


def window_masks(allowed: torch.Tensor, query_pos: torch.Tensor, key_pos: torch.Tensor, windows: set,
                 dtype: torch.dtype, device) -> dict:
    """Additive masks [B, 1, Q, K] per window (None: full), by the rule key_pos > query_pos - window,
    built where the inputs are and moved to `device`."""
    return {window: to_device(mask, device) for window, mask in additive_masks(allowed, query_pos, key_pos, windows,
                                                                        dtype).items()}


def additive_masks(allowed: torch.Tensor, query_pos: torch.Tensor, key_pos: torch.Tensor, windows: set,
                   dtype: torch.dtype) -> dict:
    """`window_masks` on the inputs' own device. No host-made tensor and no host sync, so that a CUDA
    graph can capture it: a fixed-shape forward (graphed_forward.py) builds its masks inside the graph
    from the row metadata it copied in."""
    masks = {}
    for window in windows:
        visible = _in_window(allowed, query_pos, key_pos, window)
        mask = torch.full(visible.shape, torch.finfo(dtype).min, dtype=dtype, device=visible.device)
        masks[window] = mask.masked_fill_(visible, 0.0)[:, None]
    return masks


def _in_window(allowed: torch.Tensor, query_pos: torch.Tensor, key_pos: torch.Tensor, window: int | None
               ) -> torch.Tensor:
    """allowed [B, Q, K] narrowed to the keys inside `window` (None: full) by key_pos > query_pos - window."""
    if window is None:
        return allowed
    return allowed & ((query_pos[:, :, None] - key_pos[:, None, :]) < window)


# FlexAttention's tile in both dimensions: a block mask says which (query block, pool block) tiles
# hold a visible pair, and the kernel reads only those tiles of the pool
POOL_BLOCK = 128


def pool_block_masks(allowed: torch.Tensor, query_pos: torch.Tensor, key_pos: torch.Tensor,
                     read_index: torch.Tensor, out_index: torch.Tensor | None, n_query: int, capacity: int,
                     windows: set) -> dict:
    """FlexAttention block masks over the KV pool's slots, one per window (None: full), for attention
    that reads the pool in place (row_attention.py, `attention="pool"`).

    The same rows and rules as `additive_masks`: allowed [R, W, K] (row, query cell, history column:
    tree structure and padding), query_pos [R, W], key_pos [R, K], and read_index [R, K] the slot of
    each history column (kv_pool.ScoringPlan). The query axis is the forward's packed sequence of
    n_query queries: packed query j is cell out_index[j] of the [R * W] layout (out_index None: one
    query per row, packed query j is row j); packed queries past those see nothing. The key axis is
    every slot of the pool (`capacity`), so what a query may see is its row's history slots, placed by
    one scatter; the pool's SCRATCH slot (padding reads) is seen by nobody. Forks of one prompt hold
    its slots in common, so their queries select the same pool tiles: a tile is read once per query
    tile, not once per row. Fixed shapes for fixed inputs, no host sync: a CUDA graph captures it."""
    rows, width, n_keys = allowed.shape
    device = read_index.device
    allowed, query_pos, key_pos = (to_device(t, device) for t in (allowed, query_pos, key_pos))
    n_cells = rows * width
    if out_index is None:  # packed query j is row j's one query
        cell = torch.arange(min(n_query, n_cells), device=device)
    else:
        cell = out_index[:n_query]
    n_placed = cell.shape[0]
    q_blocks, kv_blocks = -(-n_query // POOL_BLOCK), -(-capacity // POOL_BLOCK)
    slots = read_index[cell // width]  # [placed queries, K]: the history slots of each query's row
    masks = {}
    for window in windows:
        visible = _in_window(allowed, query_pos, key_pos, window).reshape(n_cells, n_keys)[cell]
        dense = torch.zeros(q_blocks * POOL_BLOCK, kv_blocks * POOL_BLOCK, dtype=torch.bool, device=device)
        # a row's slots are distinct; only padding columns repeat (all SCRATCH, all hidden), so the
        # scatter has one value per written cell
        dense[:n_placed].scatter_(1, slots, visible)
        dense[:, SCRATCH] = False
        tiles = dense.view(q_blocks, POOL_BLOCK, kv_blocks, POOL_BLOCK).sum((1, 3), dtype=torch.int32)
        full = tiles == POOL_BLOCK * POOL_BLOCK
        partial = (tiles > 0) & ~full
        # tiles listed first where present (stable: in slot order), as FlexAttention's own builder does
        masks[window] = BlockMask.from_kv_blocks(
            *_ordered(partial), *_ordered(full), BLOCK_SIZE=(POOL_BLOCK, POOL_BLOCK),
            mask_mod=_lookup(dense), seq_lengths=(n_query, capacity), compute_q_blocks=False)
    return masks


def _ordered(tiles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[Qb, Kb] bool -> (how many per query block [1, 1, Qb], their indices first [1, 1, Qb, Kb]), int32."""
    count = tiles.sum(-1, dtype=torch.int32)
    order = torch.argsort(tiles.to(torch.int8), dim=-1, descending=True, stable=True).to(torch.int32)
    return count[None, None], order[None, None]


def _lookup(dense: torch.Tensor):
    """The mask_mod of a dense [queries, slots] visibility (a tile's pairs where it is only partly visible)."""
    def mask_mod(batch, head, q_idx, kv_idx):
        return dense[q_idx, kv_idx]
    return mask_mod
