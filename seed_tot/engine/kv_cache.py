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

import torch
from transformers import DynamicCache


class KVCache:
    def __init__(self, cache: DynamicCache | None = None, committed: int = 0):
        self.cache = cache if cache is not None else DynamicCache()
        self.committed = committed
        self.parents: list[int] = []  # per uncommitted entry: its parent entry, -1 = the prefix

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
        depth: list[int] = []
        for p in all_parents:
            depth.append(1 + (depth[p] if p >= 0 else 0))
        device = model.device
        positions = torch.tensor([self.committed + d - 1 for d in depth[n_old:]], device=device)[None]
        mask = None
        if any(p != i - 1 for i, p in enumerate(all_parents)):  # a real tree: spell out who sees whom
            mask = self._tree_mask(all_parents, n_old, model.dtype, device)
        out = model(input_ids=torch.tensor([tokens], device=device), position_ids=positions,
                    attention_mask=mask, past_key_values=self.cache, use_cache=True)
        self.parents = all_parents
        return out.logits[0]

    def _tree_mask(self, all_parents: list[int], n_old: int, dtype, device) -> torch.Tensor:
        n_new = len(all_parents) - n_old
        allowed = torch.zeros(n_new, self.committed + len(all_parents), dtype=torch.bool)
        allowed[:, : self.committed] = True
        for row, entry in enumerate(range(n_old, len(all_parents))):
            while entry >= 0:  # the entry itself and each ancestor
                allowed[row, self.committed + entry] = True
                entry = all_parents[entry]
        mask = torch.zeros(allowed.shape, dtype=dtype)
        mask.masked_fill_(~allowed, torch.finfo(dtype).min)
        return mask[None, None].to(device)  # [batch, head, query, key], additive (eager and sdpa)

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


def forward_batch(model, caches: list[KVCache], tokens: list[list[int]], parents: list[list[int]]) -> list[torch.Tensor]:
    """Score new entries of several sequences in ONE padded forward (SEED's verify_batch).

    Each row's committed KV is left-padded to the longest prefix and its new entries right-padded
    to the longest query; the 4D mask hides padding, so every row attends exactly to what its own
    `KVCache.forward` would. Afterwards each cache takes back its own slice (and stays unpadded).
    """
    device, dtype = model.device, model.dtype
    for kv in caches:
        if kv.parents:
            raise RuntimeError("forward_batch needs caches without uncommitted entries")
    n_prefix = max(kv.committed for kv in caches)
    n_query = max(len(t) for t in tokens)
    batch = len(caches)
    allowed = torch.zeros(batch, n_query, n_prefix + n_query, dtype=torch.bool)
    positions = torch.zeros(batch, n_query, dtype=torch.long)
    input_ids = torch.zeros(batch, n_query, dtype=torch.long)
    for b, (kv, toks, pars) in enumerate(zip(caches, tokens, parents)):
        depth: list[int] = []
        for row, p in enumerate(pars):
            depth.append(1 + (depth[p] if p >= 0 else 0))
            positions[b, row] = kv.committed + depth[row] - 1
            allowed[b, row, n_prefix - kv.committed: n_prefix] = True
            entry = row
            while entry >= 0:
                allowed[b, row, n_prefix + entry] = True
                entry = pars[entry]
        input_ids[b, : len(toks)] = torch.tensor(toks)
        for row in range(len(toks), n_query):  # padding queries see only themselves (no NaN rows)
            allowed[b, row, n_prefix + row] = True
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)
    stacked = DynamicCache()
    for layer_idx, (k_shape, _) in enumerate(_layer_shapes(model, caches)):
        keys, values = [], []
        for kv in caches:
            k, v = _layer_kv(kv, layer_idx, k_shape, device, dtype)
            pad = n_prefix - k.shape[-2]
            keys.append(torch.nn.functional.pad(k, (0, 0, pad, 0)))
            values.append(torch.nn.functional.pad(v, (0, 0, pad, 0)))
        stacked.update(torch.cat(keys), torch.cat(values), layer_idx)
    out = model(input_ids=input_ids.to(device), position_ids=positions.to(device),
                attention_mask=mask[:, None].to(device), past_key_values=stacked, use_cache=True)
    logits = []
    for b, (kv, toks, pars) in enumerate(zip(caches, tokens, parents)):
        keep = slice(n_prefix - kv.committed, n_prefix + len(toks))
        fresh = DynamicCache()
        for layer_idx, layer in enumerate(stacked.layers):
            fresh.update(layer.keys[b: b + 1, :, keep], layer.values[b: b + 1, :, keep], layer_idx)
        kv.cache = fresh
        kv.parents = list(pars)
        logits.append(out.logits[b, : len(toks)])
    return logits


def _layer_shapes(model, caches: list[KVCache]):
    config = model.config
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return [((1, heads, 0, head_dim), None)] * config.num_hidden_layers


def _layer_kv(kv: KVCache, layer_idx: int, empty_shape, device, dtype):
    layers = kv.cache.layers
    if layer_idx < len(layers) and getattr(layers[layer_idx], "is_initialized", False) and layers[layer_idx].keys is not None:
        return layers[layer_idx].keys, layers[layer_idx].values
    empty = torch.zeros(empty_shape, device=device, dtype=dtype)  # a one-token prompt has no prefix yet
    return empty, empty
