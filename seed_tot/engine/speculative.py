"""The rounds every mode is made of, written straight through (after gpt-fast's generate.py).

    draft_rows    the draft model grows, for every row at once, the tree its DraftPolicy plans
                  (engine/policies; the `fixed` policy: k_config[d] children per node at depth d+1):
                  one draft forward per step, every row still drafting in it
    score_rows    the target scores every row's pending tokens + tree in one forward
    accept_rows   every greedy row and every sampled chain decided on the device at once, one
                  transfer back (verify.py); a branching sampled tree walked on the host
                  (accept_tokens); both caches keep only the accepted path
AR is a round with an empty tree; SD a chain k_config; MCSD a wider tree; SEED's scheduler (seed.py)
runs these rounds for every active row of every call, a batch of one being a batch.
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


def forward_rows(model, caches, tokens: list[list[int]], parents: list[list[int]], what: str,
                 features: list[torch.Tensor | None] | None = None, logits_to_keep: int = 0) -> list[torch.Tensor]:
    """One forward of every row: a row alone goes through its cache (`KVCache.forward`, which takes the
    batched path where the model allows it and the stock path where no batched mask is exact: ALiBi),
    several rows through `forward_batch`. logits_to_keep: a row alone only."""
    if len(caches) == 1:
        row_features = None if features is None else features[0]
        return [caches[0].forward(model, tokens[0], parents[0], logits_to_keep=logits_to_keep, features=row_features)]
    return forward_batch(model, caches, tokens, parents, what=what,
                         features=features if features is not None and any(f is not None for f in features) else None)


@torch.inference_mode()
def draft_rows(model, rows: list[tuple[Sequence, DraftPolicy]], vocab_size: int,
               params: SamplingParams | None = None) -> list[tuple[DraftTree, dict[int, int]]]:
    """One draft round for every (sequence, its call's policy): one draft forward per step of the
    longest round, every row still drafting in it. Each round is its policy's state machine fed its
    own row's logits and drawing from its own sequence's generator, so a row's draft does not depend
    on which rows share its forwards. Each row drafts with its sequence's params (or `params`).
    Returns, per row, the tree and, per tree node fed to the draft model, its draft-cache entry."""
    by_policy: dict[int, tuple[DraftPolicy, list[Sequence]]] = {}
    for seq, policy in rows:
        by_policy.setdefault(id(policy), (policy, []))[1].append(seq)
    for policy, seqs in by_policy.values():
        policy.plan_batch(seqs, len(rows))
    seqs = [seq for seq, _ in rows]
    start = time.perf_counter()
    rounds = [policy.begin(seq, params or seq.rule.params, vocab_size) for seq, policy in rows]
    feeds = [r.first_feed() for r in rounds]
    while True:
        active = [i for i, feed in enumerate(feeds) if feed is not None]
        if not active:
            break
        # a row alone reads only the logits it needs; a batch returns every entry's
        keep = feeds[active[0]].keep if len(active) == 1 else 0
        logits = forward_rows(model, [seqs[i].draft for i in active], [feeds[i].tokens for i in active],
                              [feeds[i].parents for i in active], "batched drafting (draft_batch > 1)",
                              [feeds[i].features for i in active], logits_to_keep=keep)
        # policies that read the draft's hidden states (specdec, auto with a head): the capture holds
        # the forward's [rows, entries, hidden], row j's first entries its own (after `keep` cut them)
        hidden = {id(c): c.take_rows() for c in {id(rows[i][1].capture): rows[i][1].capture for i in active
                                                 if rows[i][1].capture is not None}.values()}
        for j, (i, row_logits) in enumerate(zip(active, logits)):
            seqs[i].stats.draft_forwards += 1 / len(active)  # one forward shared by the active rows
            capture = rows[i][1].capture
            row_hidden = hidden[id(capture)][j, :keep or len(feeds[i].tokens)] if rounds[i].needs_hidden else None
            feeds[i] = rounds[i].step(row_logits, row_hidden)
    busy = time.perf_counter() - start
    out = []
    for seq, rnd in zip(seqs, rounds):
        tree, node_entry = rnd.finish()
        seq.stats.drafted += len(tree)
        seq.stats.draft_depth += tree.depth()
        seq.stats.draft_busy_s += busy / len(seqs)
        out.append((tree, node_entry))
    return out


def draft_round(model, seq: Sequence, policy: DraftPolicy | tuple[int, ...], params: SamplingParams,
                vocab_size: int) -> tuple[DraftTree, dict[int, int]]:
    """`draft_rows` for one sequence; `policy` may be a k_config (the `fixed` policy of that shape)."""
    if not isinstance(policy, DraftPolicy):
        policy = FixedPolicy(policy)
    return draft_rows(model, [(seq, policy)], vocab_size, params)[0]


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
    all_logits = forward_rows(model, [seq.target for seq, _, _ in jobs], [t for t, _, _ in inputs],
                              [p for _, p, _ in inputs], "batched verification (verify_batch > 1)")
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
