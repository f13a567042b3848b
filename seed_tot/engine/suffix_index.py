"""Suffix drafts: what the search's own text says comes next (SuffixDecoding, Oliaro et al. 2024;
Arctic Inference's suffix_decoding, vLLM's speculative `method: suffix`).

A tree-of-thoughts search repeats itself: n thoughts of one prompt sample the same distribution and
share long stretches, one evaluation template rates many states and its replies repeat ("... so the
answer is 18. Rating: 7"), thoughts copy the question's names and numbers. A draft read off that text
costs no model forward, and the target verifies it like any other (a picked draft is a one-hot
proposal, verify.py), so it is exact at any temperature.

`TextIndex` keeps documents of tokens, append-only, and a positional index of every token pair: an
append costs one dict append per token and a query reads the most recent occurrences of the
context's last two tokens, extends each match backwards (up to `max_match`) and keeps those of the
longest match. Their continuations form a small trie whose branch counts score the candidates (the
suffix tree's counts, over the occurrences read), and the draft is its most frequent chain, or its
most probable nodes as a small tree, no deeper than the match is long (SuffixDecoding's
max_spec_factor). No step rebuilds anything: updates and queries are flat in rows and in the text
held.

Where no scope holds the context's last two tokens, a row may still draft from its last one: what
followed that token's previous occurrence in the row's own text (`unigram` tokens at most; prompt
lookup's one-token match, policies/prompt_lookup.py). A ToT thought copies the question's names and
numbers one token at a time, and the two-token index alone misses those rounds (a replay of recorded
thoughts in docs/benchmarks.md, 2026-11-30: lookup drafted more per verification at the same
acceptance, and this fallback is what it had that the index did not). By default only greedy rows
use it (`unigram_rows`): a sampled row's one-token guesses are right too rarely to pay for the
query tokens they add (the same journal entry, temperature 1.0).

`SuffixScopes` keeps three scopes (policies/suffix.py reads them):
  row      the row's prompt and output so far;
  search   every row of the same search (a call's SamplingParams.search_key, which ToT sets per
           problem): siblings while they run, and every earlier thought and evaluator reply;
  run      earlier outputs of every call, bounded in tokens, oldest evicted first.
Which rows read what (`share`): what a sampled row drafts changes which sample its seed gives (never
the distribution), so by default a sampled row reads only text that does not depend on what runs
beside it: its own row, and its search's finished calls in a fixed order (a search's calls run one
after another, so those are the same whatever runs beside it). Greedy rows and draft-invariant sampled
rows (keyed_draws.py), whose tokens no draft can change, read everything.
"""
from __future__ import annotations

import heapq
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field

SHARES = ("greedy", "all", "off")
UNIGRAM_ROWS = ("greedy", "all")  # which rows may draft from a one-token match


@dataclass
class DraftNode:
    parent: int  # index in the draft's node list; -1: the root (the context's last token)
    token: int
    prob: float  # the path's share of the read occurrences that continue this way
    fallback: bool = False  # drafted from a one-token match (unigram_draft), right less often than a longer one's


class TextIndex:
    """Documents of tokens, append-only, indexed by token pair. `max_tokens` bounds what is kept: the
    oldest documents go first (their index entries are dropped lazily, all at once when they are as
    many as the kept ones, so eviction too is flat per token)."""

    def __init__(self, max_tokens: int | None = None):
        self.docs: dict[int, list[int]] = {}
        self.tags: dict[int, object] = {}
        self._pairs: dict[tuple[int, int], list[tuple[int, int]]] = {}
        self._next = 0
        self.tokens = 0
        self.max_tokens = max_tokens
        self._stale = 0  # index entries pointing at evicted documents

    def new_doc(self, tokens=(), tag=None) -> int:
        doc = self._next
        self._next += 1
        self.docs[doc], self.tags[doc] = [], tag
        self.extend(doc, tokens)
        return doc

    def extend(self, doc: int, tokens) -> None:
        d, pairs = self.docs[doc], self._pairs
        prev, p = (d[-1] if d else None), len(d)
        before = p
        for t in tokens:
            if prev is not None:
                pairs.setdefault((prev, t), []).append((doc, p))
            d.append(t)
            prev, p = t, p + 1
        self.tokens += p - before
        if self.max_tokens is not None:
            self._evict(keep=doc)

    def _evict(self, keep: int) -> None:
        while self.tokens > self.max_tokens and len(self.docs) > 1:
            oldest = next(iter(self.docs))
            if oldest == keep:
                break
            gone = self.docs.pop(oldest)
            self.tags.pop(oldest)
            self.tokens -= len(gone)
            self._stale += max(0, len(gone) - 1)
        if self._stale > self.tokens:
            for key, hits in list(self._pairs.items()):
                kept = [h for h in hits if h[0] in self.docs]
                if kept:
                    self._pairs[key] = kept
                else:
                    del self._pairs[key]
            self._stale = 0

    def occurrences(self, context: list[int], limit: int, max_match: int, skip_doc: int | None = None,
                    skip_tag=None, allow=None) -> list[tuple[int, list[int], int]]:
        """(match length, document, position) of up to `limit` most recent occurrences of the
        context's last two tokens that something followed, position being that of the pair's second
        token. `skip_doc`, `skip_tag`, `allow(doc)`: documents not to read."""
        if len(context) < 2:
            return []
        hits = self._pairs.get((context[-2], context[-1]))
        if not hits:
            return []
        out, n = [], len(context)
        for doc, p in reversed(hits):
            if doc == skip_doc:
                continue
            d = self.docs.get(doc)
            if d is None or p + 1 >= len(d):  # evicted, or nothing followed it yet
                continue
            if (skip_tag is not None and self.tags[doc] == skip_tag) or (allow is not None and not allow(doc)):
                continue
            m = 2
            while m < max_match and m < n and p - m >= 0 and d[p - m] == context[n - 1 - m]:
                m += 1
            out.append((m, d, p))
            if len(out) >= limit:
                break
        return out


def draft_from(occurrences: list[tuple[int, list[int], int]], nodes: int, width: int = 1,
               min_prob: float = 0.1, factor: float = 1.0) -> list[DraftNode]:
    """The draft the occurrences of the longest match agree on: a trie of what followed each (at most
    `factor` x the match length, at most `nodes` deep), scored by branch counts; its `nodes` most
    probable nodes (each at least `min_prob` of the occurrences, at most `width` children a node),
    parents first. width 1: the most frequent chain."""
    if not occurrences or nodes < 1:
        return []
    best = max(m for m, _, _ in occurrences)
    depth = min(nodes, max(1, int(best * factor)))
    children: list[dict[int, int]] = [{}]
    counts, tokens = [0], [0]
    for m, d, p in occurrences:  # most recent first: among equal counts the most recent continuation leads
        if m < best:
            continue
        node = 0
        counts[0] += 1
        for t in d[p + 1: p + 1 + depth]:
            child = children[node].get(t)
            if child is None:
                child = children[node][t] = len(counts)
                children.append({})
                counts.append(0)
                tokens.append(t)
            counts[child] += 1
            node = child
    out: list[DraftNode] = []
    heap = [(-1.0, 0, 0, -1)]  # (-path prob, order, trie node, parent in out)
    order = 1
    while heap and len(out) < nodes + 1:
        neg, _, node, parent = heapq.heappop(heap)
        at = -1
        if node:
            out.append(DraftNode(parent, tokens[node], -neg))
            at = len(out) - 1
        ranked = sorted(children[node].values(), key=lambda c: -counts[c])[:width]
        for child in ranked:
            prob = -neg * counts[child] / counts[node]
            if prob >= min_prob:
                heapq.heappush(heap, (-prob, order, child, at))
                order += 1
    return out[:nodes]


@dataclass
class _Search:
    """One search's text: `live`, every row's output as it grows (greedy rows read it); `settled`, the
    outputs of its finished calls, added in call order then row order when the next call starts
    (sampled rows read it)."""

    live: TextIndex = field(default_factory=TextIndex)
    settled: TextIndex = field(default_factory=TextIndex)
    rule: object = None  # the call in flight (its StopRule: one per call)
    finished: list[tuple[int, list[int]]] = field(default_factory=list)  # (row index, output) of that call

    def enter(self, rule) -> None:
        if rule is self.rule:
            return
        for _, output in sorted(self.finished, key=lambda f: f[0]):
            self.settled.new_doc(output)
        self.finished.clear()
        self.rule = rule


class PreviousOccurrence:
    """Where each token occurred before its latest occurrence, in one growing list of tokens: the
    last token's previous occurrence in O(1), kept at one dict write per token."""

    def __init__(self):
        self._last: dict[int, int] = {}
        self._before: dict[int, int] = {}
        self.length = 0

    def extend(self, tokens) -> None:
        last, before, p = self._last, self._before, self.length
        for t in tokens:
            q = last.get(t)
            if q is not None:
                before[t] = q
            last[t] = p
            p += 1
        self.length = p

    def of_last(self, tokens: list[int]) -> int | None:
        """The position of the previous occurrence of tokens[-1] (something always follows it)."""
        if not tokens:
            return None
        t = tokens[-1]
        return self._before.get(t) if self._last.get(t) == len(tokens) - 1 else None


def unigram_draft(tokens: list[int], previous: PreviousOccurrence, length: int) -> list[DraftNode]:
    """Up to `length` tokens that followed the previous occurrence of the last token, as a chain."""
    p = previous.of_last(tokens)
    if p is None or length < 1:
        return []
    return [DraftNode(i - 1, t, 1.0, fallback=True) for i, t in enumerate(tokens[p + 1: p + 1 + length])]


@dataclass
class _Row:
    index: TextIndex  # one document: the row's prompt and output
    search: _Search | None
    live_doc: int | None  # its output's document in search.live
    synced: int = 0  # tokens of seq.tokens indexed
    previous: PreviousOccurrence = field(default_factory=PreviousOccurrence)  # the one-token fallback's


class SuffixScopes:
    """The row, search and run scopes of one policy, and each row's place in them."""

    def __init__(self, run_tokens: int = 1 << 16, searches: int = 64, share: str = "greedy",
                 candidates: int = 32, max_match: int = 32, unigram: int = 3, unigram_rows: str = "greedy"):
        if share not in SHARES:
            raise ValueError(f"share={share!r} must be one of {', '.join(SHARES)}")
        if unigram_rows not in UNIGRAM_ROWS:
            raise ValueError(f"unigram_rows={unigram_rows!r} must be one of {', '.join(UNIGRAM_ROWS)}")
        self.unigram = unigram  # tokens drafted from a one-token match in the row's text; 0: none
        self.unigram_rows = unigram_rows
        self.run = TextIndex(run_tokens) if run_tokens > 0 else None
        self.searches: OrderedDict[str, _Search] = OrderedDict()
        self.max_searches, self.share = searches, share
        self.candidates, self.max_match = candidates, max_match
        self._rows: dict[int, _Row] = {}

    def _search(self, key: str) -> _Search:
        search = self.searches.get(key)
        if search is None:
            search = self.searches[key] = _Search()
            while len(self.searches) > self.max_searches:  # the least recently started search goes
                self.searches.popitem(last=False)
        else:
            self.searches.move_to_end(key)
        return search

    def _row(self, seq) -> _Row:
        row = self._rows.get(id(seq))
        if row is None:
            key = getattr(seq.rule.params, "search_key", "")
            search = self._search(key) if key and self.share != "off" else None
            if search is not None:
                search.enter(seq.rule)
            index = TextIndex()
            index.new_doc()
            row = self._rows[id(seq)] = _Row(index, search, search.live.new_doc() if search is not None else None)
            try:  # a row of a failed or cancelled call never reaches `done`: its state goes with it
                weakref.finalize(seq, self._rows.pop, id(seq), None)
            except TypeError:
                pass
        return row

    def _uses_unigram(self, seq) -> bool:
        return bool(self.unigram) and (self.unigram_rows == "all" or seq.rule.params.greedy)

    def sync(self, seq) -> _Row:
        """Index the row's tokens it has not indexed yet (its prompt on its first round)."""
        row = self._row(seq)
        prompt, generated = seq.prompt, seq.generated
        total = len(prompt) + len(generated)
        if row.synced < total:
            start = row.synced
            new = (prompt[start:] + generated) if start < len(prompt) else generated[start - len(prompt):]
            row.index.extend(0, new)
            if self._uses_unigram(seq):
                row.previous.extend(new)
            if row.search is not None:
                row.search.live.extend(row.live_doc, new[max(0, len(prompt) - start):])
            row.synced = total
        return row

    def draft(self, seq, nodes: int, width: int = 1, min_prob: float = 0.1, factor: float = 1.0) -> list[DraftNode]:
        """The row's draft from every scope it may read (see the module docstring)."""
        row = self.sync(seq)
        if nodes < 1:
            return []
        context = row.index.docs[0]
        every = self.share == "all" or (self.share == "greedy" and seq.rule.params.deterministic)
        limit, match = self.candidates, self.max_match
        found = row.index.occurrences(context, limit, match)
        key = getattr(seq.rule.params, "search_key", "") or None
        if row.search is not None:
            if every:
                found += row.search.live.occurrences(context, limit, match, skip_doc=row.live_doc)
            else:
                found += row.search.settled.occurrences(context, limit, match)
        if every and self.run is not None:
            # this search's outputs are read above; the run holds them too once finished
            found += self.run.occurrences(context, limit, match, skip_tag=key)
        if not found and self._uses_unigram(seq):
            return unigram_draft(context, row.previous, min(nodes, self.unigram))
        return draft_from(found, nodes, width, min_prob, factor)

    def finish(self, seq) -> None:
        """A row is done: its output joins its search's finished call and the run."""
        row = self._rows.pop(id(seq), None)
        if row is None or self.share == "off":
            return
        output = list(seq.generated)
        if row.search is not None:
            row.search.finished.append((seq.index, output))
        if self.run is not None and len(output) >= 2:
            self.run.new_doc(output, tag=getattr(seq.rule.params, "search_key", "") or None)
