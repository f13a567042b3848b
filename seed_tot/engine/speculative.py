"""One speculative round of one sequence, written straight through (after gpt-fast's generate.py).

    draft_round   the draft model grows the tree a DraftPolicy plans (engine/policies; the `fixed`
                  policy: k_config[d] children per node at depth d+1)
    verify_round  the target scores every tree node in one forward, accept_tokens walks the tree,
                  both caches keep only the accepted path
AR is the same round with an empty tree; SD is a chain k_config; MCSD a wider tree; SEED schedules
these two halves of many sequences on different threads.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from .draft_tree import DraftTree
from .kv_cache import forward_batch
from .params import SamplingParams
from .policies.base import DraftPolicy
from .policies.fixed import FixedPolicy
from .sampling import process_logits
from .sequence import Sequence
from .target_features import TargetHidden
from .verify import Acceptance, accept_greedy, accept_tokens


def _chain_parents(n: int) -> list[int]:
    return [i - 1 for i in range(n)]  # entry i follows entry i-1; entry 0 follows the prefix


@torch.inference_mode()
def prefill(model, kv, prompt: list[int], features: torch.Tensor | None = None) -> None:
    """Put all but the last prompt token in the cache; the last one is scored with the first round."""
    extend(model, kv, prompt[:-1], features)


@torch.inference_mode()
def extend(model, kv, tokens: list[int], features: torch.Tensor | None = None) -> None:
    """Score `tokens` after kv's committed history as a chain and commit them (prefill, shared stretches).
    features: their target hidden states, for a drafter that reads them (target_features.py)."""
    if tokens:
        kv.forward(model, tokens, _chain_parents(len(tokens)), logits_to_keep=1, features=features)
    kv.commit(list(range(len(kv.parents))))


@torch.inference_mode()
def draft_round(model, seq: Sequence, policy: DraftPolicy | tuple[int, ...], params: SamplingParams,
                vocab_size: int) -> tuple[DraftTree, dict[int, int]]:
    """Run one draft round of `policy` (a DraftPolicy, or a k_config: the `fixed` policy) for one
    sequence, one draft forward per step the policy asks for. Returns the tree and, per tree node
    fed to the draft model, its draft-cache entry."""
    if not isinstance(policy, DraftPolicy):
        policy = FixedPolicy(policy)
    kv = seq.draft
    start = time.perf_counter()
    rnd = policy.begin(seq, params, vocab_size)
    feed = rnd.first_feed()
    while feed is not None:
        logits = kv.forward(model, feed.tokens, feed.parents, logits_to_keep=feed.keep, features=feed.features)
        seq.stats.draft_forwards += 1
        # the capture holds what reached the head: feed.keep entries (all when 0), then any row padding
        hidden = policy.capture.take()[: feed.keep or len(feed.tokens)] if rnd.needs_hidden else None
        feed = rnd.step(logits, hidden)
    tree, node_entry = rnd.finish()
    seq.stats.drafted += len(tree)
    seq.stats.draft_depth += tree.depth()
    seq.stats.draft_busy_s += time.perf_counter() - start
    return tree, node_entry


@torch.inference_mode()
def verify_round(model, seq: Sequence, tree: DraftTree, params: SamplingParams, vocab_size: int,
                 node_entry: dict[int, int] | None = None) -> Acceptance:
    """Score pending tokens + tree in one target forward, accept, and commit both caches."""
    row = score_rows(model, [(seq, tree, node_entry)], vocab_size if params.greedy else None)[0]
    return accept_row((seq, tree, node_entry), row, params, vocab_size)


@dataclass
class ScoredRow:
    """One sequence's share of a target forward: its logits, where its tree starts, its busy share."""

    logits: torch.Tensor
    n_pending: int
    busy_s: float
    rows: int
    hidden: torch.Tensor | None = None  # the target's hidden states of its entries, when a drafter reads them
    best: list[int] | None = None  # a greedy row: the target's argmax after its root and after each tree node


@torch.inference_mode()
def score_rows(model, jobs: list[tuple[Sequence, DraftTree, dict[int, int]]],
               vocab_size: int | None = None) -> list[ScoredRow]:
    """The target forward of a verification: every job's row in one forward.
    Nothing is committed yet, so a failure here leaves every sequence as it was. With `vocab_size`,
    the greedy rows' argmaxes are taken for all of them at once: one op, one transfer to the host."""
    start = time.perf_counter()
    inputs = [_target_inputs(seq, tree) for seq, tree, _ in jobs]
    if len(jobs) == 1:  # KVCache.forward: also the stock path of models no batched mask can serve (ALiBi)
        all_logits = [jobs[0][0].target.forward(model, inputs[0][0], inputs[0][1])]
    else:
        all_logits = forward_batch(model, [seq.target for seq, _, _ in jobs], [t for t, _, _ in inputs],
                                   [p for _, p, _ in inputs])
    best = _greedy_argmax(jobs, all_logits, [n_p for _, _, n_p in inputs], vocab_size)
    busy = time.perf_counter() - start
    # a drafter that reads the target's hidden states gets them from this forward (target_features.py)
    hidden = TargetHidden.of(model).take_rows() if any(seq.features is not None for seq, _, _ in jobs) else None
    return [ScoredRow(logits, n_p, busy, len(jobs), None if hidden is None else hidden[b, : len(tokens)], best[b])
            for b, (logits, (tokens, _, n_p)) in enumerate(zip(all_logits, inputs))]


def _greedy_argmax(jobs, all_logits: list[torch.Tensor], n_pending: list[int], vocab_size: int | None) -> list:
    """Per job: the argmax of each entry from its root on (a greedy row), or None."""
    greedy = [b for b, (seq, _, _) in enumerate(jobs) if vocab_size and seq.rule.params.greedy]
    best: list = [None] * len(jobs)
    if not greedy:
        return best
    picks = torch.cat([all_logits[b][n_pending[b] - 1:, :vocab_size] for b in greedy]).argmax(-1).tolist()
    at = 0
    for b in greedy:
        n = all_logits[b].shape[0] - n_pending[b] + 1
        best[b], at = picks[at: at + n], at + n
    return best


@torch.inference_mode()
def accept_row(job: tuple[Sequence, DraftTree, dict[int, int]], row: ScoredRow, params: SamplingParams | None,
               vocab_size: int) -> Acceptance:
    seq, tree, node_entry = job
    return _accept_and_commit(seq, tree, node_entry, row.logits, row.n_pending, row.busy_s, row.rows,
                              params or seq.rule.params, vocab_size, row.hidden, row.best)


def _target_inputs(seq: Sequence, tree: DraftTree) -> tuple[list[int], list[int], int]:
    """The target's new entries: the pending tokens as a chain, then the tree hung off the last."""
    pending = seq.pending(seq.target)
    n_p = len(pending)
    parents = _chain_parents(n_p) + [n_p - 1 if p < 0 else n_p + p for p in tree.parents]
    return pending + tree.tokens, parents, n_p


def _accept_and_commit(seq: Sequence, tree: DraftTree, node_entry: dict[int, int] | None, logits: torch.Tensor,
                       n_p: int, busy: float, rows: int, params: SamplingParams, vocab_size: int,
                       hidden: torch.Tensor | None = None, best: list[int] | None = None) -> Acceptance:
    """`busy` seconds of one target forward that verified `rows` sequences: this row's share is 1/rows."""
    if params.greedy and best is not None:  # argmaxes already on the host (score_rows)
        acc = accept_greedy(tree, best)
    else:
        target_probs = process_logits(logits[n_p - 1:], params, vocab_size)  # row 0: after the root
        acc = accept_tokens(tree, target_probs, params.greedy, seq.generator)
    kept = list(range(n_p)) + [n_p + i for i in acc.path]
    if seq.features is not None and hidden is not None:  # f of every committed entry, by position
        seq.features.put(seq.target.committed, hidden[kept])
    seq.target.commit(kept)
    seq.stats.verifications += 1
    seq.stats.target_forwards += 1 / rows
    seq.stats.target_query_tokens += n_p + len(tree)
    seq.stats.target_busy_s += busy / rows
    seq.stats.accepted += len(acc.path)
    commit_draft(seq, acc, node_entry)
    seq.append(acc.tokens)
    return acc


def commit_draft(seq: Sequence, acc: Acceptance, node_entry: dict[int, int] | None) -> None:
    """The draft cache keeps its pending tokens and the accepted nodes it had already fed."""
    if seq.draft is not None and node_entry is not None:
        # the pending tokens it was fed this round (none when a policy drafted nothing); a policy may
        # also have fed nodes it left out of the tree (OPT-Tree), so count from the tokens, not the nodes
        n_draft_pending = min(len(seq.tokens) - seq.draft.committed, len(seq.draft.parents))
        fed_path = [node_entry[i] for i in acc.path if i in node_entry]
        seq.draft.commit(list(range(n_draft_pending)) + fed_path)
