"""The one owner of a sequence's KV cache in one model.

A cache holds a *committed* prefix (tokens whose keys/values are final) followed by uncommitted
entries that form a tree: draft-tree nodes, or tokens just scored but not yet accepted. Each
uncommitted entry knows its parent, which gives its position id (prefix length + depth) and its
row of the 4D attention mask (the prefix plus its ancestors). After verification `commit` keeps
the accepted root-to-leaf path and drops every other entry, so the cache stays a plain sequence.
Stock transformers models take the 4D mask and position ids as they are: no forked modeling code.

Storage (issue 10, row_storage.py): per layer, a row's keys/values live in preallocated buffers
with spare capacity, written in place (growth by doubling: amortised O(1) per token). Forks of one
prompt read the parent's committed prefix as read-only segments and write only into their own
buffers. A batched forward (`forward_batch`) packs the rows' new entries into one sequence (no padding
between rows), appends to every row's own buffers and attends over each row's segments where they
lie (row_attention.py): no per-call copy of any history. `copy_s`
counts every KV move that remains (regrowth, commit's compaction of the tree tail, and the
copying fallback for models whose attention cannot read rows in place).
"""
from __future__ import annotations

import time

import torch
from transformers import DynamicCache

from . import row_attention
from .cache_argument import cache_kwargs
from .masks import AttentionLayout, build_attention_mask, tree_visibility
from .query_padding import padded_rows
from .target_features import placed_features
from .row_storage import RowCache, RowLayer


def _first(segments: list, length: int) -> list:
    """The segments [(keys, values)] cut to their first `length` entries (views)."""
    out = []
    for keys, values in segments:
        if length <= 0:
            break
        n = min(length, keys.shape[-2])
        out.append((keys[:, :, :n], values[:, :, :n]) if n < keys.shape[-2] else (keys, values))
        length -= n
    return out


def layout_of(model) -> AttentionLayout:
    """The model's attention layout, worked out once per model object (it reads the model's source)."""
    layout = getattr(model, "_seed_tot_attention_layout", None)
    if layout is None:
        layout = AttentionLayout.of(model)
        object.__setattr__(model, "_seed_tot_attention_layout", layout)  # plain attribute, not a submodule
    return layout


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
        shared read-only (no copy): the fork writes only into its own buffers, and this cache only
        ever writes past the shared entries."""
        if self.parents:
            raise RuntimeError("fork a cache only when it has no uncommitted entries")
        length = self.committed if length is None else length
        if not 0 <= length <= self.committed:
            raise ValueError(f"fork of {length} entries from a cache of {self.committed}")
        return KVCache(RowCache([_first(layer.segments(), length) for layer in self.cache.layers]), length)

    def forward(self, model, tokens: list[int], parents: list[int], logits_to_keep: int = 0,
                features: torch.Tensor | None = None) -> torch.Tensor:
        """Score new entries; parents index the uncommitted entries (old then new), -1 = prefix.
        Returns the logits [len(tokens), V] of the new entries, or of the last `logits_to_keep` of
        them (a prefill needs none of its prompt's logits: the LM head is a fifth of a small model).
        features: the target's hidden states for the first entries, for a drafter that reads them
        (target_features.py; the other entries read zeros)."""
        if self.cache.forked and row_attention.install(model):  # read the shared prefix in place
            logits = forward_batch(model, [self], [tokens], [parents], what="a forked cache",
                                   features=None if features is None else [features])[0]
            return logits[-logits_to_keep:] if logits_to_keep else logits
        n_old, n = len(self.parents), len(tokens)
        pad = padded_rows(model, n) - n
        if pad:  # a chain off the last real entry, dropped below: no real entry attends to it (query_padding.py)
            tokens = list(tokens) + [tokens[-1]] * pad
            parents = list(parents) + [n_old + n - 1 + i for i in range(pad)]
            logits_to_keep = logits_to_keep + pad if logits_to_keep else 0
        all_parents = self.parents + list(parents)
        device = model.device
        mask = None
        if any(p != i - 1 for i, p in enumerate(all_parents)):  # a real tree: spell out who sees whom
            layout = layout_of(model)
            layout.check_tree_masks("a draft tree")
            allowed, query_pos, key_pos = tree_visibility(self.committed, all_parents, n_old)
            mask = build_attention_mask(layout, allowed[None], query_pos[None], key_pos[None], model.dtype, device)
        else:  # a chain needs no mask: the model's own causal and sliding-window masks are exact for it
            query_pos = torch.arange(self.length, self.length + len(parents))
        keep = {"logits_to_keep": logits_to_keep} if logits_to_keep else {}
        keep.update(_feature_inputs(model, None if features is None else [features], (1, len(tokens)), [(0, 0)]))
        out = model(input_ids=torch.tensor([tokens], device=device), position_ids=query_pos[None].to(device),
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
        rest, in place: only tail entries move, never the history. The caller fixes `parents`."""
        if entries == list(range(len(self.parents))):
            return
        start = time.perf_counter()
        for layer in self.cache.layers:
            if layer.n_own or layer.shared:
                own_committed = self.committed - sum(k.shape[-2] for k, _ in layer.shared)
                layer.keep_tail(own_committed, entries)
        self.copy_s += time.perf_counter() - start

def _feature_inputs(model, features: list[torch.Tensor | None] | None, shape: tuple[int, int],
                    slots: list[tuple[int, int]]) -> dict:
    """The drafter's `target_features` argument [rows, entries, size] (none: no argument at all):
    features[i] at batch row slots[i][0] from entry slots[i][1] on, zeros elsewhere."""
    if features is None:
        return {}
    return {"target_features": placed_features(features, shape, slots, model.feature_size, model.dtype, model.device)}


def forward_batch(model, caches: list[KVCache], tokens: list[list[int]], parents: list[list[int]],
                  what: str = "batched verification (verify_batch > 1)",
                  features: list[torch.Tensor | None] | None = None) -> list[torch.Tensor]:
    """`KVCache.forward` for several sequences in ONE forward (batched drafting and verification).

    parents[b] indexes row b's uncommitted entries (old then new), -1 = its prefix, as in
    `KVCache.forward`. The rows' new entries are packed into one sequence (no padding between rows);
    nothing but a row's own entries ever reaches its storage. Every row attends exactly to what its
    own `KVCache.forward` would, over its own storage where it lies (row_attention.py); models whose
    attention cannot do that (Falcon) take `_forward_batch_copied`.
    """
    layout = layout_of(model)
    layout.check_tree_masks(what)
    if not row_attention.install(model):
        return _forward_batch_copied(model, layout, caches, tokens, parents, features)
    device, dtype = model.device, model.dtype
    windows = row_attention.layer_windows(model, layout)
    # packed, not padded (EMS-SD): the rows' queries follow each other in one sequence, so every linear
    # layer and the LM head run on the real entries only; row_attention.py gives each row its own slice
    n_new = [len(t) for t in tokens]
    starts = [sum(n_new[:b]) for b in range(len(caches))]
    # padding queries after the last row where the hardware runs more entries cheaper (query_padding.py);
    # they belong to no row: they attend to nothing and never reach storage
    n_query = padded_rows(model, sum(n_new))
    input_ids = torch.zeros(1, n_query, dtype=torch.long)
    query_pos = torch.zeros(1, n_query, dtype=torch.long)
    masks = []
    for kv, toks, pars, start in zip(caches, tokens, parents, starts):
        allowed, row_qpos, row_kpos = tree_visibility(kv.committed, kv.parents + list(pars), len(kv.parents))
        masks.append(row_attention.row_masks(allowed, row_qpos, row_kpos, set(windows), dtype, device))
        input_ids[0, start: start + len(toks)] = torch.tensor(toks)
        query_pos[0, start: start + len(toks)] = row_qpos
    batch = row_attention.RowBatchCache(model.config, [kv.cache for kv in caches], n_new, starts, n_query, masks,
                                        windows)
    placeholder = torch.zeros(1, 1, n_query, 1, dtype=dtype, device=device)  # masks are per row
    mask = {t: placeholder for t in layout.windows} if layout.as_dict else placeholder
    extra = _feature_inputs(model, features, (1, n_query), [(0, start) for start in starts])
    with row_attention.active_batch(batch):
        out = model(input_ids=input_ids.to(device), position_ids=query_pos.to(device), attention_mask=mask,
                    use_cache=True, **cache_kwargs(model, batch), **extra)
    logits = []
    for kv, pars, start, n in zip(caches, parents, starts, n_new):
        kv.parents = kv.parents + list(pars)
        logits.append(out.logits[0, start: start + n])
    return logits


def _forward_batch_copied(model, layout: AttentionLayout, caches: list[KVCache], tokens: list[list[int]],
                          parents: list[list[int]], features: list[torch.Tensor | None] | None = None
                          ) -> list[torch.Tensor]:
    """The fallback: every row's history left-padded into one DynamicCache (a copy per call, counted in
    copy_s), one forward with a padded 4D mask, then each row appends its new entries to its storage."""
    device, dtype = model.device, model.dtype
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
        template = next(kv for kv in caches if kv.length == n_hist).cache
        for layer_idx, layer in enumerate(template.layers):
            keys, values = [], []
            for kv in caches:
                k, v = _layer_kv(kv, layer_idx, layer)
                pad = n_hist - k.shape[-2]
                keys.append(torch.nn.functional.pad(k, (0, 0, pad, 0)))
                values.append(torch.nn.functional.pad(v, (0, 0, pad, 0)))
            stacked.update(torch.cat(keys), torch.cat(values), layer_idx)
    copy_s = time.perf_counter() - copy_start
    extra = _feature_inputs(model, features, (batch, n_query), [(b, 0) for b in range(batch)])
    out = model(input_ids=input_ids.to(device), position_ids=query_pos.to(device),
                attention_mask=mask, use_cache=True, **cache_kwargs(model, stacked), **extra)
    logits = []
    for b, (kv, toks, pars) in enumerate(zip(caches, tokens, parents)):
        for layer_idx, layer in enumerate(stacked.layers):
            new = slice(n_hist, n_hist + len(toks))
            kv.cache.layer(layer_idx).append(layer.keys[b: b + 1, :, new], layer.values[b: b + 1, :, new])
        kv.parents = kv.parents + list(pars)
        logits.append(out.logits[b, : len(toks)])
    for kv in caches:  # the padded copy in is what this layout costs per forward (issue 10 measures it)
        kv.copy_s += copy_s / batch
    return logits


def _layer_kv(kv: KVCache, layer_idx: int, template: RowLayer):
    """This row's keys/values of one layer (joined from its segments); an empty slice shaped like
    `template`'s (the model's real KV heads and head size, e.g. one head for multi-query Falcon)."""
    layers = kv.cache.layers
    if kv.length and layer_idx < len(layers):
        return layers[layer_idx].keys, layers[layer_idx].values
    keys, values = template.segments()[0]
    return keys[:1, ..., :0, :], values[:1, ..., :0, :]
