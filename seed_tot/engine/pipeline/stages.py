"""A target split into pipeline stages: contiguous decoder-layer ranges with their own KV caches.

Each stage calls the model's stock decoder layers (`model.model.layers[i]`) with hidden states,
rotary position embeddings from `model.model.rotary_emb`, a 4D tree mask and position ids, so no
modeling code is forked. The first stage embeds token ids, the last applies the final norm and
the LM head. A stage's KV cache is the engine's `KVCache` (committed prefix + tree entries); next
to it the stage remembers which prediction-tree node each uncommitted entry holds, so every stage
can prune and reroot its own cache from the same decision.
"""
from __future__ import annotations

import torch
from torch import nn

from ..cache_argument import cache_kwargs
from ..kv_cache import KVCache
from ..kv_pool import KVPool
from ..masks import FULL, AttentionLayout, build_attention_mask, tree_visibility

# decoder-only models whose stock forward is exactly embed -> layers -> norm -> lm_head (Gemma, for
# one, scales its embeddings inside the model's forward, which a stage would skip)
STAGEABLE = ("llama", "qwen2", "qwen3", "mistral")


def split_layers(n_layers: int, n_stages: int) -> list[range]:
    """Contiguous, balanced layer ranges (sizes differ by at most one; earlier stages get the extra)."""
    if n_stages < 1:
        raise ValueError(f"a pipeline needs at least one target stage, got {n_stages}")
    if n_stages > n_layers:
        raise ValueError(f"cannot split a target with {n_layers} decoder layers into {n_stages} stages: "
                         f"use at most {n_layers} stages")
    base, extra = divmod(n_layers, n_stages)
    ranges, start = [], 0
    for s in range(n_stages):
        size = base + (1 if s < extra else 0)
        ranges.append(range(start, start + size))
        start += size
    return ranges


def tree_mask(layout: AttentionLayout, committed: int, parents: list[int], n_old: int, dtype: torch.dtype,
              device: torch.device) -> tuple[torch.Tensor, torch.Tensor | dict[str, torch.Tensor]]:
    """Position ids [1, n_new] and the 4D mask(s) of the new entries parents[n_old:] (parent -1 = the
    committed prefix), built by engine/masks.py: sliding windows and per-layer-type masks included."""
    allowed, query_pos, key_pos = tree_visibility(committed, parents, n_old)
    mask = build_attention_mask(layout, allowed[None], query_pos[None], key_pos[None], dtype, device)
    return query_pos[None].to(device), mask


class StageKV:
    """A stage's KVCache plus the prediction-tree node id of each uncommitted entry."""

    def __init__(self) -> None:
        self.kv = KVCache()
        self.ids: list[int] = []

    def entry_of(self, node: int) -> int:
        return self.ids.index(node)

    def parents_for(self, parent_ids: list[int], new_ids: list[int]) -> list[int]:
        """Entry indices of new nodes' parents (already cached, or earlier in the same batch); -1 = prefix."""
        where = {n: i for i, n in enumerate(self.ids + new_ids)}
        return [where.get(p, -1) for p in parent_ids]

    def retain(self, commit_ids: list[int], keep_ids: list[int]) -> None:
        """Commit the chain `commit_ids` (the prefix grows by it), keep `keep_ids` uncommitted (a subtree
        hanging off the chain's end; ids this stage never saw are skipped), drop every other entry.
        This is PipeDec's reroot: KVCache.commit keeps only a chain, here a subtree stays in flight."""
        kv = self.kv
        where = {n: i for i, n in enumerate(self.ids)}
        commit = [where[n] for n in commit_ids]
        keep_ids = [n for n in keep_ids if n in where]
        keep = [where[n] for n in keep_ids]
        for i, entry in enumerate(commit):
            if kv.parents[entry] != (commit[i - 1] if i else -1):
                raise ValueError(f"retain: entry {entry} does not continue the committed chain")
        slot = {e: i for i, e in enumerate(keep)}
        anchor = commit[-1] if commit else -1
        parents = []
        for e in keep:
            if kv.parents[e] != anchor and kv.parents[e] not in slot:
                raise ValueError(f"retain: kept entry {e} hangs off neither the new prefix nor a kept entry")
            parents.append(slot.get(kv.parents[e], -1))
        kv.keep_entries(commit + keep)  # in place: only the uncommitted tail moves
        kv.committed += len(commit)
        kv.parents = parents
        self.ids = keep_ids


class TargetStage(nn.Module):
    """Decoder layers `layers` of a causal LM (Llama/Qwen2/Mistral layout: model.model.layers)."""

    def __init__(self, model: nn.Module, layers: range, first: bool, last: bool):
        super().__init__()
        inner = getattr(model, "model", None)
        if inner is None or not hasattr(inner, "layers"):
            raise ValueError(f"cannot split {type(model).__name__}: it has no model.layers")
        if model.config.model_type not in STAGEABLE:
            raise ValueError(f"pipeline stages support {', '.join(STAGEABLE)} models (embed, decoder layers, norm, "
                             f"LM head, nothing else in the forward); {model.config.model_type} is not one of them")
        types = getattr(model.config, "layer_types", None) or [FULL] * model.config.num_hidden_layers
        self.layer_types = [types[i] for i in layers]
        self.layout = AttentionLayout.of(model)
        self.layer_range = layers
        self.blocks = nn.ModuleList([inner.layers[i] for i in layers])
        self.rotary = inner.rotary_emb
        self.embed = inner.embed_tokens if first else None
        self.norm = inner.norm if last else None
        self.head = model.lm_head if last else None
        self.first, self.last = first, last
        self.dtype = model.dtype
        self.device = model.device
        self.hidden_size = model.config.hidden_size
        self.pool = KVPool(self.device)  # its layers' KV storage: every stage keeps its own

    @torch.inference_mode()
    def run(self, cache: StageKV, ids: list[int], tokens: list[int], parent_ids: list[int],
            hidden: torch.Tensor | None) -> torch.Tensor:
        """Process new nodes (ids, their tokens, their parents' node ids): hidden states [1, n, H] in,
        hidden states out (logits [n, V] at the last stage). The nodes join this stage's cache."""
        kv = cache.kv
        parents = cache.parents_for(parent_ids, ids)
        all_parents = kv.parents + parents
        positions, mask = tree_mask(self.layout, kv.committed, all_parents, len(kv.parents), self.dtype, self.device)
        if self.first:
            hidden = self.embed(torch.tensor([tokens], device=self.device))
        position_embeddings = self.rotary(hidden, position_ids=positions)
        with kv.cache.scoring(self.pool, len(tokens)):
            for block, layer_type in zip(self.blocks, self.layer_types):
                layer_mask = mask[layer_type] if isinstance(mask, dict) else mask  # sliding or full layer
                hidden = block(hidden, attention_mask=layer_mask, position_ids=positions, use_cache=True,
                               position_embeddings=position_embeddings, **cache_kwargs(block, kv.cache))
        kv.parents = all_parents
        cache.ids = cache.ids + list(ids)
        if self.last:
            return self.head(self.norm(hidden))[0]
        return hidden


def build_stages(model: nn.Module, n_stages: int) -> list[TargetStage]:
    ranges = split_layers(model.config.num_hidden_layers, n_stages)
    return [TargetStage(model, r, i == 0, i == len(ranges) - 1) for i, r in enumerate(ranges)]


def keep_only_stage(model: nn.Module, layers: range) -> None:
    """Free the decoder layers a stage process does not run (a real split holds 1/N of the target)."""
    inner = model.model
    for i in range(len(inner.layers)):
        if i not in layers:
            inner.layers[i] = nn.Identity()
