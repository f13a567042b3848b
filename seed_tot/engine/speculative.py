"""One speculative round of one sequence, written straight through (after gpt-fast's generate.py).

    draft_round   the draft model grows a tree (k_config[d] children per node at depth d+1)
    verify_round  the target scores every tree node in one forward, accept_tokens walks the tree,
                  both caches keep only the accepted path
AR is the same round with an empty tree; SD is a chain k_config; MCSD a wider tree; SEED schedules
these two halves of many sequences on different threads.
"""
from __future__ import annotations

import time

import torch

from .draft_tree import DraftTree
from .kv_cache import forward_batch
from .params import SamplingParams
from .sampling import process_logits
from .sequence import Sequence
from .verify import Acceptance, accept_tokens


def _chain_parents(n: int) -> list[int]:
    return [i - 1 for i in range(n)]  # entry i follows entry i-1; entry 0 follows the prefix


@torch.inference_mode()
def prefill(model, kv, prompt: list[int]) -> None:
    """Put all but the last prompt token in the cache; the last one is scored with the first round."""
    if len(prompt) > 1:
        kv.forward(model, prompt[:-1], _chain_parents(len(prompt) - 1))
    kv.commit(list(range(len(kv.parents))))


@torch.inference_mode()
def draft_round(model, seq: Sequence, k_config: tuple[int, ...], params: SamplingParams,
                vocab_size: int) -> tuple[DraftTree, dict[int, int]]:
    """Grow the draft tree level by level (one draft forward per level but the last).
    Returns the tree and, per tree node fed to the draft model, its draft-cache entry."""
    kv = seq.draft
    start = time.perf_counter()
    remaining = params.max_new_tokens - len(seq.generated)
    k_config = k_config[: max(1, remaining)]  # no point drafting past the budget
    pending = seq.pending(kv)
    logits = kv.forward(model, pending, _chain_parents(len(pending)))
    seq.stats.draft_forwards += 1
    frontier = [(-1, logits[-1])]  # (node, draft logits for its children)
    parents, tokens, probs = [], [], []
    node_entry: dict[int, int] = {}
    for depth, width in enumerate(k_config):
        level = []
        for node, node_logits in frontier:
            q = process_logits(node_logits, params, vocab_size)
            if params.greedy:  # deterministic candidates: the draft's top-`width` tokens
                picks = torch.topk(node_logits[:vocab_size].float(), width).indices.tolist()
            else:  # `width` draws without replacement from q (what the verifier assumes)
                n = min(width, int((q > 0).sum()))
                picks = torch.multinomial(q, n, replacement=False, generator=seq.generator).tolist()
            for tok in picks:
                parents.append(node)
                tokens.append(tok)
                probs.append(q)
                level.append(len(tokens) - 1)
        if depth == len(k_config) - 1:
            break
        entry_of_parent = [node_entry.get(parents[n], len(pending) - 1) for n in level]
        first = len(kv.parents)
        logits = kv.forward(model, [tokens[n] for n in level], entry_of_parent)
        seq.stats.draft_forwards += 1
        for j, n in enumerate(level):
            node_entry[n] = first + j
        frontier = [(n, logits[j]) for j, n in enumerate(level)]
    tree = DraftTree(parents, tokens, torch.stack(probs))
    seq.stats.drafted += len(tree)
    seq.stats.draft_depth += tree.depth()
    seq.stats.draft_busy_s += time.perf_counter() - start
    return tree, node_entry


@torch.inference_mode()
def verify_round(model, seq: Sequence, tree: DraftTree, params: SamplingParams, vocab_size: int,
                 node_entry: dict[int, int] | None = None) -> Acceptance:
    """Score pending tokens + tree in one target forward, accept, and commit both caches."""
    start = time.perf_counter()
    tokens, parents, n_p = _target_inputs(seq, tree)
    logits = seq.target.forward(model, tokens, parents)
    return _accept_and_commit(seq, tree, node_entry, logits, n_p, time.perf_counter() - start, 1, params, vocab_size)


@torch.inference_mode()
def verify_batch_round(model, jobs: list[tuple[Sequence, DraftTree, dict[int, int]]], params: SamplingParams,
                       vocab_size: int) -> list[Acceptance]:
    """verify_round for several sequences in one padded target forward; lossless per sequence."""
    if len(jobs) == 1:
        return [verify_round(model, jobs[0][0], jobs[0][1], params, vocab_size, jobs[0][2])]
    start = time.perf_counter()
    inputs = [_target_inputs(seq, tree) for seq, tree, _ in jobs]
    all_logits = forward_batch(model, [seq.target for seq, _, _ in jobs], [t for t, _, _ in inputs],
                               [p for _, p, _ in inputs])
    busy = time.perf_counter() - start
    return [_accept_and_commit(seq, tree, node_entry, logits, n_p, busy, len(jobs), params, vocab_size)
            for (seq, tree, node_entry), logits, (_, _, n_p) in zip(jobs, all_logits, inputs)]


def _target_inputs(seq: Sequence, tree: DraftTree) -> tuple[list[int], list[int], int]:
    """The target's new entries: the pending tokens as a chain, then the tree hung off the last."""
    pending = seq.pending(seq.target)
    n_p = len(pending)
    parents = _chain_parents(n_p) + [n_p - 1 if p < 0 else n_p + p for p in tree.parents]
    return pending + tree.tokens, parents, n_p


def _accept_and_commit(seq: Sequence, tree: DraftTree, node_entry: dict[int, int] | None, logits: torch.Tensor,
                       n_p: int, busy: float, rows: int, params: SamplingParams, vocab_size: int) -> Acceptance:
    """`busy` seconds of one target forward that verified `rows` sequences: this row's share is 1/rows."""
    target_probs = process_logits(logits[n_p - 1:], params, vocab_size)  # row 0: after the root
    acc = accept_tokens(tree, target_probs, params.greedy, seq.generator)
    seq.target.commit(list(range(n_p)) + [n_p + i for i in acc.path])
    seq.stats.verifications += 1
    seq.stats.target_forwards += 1 / rows
    seq.stats.target_busy_s += busy / rows
    seq.stats.accepted += len(acc.path)
    _commit_draft(seq, acc, node_entry)
    seq.append(acc.tokens)
    return acc


def _commit_draft(seq: Sequence, acc: Acceptance, node_entry: dict[int, int] | None) -> None:
    """The draft cache keeps its pending tokens and the accepted nodes it had already fed."""
    if seq.draft is not None and node_entry is not None:
        n_draft_pending = len(seq.draft.parents) - len(node_entry)
        fed_path = [node_entry[i] for i in acc.path if i in node_entry]
        seq.draft.commit(list(range(n_draft_pending)) + fed_path)
