"""Prefill a call's prompts once per shared stretch of tokens (prefix caching within a call).

A ToT step sends prompts that differ only near the end: its thought prompts share the task's
few-shot text and the question, its value prompts share that and often the first steps. Scoring
each distinct prompt from its first token recomputes that text once per prompt, and on a CPU a
prompt token costs as much as a generated one. So the prompts are read as a trie (what SGLang's
radix cache and vLLM's prefix caching do across requests; here within one call): a stretch of at
least MIN_SHARED tokens that several prompts have in common is scored once, into a cache that each
of them forks (`KVCache.fork`: the stretch is read in place as a read-only segment, never copied),
and each prompt then scores only what follows. Copies of one prompt fork the whole prompt.

Exact: a token's keys and values depend only on the tokens before it and its position, so a prompt
scored in pieces holds the entries it would hold scored in one forward, up to the floating-point
order of the sums (as in any batched forward). Models whose attention cannot read a forked
segment in place (row_attention.py) keep one prefill per distinct prompt.

Across calls, a `PrefixStore` (one per model runtime, owned by the engine) keeps read-only forks of the
prompts and shared stretches it scored, LRU: a ToT search's next step repeats its question and
earlier steps, every problem repeats the task's few-shot text, so a call first forks the longest
stored stretch (at least MIN_SHARED tokens) that begins its prompts and scores only the rest.
A fork is a view: storing costs no copy; the row it views only ever writes past it.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

import torch

from . import row_attention
from .kv_cache import KVCache
from .masks import UnsupportedAttention
from .model_runtime import ModelRuntime
from .speculative import extend

# Shorter common stretches are scored with each prompt: a separate forward costs more than the
# tokens it saves (one 1.5B forward of 1 token costs about as much as 3 tokens on the 2-core CPU).
MIN_SHARED = 32


@dataclass
class PrefillCost:
    """What one distinct prompt's prefill cost: its share of shared forwards counts 1/g of each."""

    forwards: float = 0.0
    busy_s: float = 0.0
    tokens: float = 0.0  # prompt tokens scored on this prompt's behalf (shared ones split the same way)


class PrefixStore:
    """Committed prompt stretches of one model kept across calls: token tuple -> a read-only fork,
    at most `max_entries` of them and `max_bytes` of KV storage kept alive (a storage several
    entries share counts once), least recently used dropped first (0 entries: keep nothing). The
    byte budget is what bounds memory: an entry's size is its prompt length times the model's KV
    bytes per token (46 KB for SmolLM2-135M in fp32, 0.5 MB for a 7B fp16 model without GQA)."""

    def __init__(self, max_entries: int = 32, max_bytes: int = 1 << 30):
        if max_entries < 0 or max_bytes < 0:
            raise ValueError(f"a prefix store keeps max_entries >= 0 entries and max_bytes >= 0 bytes, "
                             f"got {max_entries} and {max_bytes}")
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._entries: OrderedDict[tuple[int, ...], KVCache] = OrderedDict()
        self._lock = threading.Lock()  # prefill may run on more than one thread (synchronous callers)
        self.hit_tokens = 0  # prompt tokens served from the store (not scored again), for reports

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def retained_bytes(self) -> int:
        """Bytes of KV storage the entries keep alive, each slot once (entries share the few-shot trunk)."""
        slots, pool = [], None
        for kv in self._entries.values():
            if kv.cache.line is not None:
                pool = kv.cache.pool
                slots.append(pool.slots_of(kv.cache.line))
        if pool is None:
            return 0
        return int(torch.cat(slots).unique().numel()) * pool.bytes_per_slot()

    def put(self, tokens: list[int], kv: KVCache) -> None:
        if not self.max_entries or len(tokens) < MIN_SHARED:
            return
        with self._lock:
            self._entries[tuple(tokens)] = kv.fork()
            self._entries.move_to_end(tuple(tokens))
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
            while self._entries and self.retained_bytes() > self.max_bytes:
                self._entries.popitem(last=False)  # the new entry too, when it alone is over the budget

    def longest(self, tokens: list[int], limit: int) -> tuple[KVCache | None, int]:
        """A fork of the longest stored stretch that begins `tokens` (at most `limit` tokens of it),
        and its length; (None, 0) when none reaches MIN_SHARED."""
        with self._lock:
            best, best_key = self._match(tokens, limit)
            if best_key is None:
                return None, 0
            self._entries.move_to_end(best_key)
            return self._entries[best_key].fork(best), best

    def covered(self, tokens: list[int]) -> int:
        """How many of `tokens` a call would fork from the store (what `longest` finds), read without
        forking or refreshing an entry."""
        with self._lock:
            return self._match(tokens, len(tokens))[0]

    def _match(self, tokens: list[int], limit: int) -> tuple[int, tuple[int, ...] | None]:
        """The longest stored stretch beginning `tokens[:limit]`: its length and key; (0, None) below MIN_SHARED."""
        best, best_key = 0, None
        for key in self._entries:
            n = _common_length([key[:limit], tokens[:limit]])
            if n > best:
                best, best_key = n, key
        return (best, best_key) if best >= MIN_SHARED else (0, None)


def tokens_to_score(runtime: ModelRuntime, prompts: list[list[int]], store: PrefixStore | None = None) -> int:
    """The prompt tokens `prefill_prompts` would score for `prompts` (each but its last token, less the
    stretches shared within the call or kept in `store`), counted before any forward: what a policy
    prices a model's prefill by. Sorted prompts share with their neighbour what a trie shares; a
    common stretch shorter than MIN_SHARED, which prefill scores per prompt, counts once here (the
    count is a lower bound: every position of a distinct prefix is scored once at least). A model
    that cannot share scores each distinct prompt whole, even two that differ only in their last token."""
    unique = {tuple(p) for p in prompts}  # prefill forks copies of a prompt: whole prompts, not all but the last token
    share = len(unique) > 1 and _can_share(runtime)
    distinct = sorted({p[:-1] for p in unique}) if share else [p[:-1] for p in unique]
    if store is not None and (not store.max_entries or not _can_share(runtime)):
        store = None
    total, previous = 0, ()
    for prompt in distinct:
        done = _common_length([previous, prompt]) if share and previous else 0
        if store is not None:
            done = max(done, store.covered(list(prompt)))
        total += len(prompt) - done
        previous = prompt
    return total


def _can_share(runtime: ModelRuntime) -> bool:
    try:
        runtime.layout.check_tree_masks("a shared prompt prefix")
    except UnsupportedAttention:
        return False
    return row_attention.serves(runtime.model)


def _common_length(prompts: list[list[int]]) -> int:
    first, n = prompts[0], min(len(p) for p in prompts)
    for i in range(n):
        token = first[i]
        if any(p[i] != token for p in prompts):
            return i
    return n


@torch.inference_mode()
def prefill_prompts(runtime: ModelRuntime, prompts: list[list[int]], features: list[torch.Tensor] | None = None,
                    hidden=None, store: PrefixStore | None = None) -> tuple:
    """One committed cache per prompt holding all but its last token (scored with its first round),
    scored through `runtime`, and what each prompt's prefill cost. Equal prompts get forks of one
    cache. With a `store` (one kept for this runtime: its entries live in the runtime's pool), each
    prompt starts from the longest stretch stored by earlier calls, and what is scored is stored
    (not for a drafter that reads the target's hidden states: those come from the scoring forward).
    For a drafter that reads the target's hidden states (target_features.py): `features[i]` holds
    what prompt i's entries read ([len - 1, size]); with `hidden` (the target's TargetHidden) a
    third list holds each prompt's hidden states f_0..f_{len-2} (None for a one-token prompt)."""
    caches: list[KVCache | None] = [None] * len(prompts)
    costs = [PrefillCost() for _ in prompts]
    first_of: dict[tuple[int, ...], int] = {}
    distinct: list[int] = []
    for i, p in enumerate(prompts):
        key = tuple(p)
        if key in first_of:
            continue
        first_of[key] = i
        distinct.append(i)
    share = len(distinct) > 1 and _can_share(runtime)
    if store is not None and (features is not None or hidden is not None or not store.max_entries
                              or not _can_share(runtime)):
        store = None

    chunks: list[list[torch.Tensor]] = [[] for _ in prompts]  # hidden states by prompt, in position order

    def score(kv: KVCache, tokens: list[int], owners: list[int]) -> None:
        start = time.perf_counter()
        at = kv.length  # a shared stretch has the same tokens and positions for every owner
        extend(runtime, kv, tokens, None if features is None else features[owners[0]][at: at + len(tokens)])
        if hidden is not None and tokens:
            row = hidden.take_rows()[0, : len(tokens)]
            for i in owners:
                chunks[i].append(row)
        spent = time.perf_counter() - start
        for i in owners:
            costs[i].forwards += bool(tokens) / len(owners)
            costs[i].busy_s += spent / len(owners)
            costs[i].tokens += len(tokens) / len(owners)

    def build(base: KVCache | None, done: int, group: list[int]) -> None:
        """Caches for the prompts in `group`, which all begin with the `done` tokens in `base`."""
        members = [prompts[i] for i in group]
        common = min(_common_length(members), min(len(p) for p in members) - 1)  # never a prompt's last token
        if store is not None:  # an earlier call may have scored more of this group's beginning
            stored, n = store.longest(members[0], common)
            if n > done:
                base, done = stored, n
                store.hit_tokens += n * len(group)
        if len(group) == 1 or not share:
            for i in group:
                kv = base.fork() if base is not None else KVCache()
                score(kv, prompts[i][done: len(prompts[i]) - 1], [i])
                caches[i] = kv
                if store is not None:
                    store.put(prompts[i][:-1], kv)
            return
        if common - done >= MIN_SHARED:
            trunk = base.fork() if base is not None else KVCache()
            score(trunk, members[0][done:common], group)
            base, done = trunk, common
            if store is not None:
                store.put(members[0][:common], trunk)
        ended = [i for i in group if len(prompts[i]) - 1 == common]
        for i in ended:
            build(base, done, [i])
        by_next: dict[int, list[int]] = {}
        for i in group:
            if len(prompts[i]) - 1 > common:
                by_next.setdefault(prompts[i][common], []).append(i)
        for sub in by_next.values():
            build(base, done, sub)

    build(None, 0, distinct)
    build = None  # the recursive closure holds itself (and the caches): break the cycle so rows free promptly
    for i, p in enumerate(prompts):
        if caches[i] is None:
            caches[i] = caches[first_of[tuple(p)]].fork()
            chunks[i] = chunks[first_of[tuple(p)]]
    if hidden is None:
        return caches, costs
    return caches, costs, [torch.cat(c) if c else None for c in chunks]
