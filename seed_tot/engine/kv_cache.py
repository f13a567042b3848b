"""The one owner of a sequence's KV cache in one model.

A cache holds a *committed* prefix (tokens whose keys/values are final) followed by uncommitted
entries that form a tree: draft-tree nodes, or tokens just scored but not yet accepted. Each
uncommitted entry knows its parent, which gives its position id (prefix length + depth) and its
row of the 4D attention mask (the prefix plus its ancestors). After verification `commit` keeps
the accepted root-to-leaf path and drops every other entry, so the cache stays a plain sequence.
Stock transformers models take the 4D mask and position ids as they are: no forked modeling code.
"""
from __future__ import annotations

import copy
import time

import torch
from transformers import DynamicCache

from .masks import AttentionLayout, build_attention_mask, tree_visibility


def layout_of(model) -> AttentionLayout:
    """The model's attention layout, worked out once per model object (it reads the model's source)."""
    layout = getattr(model, "_seed_tot_attention_layout", None)
    if layout is None:
        layout = AttentionLayout.of(model)
        object.__setattr__(model, "_seed_tot_attention_layout", layout)  # plain attribute, not a submodule
    return layout


class KVCache:
    def __init__(self, cache: DynamicCache | None = None, committed: int = 0):
        self.cache = cache if cache is not None else DynamicCache()
        self.committed = committed
        self.parents: list[int] = []  # per uncommitted entry: its parent entry, -1 = the prefix
        self.copy_s = 0.0  # seconds spent moving KV tensors (dropping entries, batching rows): cache management

    @property
    def length(self) -> int:
        return self.committed + len(self.parents)

    def fork(self) -> "KVCache":
        """A cache that shares this committed prefix's tensors (no copy). Safe because transformers'
        DynamicLayer grows by torch.cat and we shrink by slicing: neither writes into shared storage."""
        if self.parents:
            raise RuntimeError("fork a cache only when it has no uncommitted entries")
        clone = copy.copy(self.cache)
        clone.layers = [copy.copy(layer) for layer in self.cache.layers]
        return KVCache(clone, self.committed)

    def forward(self, model, tokens: list[int], parents: list[int]) -> torch.Tensor:
        """Score new entries; parents index the uncommitted entries (old then new), -1 = prefix.
        Returns the logits [len(tokens), V] of the new entries."""
        n_old = len(self.parents)
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
        out = model(input_ids=torch.tensor([tokens], device=device), position_ids=query_pos[None].to(device),
                    attention_mask=mask, past_key_values=self.cache, use_cache=True)
        self.parents = all_parents
        return out.logits[0]

    def commit(self, keep: list[int]) -> None:
        """Keep the uncommitted entries `keep` (a root-to-leaf chain, in order), drop the rest."""
        for i, entry in enumerate(keep):
            expected = keep[i - 1] if i else -1
            if self.parents[entry] != expected:
                raise ValueError(f"commit expects a chain from the prefix; entry {entry} has parent "
                                 f"{self.parents[entry]}, not {expected}")
        if keep != list(range(len(self.parents))):
            if keep == list(range(len(keep))):  # a prefix of the entries: slicing is enough
                self._select(slice(0, self.committed + len(keep)))
            else:
                index = torch.cat([torch.arange(self.committed), self.committed + torch.tensor(keep, dtype=torch.long)])
                self._select(index)
        self.committed += len(keep)
        self.parents = []

    def _select(self, index) -> None:
        start = time.perf_counter()
        self._select_layers(index)
        self.copy_s += time.perf_counter() - start

    def _select_layers(self, index) -> None:
        for layer in self.cache.layers:
            if not getattr(layer, "is_initialized", False) or layer.keys is None or layer.keys.numel() == 0:
                continue
            if getattr(layer, "is_sliding", False):
                raise NotImplementedError("sliding-window cache layers are not supported by the tree verifier")
            if isinstance(index, torch.Tensor):
                idx = index.to(layer.keys.device)
                layer.keys = layer.keys.index_select(-2, idx)
                layer.values = layer.values.index_select(-2, idx)
            else:
                layer.keys = layer.keys[..., index, :]
                layer.values = layer.values[..., index, :]


def forward_batch(model, caches: list[KVCache], tokens: list[list[int]], parents: list[list[int]],
                  what: str = "batched verification (verify_batch > 1)") -> list[torch.Tensor]:
    """`KVCache.forward` for several sequences in ONE padded forward (batched drafting and verification).

    parents[b] indexes row b's uncommitted entries (old then new), -1 = its prefix, as in
    `KVCache.forward`. Each row's history (committed prefix + uncommitted entries) is left-padded to
    the longest and its new entries right-padded to the longest query; the 4D mask hides padding,
    so every row attends exactly to what its own `KVCache.forward` would. Afterwards each cache
    takes back its own slice (and stays unpadded).
    """
    device, dtype = model.device, model.dtype
    layout = layout_of(model)
    layout.check_tree_masks(what)
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
    n_prefix = n_hist  # the stacked history every row is padded to
    mask = build_attention_mask(layout, allowed, query_pos, key_pos, dtype, device)
    copy_start = time.perf_counter()
    stacked = DynamicCache()
    if n_prefix:  # a batch of one-token prompts has no history yet: nothing to stack
        template = next(kv for kv in caches if kv.length == n_prefix).cache.layers
        for layer_idx, layer in enumerate(template):
            keys, values = [], []
            for kv in caches:
                k, v = _layer_kv(kv, layer_idx, layer)
                pad = n_prefix - k.shape[-2]
                keys.append(torch.nn.functional.pad(k, (0, 0, pad, 0)))
                values.append(torch.nn.functional.pad(v, (0, 0, pad, 0)))
            stacked.update(torch.cat(keys), torch.cat(values), layer_idx)
    copy_s = time.perf_counter() - copy_start
    out = model(input_ids=input_ids.to(device), position_ids=query_pos.to(device),
                attention_mask=mask, past_key_values=stacked, use_cache=True)
    copy_start = time.perf_counter()
    logits = []
    for b, (kv, toks, pars) in enumerate(zip(caches, tokens, parents)):
        keep = slice(n_prefix - kv.length, n_prefix + len(toks))
        fresh = DynamicCache()
        for layer_idx, layer in enumerate(stacked.layers):
            fresh.update(layer.keys[b: b + 1, :, keep], layer.values[b: b + 1, :, keep], layer_idx)
        kv.cache = fresh
        kv.parents = kv.parents + list(pars)
        logits.append(out.logits[b, : len(toks)])
    # the padded copy in and the split out are what this layout costs per forward (issue 10 measures it)
    copy_s += time.perf_counter() - copy_start
    for kv in caches:
        kv.copy_s += copy_s / batch
    return logits


def _layer_kv(kv: KVCache, layer_idx: int, template):
    """This row's keys/values of one layer; an empty slice shaped like `template`'s (the model's real
    cache layout: its KV heads and head size, e.g. one head for multi-query Falcon) when it has none."""
    layers = kv.cache.layers
    if kv.length and layer_idx < len(layers):
        return layers[layer_idx].keys, layers[layer_idx].values
    return template.keys[:1, ..., :0, :], template.values[:1, ..., :0, :]
