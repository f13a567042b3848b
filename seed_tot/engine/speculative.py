"""The rounds every mode is made of, written straight through (after gpt-fast's generate.py).

    draft_rows    the draft model grows, for every row at once, the tree its DraftPolicy plans
                  (engine/policies; the `fixed` policy: k_config[d] children per node at depth d+1):
                  one draft forward per step, every row still drafting in it
    score_rows    the target scores every row's pending tokens + tree in one forward
    accept_rows   every row (greedy, sampled chain or sampled tree that branches) decided on the
                  device at once, one transfer back (verify.decide_on_device); both caches keep only
                  the accepted path
AR is a round with an empty tree; SD a chain k_config; MCSD a wider tree; SEED's scheduler (seed.py)
runs these rounds for every active row of every call, a batch of one being a batch.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch
from torch.nn.utils.rnn import pad_sequence

from .draft_tree import DraftTree, read_tokens
from .kv_cache import forward_rows
from .model_runtime import ModelRuntime
from .params import SamplingParams
from .policies.base import DraftPolicy
from .policies.fixed import FixedPolicy
from .sampling import process_logits, processing_key
from .sequence import Sequence
from .target_features import TargetHidden
from .host_to_device import to_device
from .keyed_draws import slot_uniforms
from .verify import Acceptance, decide_on_device, is_chain, draw_keyed, row_uniforms

log = logging.getLogger(__name__)


def _chain_parents(n: int) -> list[int]:
    return [i - 1 for i in range(n)]  # entry i follows entry i-1; entry 0 follows the prefix


@torch.inference_mode()
def prefill(runtime: ModelRuntime, kv, prompt: list[int], features: torch.Tensor | None = None) -> None:
    """Put all but the last prompt token in the cache; the last one is scored with the first round."""
    extend(runtime, kv, prompt[:-1], features)


@torch.inference_mode()
def extend(runtime: ModelRuntime, kv, tokens: list[int], features: torch.Tensor | None = None) -> None:
    """Score `tokens` after kv's committed history as a chain and commit them (prefill, shared stretches).
    features: their target hidden states, for a drafter that reads them (target_features.py)."""
    if tokens:
        kv.forward(runtime, tokens, _chain_parents(len(tokens)), logits_to_keep=1, features=features)
    kv.commit(list(range(len(kv.parents))))


@torch.inference_mode()
def draft_rows(runtime: ModelRuntime | None, rows: list[tuple[Sequence, DraftPolicy]], vocab_size: int,
               params: SamplingParams | None = None, defer_tokens: bool = False, load: int | None = None
               ) -> list[tuple[DraftTree, dict[int, int]]]:
    """One draft round for every (sequence, its call's policy): one draft forward per step of the
    longest round, every row still drafting in it. Each round is its policy's state machine fed its
    own row's logits and drawing from its own sequence's generator, so a row's draft does not depend
    on which rows share its forwards. Each row drafts with its sequence's params (or `params`).
    runtime: the draft model's (None: policies that never feed it, prompt lookup).
    Returns, per row, the tree and, per tree node fed to the draft model, its draft-cache entry.
    Picks a policy left on the device (DraftTree.device_tokens) are read with one transfer for every
    row at the end, or, with defer_tokens, by the verification's one transfer (accept_rows).
    load: the rows the target forward that verifies these drafts is expected to hold, which the
    policies price a drafted token against (default, and at least: this round's rows)."""
    by_policy: dict[int, tuple[DraftPolicy, list[Sequence]]] = {}
    for seq, policy in rows:
        by_policy.setdefault(id(policy), (policy, []))[1].append(seq)
    for policy, seqs in by_policy.values():
        policy.plan_batch(seqs, max(load or 0, len(rows)))
    seqs = [seq for seq, _ in rows]
    start = time.perf_counter()
    rounds = [policy.begin(seq, params or seq.rule.params, vocab_size) for seq, policy in rows]
    feeds = [r.first_feed() for r in rounds]
    # on the CPU a step's seconds are its cost (on a GPU they would time the launch alone): (entries, s)
    timed = runtime is not None and runtime.placement[0].type == "cpu"
    steps: list[tuple[int, float]] = []
    fed_s = [0.0] * len(rows)  # each row's share of the draft steps it was fed in
    while True:
        active = [i for i, feed in enumerate(feeds) if feed is not None]
        if not active:
            break
        step_start, entries = time.perf_counter(), sum(len(feeds[i].tokens) for i in active)
        # a row alone reads only the logits it needs; a batch returns every entry's
        keep = feeds[active[0]].keep if len(active) == 1 else 0
        logits = forward_rows(runtime, [seqs[i].draft for i in active], [feeds[i].tokens for i in active],
                              [feeds[i].parents for i in active], "batched drafting (draft_batch > 1)",
                              [feeds[i].features for i in active], logits_to_keep=keep)
        # policies that read the draft's hidden states (specdec, auto with a head): the capture holds
        # the forward's [rows, entries, hidden], row j's first entries its own (after `keep` cut them)
        hidden = {id(c): c.take_rows() for c in {id(rows[i][1].capture): rows[i][1].capture for i in active
                                                 if rows[i][1].capture is not None}.values()}
        by_class: dict[type, list[tuple[int, torch.Tensor, torch.Tensor | None]]] = {}
        for j, (i, row_logits) in enumerate(zip(active, logits)):
            seqs[i].stats.draft_forwards += 1 / len(active)  # one forward shared by the active rows
            capture = rows[i][1].capture
            row_hidden = hidden[id(capture)][j, :keep or len(feeds[i].tokens)] if rounds[i].needs_hidden else None
            by_class.setdefault(type(rounds[i]), []).append((i, row_logits, row_hidden))
        for cls, group in by_class.items():  # a policy's rounds step together (DraftRound.step_rows)
            stepped = cls.step_rows([rounds[i] for i, _, _ in group], [x for _, x, _ in group], [h for _, _, h in group])
            for (i, _, _), feed in zip(group, stepped):
                feeds[i] = feed
        step_s = time.perf_counter() - step_start
        for i in active:
            fed_s[i] += step_s / len(active)
        if timed:
            steps.append((entries, step_s))
    busy = time.perf_counter() - start
    shared_s = (busy - sum(fed_s)) / len(seqs)  # planning and the rounds' host work: every row's
    for owner in {id(policy.owner): policy.owner for policy, _ in by_policy.values()}.values():
        for entries, seconds in steps:
            owner.observe_draft_forward(entries, seconds)
    out = []
    for seq, rnd, own_s in zip(seqs, rounds, fed_s):
        tree, node_entry = rnd.finish()
        seq.stats.drafted += len(tree)
        seq.stats.draft_depth += tree.depth()
        # a row that fed no draft step (a suffix chain, a plain step) pays none of them (call_pricing.CallCost)
        seq.stats.draft_busy_s += shared_s + own_s
        out.append((tree, node_entry))
    if not defer_tokens:
        read_tokens([tree for tree, _ in out])
    return out


def draft_round(runtime: ModelRuntime | None, seq: Sequence, policy: DraftPolicy | tuple[int, ...],
                params: SamplingParams, vocab_size: int) -> tuple[DraftTree, dict[int, int]]:
    """`draft_rows` for one sequence; `policy` may be a k_config (the `fixed` policy of that shape)."""
    if not isinstance(policy, DraftPolicy):
        policy = FixedPolicy(policy)
    return draft_rows(runtime, [(seq, policy)], vocab_size, params)[0]


@torch.inference_mode()
def verify_round(runtime: ModelRuntime, seq: Sequence, tree: DraftTree, params: SamplingParams, vocab_size: int,
                 node_entry: dict[int, int] | None = None) -> Acceptance:
    """Score pending tokens + tree in one target forward, accept, and commit both caches."""
    job = (seq, tree, node_entry)
    outcome = accept_rows([job], score_rows(runtime, [job]), vocab_size, params)[0]
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


@dataclass
class ScoredRow:
    """One sequence's share of a target forward: its logits, where its tree starts, its busy share."""

    logits: torch.Tensor
    n_pending: int
    busy_s: float
    rows: int
    hidden: torch.Tensor | None = None  # the target's hidden states of its entries, when a drafter reads them


@torch.inference_mode()
def score_rows(runtime: ModelRuntime, jobs: list[tuple[Sequence, DraftTree, dict[int, int]]]) -> list[ScoredRow]:
    """The target forward of a verification: every job's row in one forward.
    Nothing is committed yet, so a failure here leaves every sequence as it was."""
    start = time.perf_counter()
    inputs = [_target_inputs(seq, tree) for seq, tree, _ in jobs]
    all_logits = forward_rows(runtime, [seq.target for seq, _, _ in jobs], [t for t, _, _ in inputs],
                              [p for _, p, _ in inputs], "batched verification (verify_batch > 1)")
    busy = time.perf_counter() - start
    # a drafter that reads the target's hidden states gets them from this forward (target_features.py)
    hidden = runtime.capture(TargetHidden).take_rows() if any(seq.features is not None for seq, _, _ in jobs) else None
    return [ScoredRow(logits, n_p, busy, len(jobs), None if hidden is None else hidden[b, : len(tokens)])
            for b, (logits, (tokens, _, n_p)) in enumerate(zip(all_logits, inputs))]


@torch.inference_mode()
def accept_rows(jobs: list[tuple[Sequence, DraftTree, dict[int, int]]], scored: list[ScoredRow], vocab_size: int,
                params: SamplingParams | None = None) -> list[Acceptance | Exception]:
    """Accept and commit every job of one verification (each with its sequence's params, or `params`);
    per job its Acceptance or the exception that ended it, a failure confined to its own row.
    The device decides every row together, and one transfer brings the decisions back
    (verify.decide_on_device)."""
    decisions = _decide(jobs, scored, vocab_size, params)
    outcomes: list[Acceptance | Exception] = []
    for job, row, decision in zip(jobs, scored, decisions):
        if isinstance(decision, Exception):
            outcomes.append(decision)
            continue
        try:
            outcomes.append(accept_row(job, row, decision))
        except Exception as err:
            outcomes.append(err)
    return outcomes


def _decide(jobs, scored: list[ScoredRow], vocab_size: int, params: SamplingParams | None) -> list:
    """Per job: the device's Acceptance, or the exception deciding it raised."""
    rules = [params or seq.rule.params for seq, _, _ in jobs]
    greedy = [b for b, rule in enumerate(rules) if rule.greedy]
    # chains first, then branching trees (each kind one consecutive block of decide_on_device's
    # rows), each grouped by params, so that each group's p is one process_logits call; the
    # draft-invariant rows (keyed) a block of their own, grouped by params too
    keyed = sorted((b for b in range(len(jobs)) if not rules[b].greedy and rules[b].draft_invariant),
                   key=lambda b: processing_key(rules[b]))
    sampled = sorted((b for b in range(len(jobs)) if not rules[b].greedy and not rules[b].draft_invariant),
                     key=lambda b: (not is_chain(jobs[b][1]), processing_key(rules[b])))
    # drawn once, before anything can fail: a row decided again alone below reuses its own draws
    uniforms = {b: row_uniforms(jobs[b][1], jobs[b][0].generator) for b in sampled}
    uniforms.update({b: slot_uniforms(jobs[b][0], jobs[b][1].parents) for b in keyed})
    out: list = [None] * len(jobs)
    try:
        _decide_together(jobs, scored, rules, vocab_size, greedy, keyed, sampled, uniforms, out)
    except Exception as err:
        if len(jobs) == 1:
            out[0] = err
            return out
        log.warning("deciding %d rows together failed (%r); deciding them one by one", len(jobs), err)
        for b in greedy + keyed + sampled:
            try:
                _decide_together(jobs, scored, rules, vocab_size, [b] if b in greedy else [],
                                 [b] if b in keyed else [], [b] if b in sampled else [], uniforms, out)
            except Exception as row_err:
                out[b] = row_err
    return out


def _processed(jobs, scored: list[ScoredRow], rules: list[SamplingParams], rows: list[int],
               vocab_size: int) -> torch.Tensor:
    """p after each of `rows`' roots and after each of their nodes, padded to the largest tree
    [rows, width, V]: one process_logits call per run of equal params."""
    logits = pad_sequence([scored[b].logits[scored[b].n_pending - 1: scored[b].n_pending + len(jobs[b][1])]
                           for b in rows], batch_first=True)
    groups, first = [], 0
    for end in range(1, len(rows) + 1):
        if end == len(rows) or processing_key(rules[rows[end]]) != processing_key(rules[rows[first]]):
            groups.append(process_logits(logits[first:end], rules[rows[first]], vocab_size))
            first = end
    return torch.cat(groups) if len(groups) > 1 else groups[0]


def _decide_together(jobs, scored: list[ScoredRow], rules: list[SamplingParams], vocab_size: int, greedy: list[int],
                     keyed: list[int], sampled: list[int], uniforms: dict[int, list[float]], out: list) -> None:
    greedy_rows = [(jobs[b][1], scored[b].logits[scored[b].n_pending - 1:, :vocab_size]) for b in greedy]
    probs = _processed(jobs, scored, rules, sampled, vocab_size) if sampled else None
    keyed_tokens = None
    if keyed:  # every keyed slot's draw in one inverse CDF: [slots, V] at [slots] uniforms
        p = _processed(jobs, scored, rules, keyed, vocab_size)
        keyed_tokens = draw_keyed(torch.cat([p[i, : len(jobs[b][1]) + 1] for i, b in enumerate(keyed)]),
                                   [u for b in keyed for u in uniforms[b]])
    decided = decide_on_device(greedy_rows, [jobs[b][1] for b in sampled], probs, [uniforms[b] for b in sampled],
                               [jobs[b][1] for b in keyed], keyed_tokens)
    for b, acc in zip(greedy + keyed + sampled, decided):
        out[b] = acc


@torch.inference_mode()
def accept_row(job: tuple[Sequence, DraftTree, dict[int, int]], row: ScoredRow, acc: Acceptance) -> Acceptance:
    """Commit one job as `acc` (accept_rows' decision) says. The row's share of the target forward's
    busy seconds is 1/row.rows (the forward verified row.rows sequences)."""
    seq, tree, node_entry = job
    n_p, hidden = row.n_pending, row.hidden
    kept = list(range(n_p)) + [n_p + i for i in acc.path]
    if seq.features is not None and hidden is not None:  # f of every committed entry, by position
        # a chain keeps a prefix: a slice, where indexing by a list would copy the list to the device
        seq.features.put(seq.target.committed, hidden[: len(kept)] if _is_prefix(kept) else hidden[kept])
    seq.target.commit(kept)
    seq.stats.verifications += 1
    seq.stats.target_forwards += 1 / row.rows
    seq.stats.target_query_tokens += n_p + len(tree)
    seq.stats.target_busy_s += row.busy_s / row.rows
    commit_draft(seq, acc, node_entry)
    kept = seq.append(acc.tokens)
    # drafts accepted past a stop (EOS, a stop string, the budget) are dropped with it: not counted
    seq.stats.accepted += min(len(acc.path), kept)
    return acc


def _target_inputs(seq: Sequence, tree: DraftTree) -> tuple["list[int] | torch.Tensor", list[int], int]:
    """The target's new entries: the pending tokens as a chain, then the tree hung off the last.
    A tree whose tokens are still on the device is joined to the pending tokens there."""
    pending = seq.pending(seq.target)
    n_p = len(pending)
    parents = _chain_parents(n_p) + [n_p - 1 if p < 0 else n_p + p for p in tree.parents]
    if tree.device_tokens is not None:
        picks = tree.device_tokens
        return torch.cat([to_device(pending, picks.device), picks]), parents, n_p
    return pending + tree.tokens, parents, n_p


def _is_prefix(entries: list[int]) -> bool:
    return entries == list(range(len(entries)))


def commit_draft(seq: Sequence, acc: Acceptance, node_entry: dict[int, int] | None) -> None:
    """The draft cache keeps its pending tokens and the accepted nodes it had already fed."""
    if seq.draft is not None and node_entry is not None:
        # the pending tokens it was fed this round (none when a policy drafted nothing); a policy may
        # also have fed nodes it left out of the tree (OPT-Tree), so count from the tokens, not the nodes
        n_draft_pending = min(seq.length - seq.draft.committed, len(seq.draft.parents))
        fed_path = [node_entry[i] for i in acc.path if i in node_entry]
        seq.draft.commit(list(range(n_draft_pending)) + fed_path)
