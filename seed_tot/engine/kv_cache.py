"""The one owner of a sequence's KV cache in one model.

A cache holds a *committed* prefix (tokens whose keys/values are final) followed by uncommitted
entries that form a tree: draft-tree nodes, or tokens just scored but not yet accepted. Each
uncommitted entry knows its parent, which gives its position id (prefix length + depth) and its
row of the 4D attention mask (the prefix plus its ancestors). After verification `commit` keeps
the accepted root-to-leaf path and drops every other entry, so the cache stays a plain sequence.
Stock transformers models take the 4D mask and position ids as they are: no forked modeling code.

Every forward goes through a `ModelRuntime` (model_runtime.py): the model and what the engine keeps
about it. Storage (kv_pool.py): every row keeps its keys/values in its runtime's preallocated pool,
written in place; a row holds a line of slot ids. Forks of one prompt hold the parent's prefix slots
(counted, not copied), commit moves slot ids only, and a batched forward (`forward_batch`) packs the
rows' new entries into one sequence (no padding between rows) and runs one attention call per layer
for all rows over the pool (row_attention.py). `copy_s` counts the KV moves that remain (the gathered
histories of models whose attention cannot read the pool).
"""
from __future__ import annotations

import time

import torch
from transformers import DynamicCache

from . import graphed_forward, row_attention
from .cache_argument import cache_kwargs
from .masks import batched_visibility, build_attention_mask, tree_visibility, window_masks
from .model_runtime import ModelRuntime
from .row_storage import RowCache
from .host_to_device import to_device
from .token_rows import host_tokens, packed_ids
from .target_features import placed_features


class KVCache:
    def __init__(self, cache: RowCache | None = None, committed: int = 0):
        self.cache = cache if cache is not None else RowCache()
        self.committed = committed
        self.parents: list[int] = []  # per uncommitted entry: its parent entry, -1 = the prefix

    @property
    def copy_s(self) -> float:
        """Seconds spent moving KV tensors (regrowth, dropping entries, batching rows): cache management."""
        return self.cache.copy_s

    @copy_s.setter
    def copy_s(self, value: float) -> None:
        self.cache.copy_s = value

    @property
    def length(self) -> int:
        return self.committed + len(self.parents)

    def fork(self, length: int | None = None) -> "KVCache":
        """A cache whose history is this committed prefix (its first `length` entries: default all),
        shared (the same pool slots, no copy): each cache writes only into slots of its own."""
        if self.parents:
            raise RuntimeError("fork a cache only when it has no uncommitted entries")
        length = self.committed if length is None else length
        if not 0 <= length <= self.committed:
            raise ValueError(f"fork of {length} entries from a cache of {self.committed}")
        return KVCache(self.cache.fork(length), length)

    def forward(self, runtime: ModelRuntime, tokens: "list[int] | torch.Tensor", parents: list[int],
                logits_to_keep: int = 0, features: torch.Tensor | None = None) -> torch.Tensor:
        """Score new entries through `runtime` (always the same one: the cache lives in its pool);
        tokens: a host list or a 1-D tensor on the device (token_rows.py);
        parents index the uncommitted entries (old then new), -1 = prefix.
        Returns the logits [len(tokens), V] of the new entries, or of the last `logits_to_keep` of
        them (a prefill needs none of its prompt's logits: the LM head is a fifth of a small model).
        features: the target's hidden states for the first entries, for a drafter that reads them
        (target_features.py; the other entries read zeros)."""
        model = runtime.model
        if row_attention.serves(model):  # a batch of one: the one path of every model that can take it
            runtime.layout.check_tree_masks("a draft tree")
            return _forward_pooled(runtime, [self], [tokens], [parents],
                                   None if features is None else [features], logits_to_keep, None)[0]
        tokens = host_tokens(tokens)  # the stock path builds its inputs on the host
        n_old, n = len(self.parents), len(tokens)
        pad = runtime.padded_rows(n) - n
        if pad:  # a chain off the last real entry, dropped below: no real entry attends to it (query_padding.py)
            tokens = list(tokens) + [tokens[-1]] * pad
            parents = list(parents) + [n_old + n - 1 + i for i in range(pad)]
            logits_to_keep = logits_to_keep + pad if logits_to_keep else 0
        all_parents = self.parents + list(parents)
        device, dtype = runtime.placement
        mask = None
        if any(p != i - 1 for i, p in enumerate(all_parents)):  # a real tree: spell out who sees whom
            layout = runtime.layout
            layout.check_tree_masks("a draft tree")
            allowed, query_pos, key_pos = tree_visibility(self.committed, all_parents, n_old)
            mask = build_attention_mask(layout, allowed[None], query_pos[None], key_pos[None], dtype, device)
        else:  # a chain needs no mask: the model's own causal and sliding-window masks are exact for it
            query_pos = torch.arange(self.length, self.length + len(parents))
        keep = {"logits_to_keep": logits_to_keep} if logits_to_keep else {}
        keep.update(_feature_inputs(model, None if features is None else [features], (1, len(tokens)), [(0, 0)]))
        with self.cache.scoring(runtime.pool, len(tokens)):
            out = model(input_ids=to_device([tokens], device), position_ids=to_device(query_pos[None], device),
                        attention_mask=mask, use_cache=True, **cache_kwargs(model, self.cache), **keep)
        self.parents = all_parents
        if not pad:
            return out.logits[0]
        self.keep_entries(list(range(len(all_parents) - pad)))  # only the length moves: nothing is copied
        self.parents = all_parents[:-pad]
        return out.logits[0, :-pad]

    def commit(self, keep: list[int]) -> None:
        """Keep the uncommitted entries `keep` (a root-to-leaf chain, in order), drop the rest."""
        for i, entry in enumerate(keep):
            expected = keep[i - 1] if i else -1
            if self.parents[entry] != expected:
                raise ValueError(f"commit expects a chain from the prefix; entry {entry} has parent "
                                 f"{self.parents[entry]}, not {expected}")
        self.keep_entries(keep)
        self.committed += len(keep)
        self.parents = []

    def keep_entries(self, entries: list[int]) -> None:
        """Reorder the uncommitted tail to `entries` (indices of uncommitted entries), dropping the
        rest: only slot ids move, never an entry. The caller fixes `parents`."""
        if entries == list(range(len(self.parents))):
            return
        self.cache.pool.keep(self.cache.line, self.committed, entries)

def _feature_inputs(model, features: list[torch.Tensor | None] | None, shape: tuple[int, int],
                    slots: list[tuple[int, int]]) -> dict:
    """The drafter's `target_features` argument [rows, entries, size] (none: no argument at all):
    features[i] at batch row slots[i][0] from entry slots[i][1] on, zeros elsewhere."""
    if features is None:
        return {}
    return {"target_features": placed_features(features, shape, slots, model.feature_size, model.dtype, model.device)}


def forward_batch(runtime: ModelRuntime, caches: list[KVCache], tokens: list, parents: list[list[int]],
                  what: str = "batched verification (verify_batch > 1)",
                  features: list[torch.Tensor | None] | None = None, logits_to_keep: int = 0,
                  fixed_shapes: "bool | graphed_forward.Buckets | None" = None) -> list[torch.Tensor]:
    """`KVCache.forward` for several sequences in ONE forward (batched drafting and verification).

    tokens[b]: row b's new tokens, a host list or a 1-D tensor on the device (token_rows.py).
    parents[b] indexes row b's uncommitted entries (old then new), -1 = its prefix, as in
    `KVCache.forward`. The rows' new entries are packed into one sequence (no padding between rows);
    nothing but a row's own entries ever reaches its slots. Every row attends exactly to what it would
    alone, over the pool (row_attention.py); models whose attention cannot read the pool (Falcon) take
    `_forward_batch_copied`. logits_to_keep (one row only): the logits of its last entries only.
    fixed_shapes: run at a bucketed shape (graphed_forward.py): None, on CUDA only, where the bucket's
    CUDA graph replays it; True (the default buckets) or a `graphed_forward.Buckets` anywhere, eagerly
    off CUDA (tests prove padding changes nothing); False never. Forwards a fixed shape cannot serve
    (target features, capture hooks, a prefill above the buckets) run `_forward_packed`.
    """
    runtime.layout.check_tree_masks(what)
    if not row_attention.serves(runtime.model):
        return _forward_batch_copied(runtime, caches, tokens, parents, features)
    return _forward_pooled(runtime, caches, tokens, parents, features, logits_to_keep, fixed_shapes)


def _forward_pooled(runtime: ModelRuntime, caches: list[KVCache], tokens: list[list[int]],
                    parents: list[list[int]], features: list[torch.Tensor | None] | None, logits_to_keep: int,
                    fixed_shapes: "bool | graphed_forward.Buckets | None") -> list[torch.Tensor]:
    """`forward_batch` of a model that row attention serves (checked by the caller)."""
    if logits_to_keep and len(caches) > 1:
        raise ValueError("logits_to_keep is for a forward of one row")
    model, layout, pool, windows = runtime.model, runtime.layout, runtime.pool, runtime.windows
    for kv in caches:
        kv.cache.bind(pool)
    n_new = [len(t) for t in tokens]
    all_parents = [kv.parents + list(pars) for kv, pars in zip(caches, parents)]
    n_keys = max(kv.length + n for kv, n in zip(caches, n_new))
    fixed = graphed_forward.bucket(runtime, fixed_shapes, features, n_new, n_keys)
    if fixed is not None:
        runner, shape = fixed
        visibility = batched_visibility([kv.committed for kv in caches], all_parents,
                                        [len(kv.parents) for kv in caches])
        with pool.scoring([kv.cache.line for kv in caches], n_new, on_device=False) as plan:
            logits = runner.run(model, layout, windows, pool, plan, shape, tokens, n_new, *visibility,
                                keep=logits_to_keep)
        rows = [logits] if logits_to_keep else list(logits.split(n_new))
    else:
        rows = _forward_packed(runtime, caches, tokens, all_parents, windows, features, logits_to_keep)
    for kv, pars in zip(caches, all_parents):
        kv.parents = pars
    return rows


def forward_rows(runtime: ModelRuntime, caches, tokens: list[list[int]], parents: list[list[int]], what: str,
                 features: list[torch.Tensor | None] | None = None, logits_to_keep: int = 0) -> list[torch.Tensor]:
    """One forward of every row: a row alone goes through its cache (`KVCache.forward`, which takes the
    batched path where the model allows it and the stock path where no batched mask is exact: ALiBi),
    several rows through `forward_batch`. logits_to_keep: a row alone only."""
    if len(caches) == 1:
        row_features = None if features is None else features[0]
        return [caches[0].forward(runtime, tokens[0], parents[0], logits_to_keep=logits_to_keep, features=row_features)]
    return forward_batch(runtime, caches, tokens, parents, what=what,
                         features=features if features is not None and any(f is not None for f in features) else None)


def _forward_packed(runtime: ModelRuntime, caches: list[KVCache], tokens: list[list[int]],
                    all_parents: list[list[int]], windows: list[int | None],
                    features: list[torch.Tensor | None] | None, logits_to_keep: int) -> list[torch.Tensor]:
    """`forward_batch` at exactly the rows' size: every row's logits (or the last `logits_to_keep`).
    all_parents[b]: row b's uncommitted entries' parents after this forward (old then new)."""
    model, layout, pool = runtime.model, runtime.layout, runtime.pool
    device, dtype = runtime.placement
    n_new = [len(t) for t in tokens]
    # packed, not padded (EMS-SD): the rows' queries follow each other in one sequence, so every linear
    # layer and the LM head run on the real entries only; row_attention.py gives each row its own slice
    starts, at = [], 0
    for n in n_new:
        starts.append(at)
        at += n
    n_real = at
    # padding queries after the last row where the hardware runs more entries cheaper (query_padding.py);
    # they belong to no row: they attend to nothing and never reach storage
    n_query = runtime.padded_rows(n_real)
    attend = runtime.flex  # attention="pool": the rows' slots are a block mask over the pool, always built
    if attend is None and _sees_everything(caches, n_new, windows):  # no key hidden from any query: no mask
        masks = {window: None for window in set(windows)}
        packed = torch.tensor([kv.length for kv in caches])  # each row's one query sits at its length
    else:
        allowed, query_pos, key_pos = batched_visibility([kv.committed for kv in caches], all_parents,
                                                         [len(kv.parents) for kv in caches])
        masks = {} if attend is not None else window_masks(allowed, query_pos, key_pos, set(windows), dtype, device)
        if all(n == 1 for n in n_new):  # one entry per row (a decode step): already in packed order
            packed = query_pos[:, 0]
        else:
            packed = query_pos[torch.arange(query_pos.shape[1])[None] < torch.tensor(n_new)[:, None]]  # row-major
    positions = (torch.cat([packed, packed.new_zeros(n_query - n_real)]) if n_query > n_real else packed)[None]
    input_ids = packed_ids(tokens, n_query - n_real, device)
    history = max(kv.length for kv in caches)
    placeholder = torch.zeros(1, 1, n_query, 1, dtype=dtype, device=device)  # masks are per row
    mask = {t: placeholder for t in layout.windows} if layout.as_dict else placeholder
    extra = _feature_inputs(model, features, (1, n_query), [(0, start) for start in starts])
    if logits_to_keep:
        extra["logits_to_keep"] = logits_to_keep + n_query - n_real
    with pool.scoring([kv.cache.line for kv in caches], n_new) as plan:
        batch = row_attention.RowBatchCache.packed(model.config, pool, plan, n_new, starts, n_query, masks, windows,
                                                   history, attend)
        if attend is not None:
            batch.pool_masks(allowed, query_pos, key_pos)
        with row_attention.active_batch(model, batch):
            out = model(input_ids=input_ids, position_ids=to_device(positions, device), attention_mask=mask,
                        use_cache=True, **cache_kwargs(model, batch), **extra)
    if logits_to_keep:
        return [out.logits[0, :logits_to_keep]]
    if len(n_new) == 1:
        return [out.logits[0, :n_real]]
    return list(out.logits[0, :n_real].split(n_new))  # one op for every row's view


def _sees_everything(caches: list[KVCache], n_new: list[int], windows: list[int | None]) -> bool:
    """A decode step of rows of one length, all of whose history is inside every layer's window: each
    query sees every key of its row and there are no padding keys, so the mask would be all zeros."""
    if any(n != 1 for n in n_new) or any(kv.parents for kv in caches):
        return False
    length = caches[0].length + 1
    return all(kv.length + 1 == length for kv in caches) and all(w is None or w >= length for w in windows)


def _forward_batch_copied(runtime: ModelRuntime, caches: list[KVCache], tokens: list[list[int]],
                          parents: list[list[int]], features: list[torch.Tensor | None] | None = None
                          ) -> list[torch.Tensor]:
    """The fallback: every row's history gathered and left-padded into one DynamicCache (a copy per call,
    counted in copy_s), one forward with a padded 4D mask, then the rows' new entries go to the pool."""
    model, layout, pool = runtime.model, runtime.layout, runtime.pool
    device, dtype = runtime.placement
    tokens = [host_tokens(row) for row in tokens]  # this path builds its inputs on the host
    for kv in caches:
        kv.cache.bind(pool)
    n_hist = max(kv.length for kv in caches)
    n_query = max(len(t) for t in tokens)
    batch = len(caches)
    allowed = torch.zeros(batch, n_query, n_hist + n_query, dtype=torch.bool)
    query_pos = torch.zeros(batch, n_query, dtype=torch.long)
    key_pos = torch.zeros(batch, n_hist + n_query, dtype=torch.long)  # padding keys: hidden anyway
    input_ids = torch.zeros(batch, n_query, dtype=torch.long)
    for b, (kv, toks, pars) in enumerate(zip(caches, tokens, parents)):
        row_allowed, row_qpos, row_kpos = tree_visibility(kv.committed, kv.parents + list(pars), len(kv.parents))
        pad = n_hist - kv.length
        allowed[b, : len(toks), pad: n_hist] = row_allowed[:, : kv.length]
        allowed[b, : len(toks), n_hist: n_hist + len(toks)] = row_allowed[:, kv.length:]
        query_pos[b, : len(toks)] = row_qpos
        key_pos[b, pad: n_hist + len(toks)] = row_kpos
        input_ids[b, : len(toks)] = torch.tensor(toks)
        for row in range(len(toks), n_query):  # padding queries see only themselves (no NaN rows)
            allowed[b, row, n_hist + row] = True
            query_pos[b, row] = key_pos[b, n_hist + row] = kv.length
    mask = build_attention_mask(layout, allowed, query_pos, key_pos, dtype, device)
    copy_start = time.perf_counter()
    stacked = DynamicCache()
    if n_hist:  # a batch of one-token prompts has no history yet: nothing to stack
        index = torch.zeros(batch, n_hist, dtype=torch.long)
        for b, kv in enumerate(caches):
            index[b, n_hist - kv.length:] = pool.slots_of(kv.cache.line)  # left-padded: the pads are masked
        index = to_device(index, pool.device)
        for layer_idx in sorted(pool.keys):
            keys, values = pool.read(layer_idx, index)  # [B, n_hist, kv_heads, D]
            stacked.update(keys.transpose(1, 2), values.transpose(1, 2), layer_idx)
    copy_s = time.perf_counter() - copy_start
    extra = _feature_inputs(model, features, (batch, n_query), [(b, 0) for b in range(batch)])
    out = model(input_ids=to_device(input_ids, device), position_ids=to_device(query_pos, device),
                attention_mask=mask, use_cache=True, **cache_kwargs(model, stacked), **extra)
    n_new = [len(t) for t in tokens]
    with pool.scoring([kv.cache.line for kv in caches], n_new, find_shared=False) as plan:
        new = slice(n_hist, n_hist + n_query)
        for layer_idx, layer in enumerate(stacked.layers):
            keys, values = layer.keys[:, :, new].transpose(1, 2), layer.values[:, :, new].transpose(1, 2)
            take = [b * n_query + i for b, n in enumerate(n_new) for i in range(n)]  # the real entries, row by row
            pool.write(layer_idx, plan.write_slots, keys.reshape(-1, *keys.shape[2:])[take],
                       values.reshape(-1, *values.shape[2:])[take])
    logits = []
    for b, (kv, toks, pars) in enumerate(zip(caches, tokens, parents)):
        kv.parents = kv.parents + list(pars)
        logits.append(out.logits[b, : len(toks)])
    for kv in caches:  # the padded copy in is what this layout costs per forward
        kv.copy_s += copy_s / batch
    return logits
