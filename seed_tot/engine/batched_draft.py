"""Batched drafting: many sequences' draft rounds, one draft forward per draft step.

SEED keeps one logical draft worker per sequence (it drafts, pushes its tree into the VerifyQueue,
waits for its verification, drafts again), but a forward that carries one row wastes the
hardware: a draft step over many rows costs far less than that many one-row steps, on a CPU
(docs/benchmarks.md) and more so on a GPU, where a small draft is launch-bound. So the workers that are ready
at the same time hand their rounds to one `DraftBatcher`, which runs every round's next feed in a
single `forward_batch` (each row with its own tree and 4D mask) until all rounds are finished.

Each round is the same `DraftPolicy` state machine the single-row driver runs, fed the same logits
(up to float round-off of a padded batch) and drawing from its own sequence's generator, so a
sequence's draft does not depend on which rows share its forwards.
"""
from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from .draft_tree import DraftTree
from .forward_thread import after_queued_work
from .kv_cache import forward_batch
from .policies.base import DraftPolicy
from .sequence import Sequence
from .speculative import draft_round


@torch.inference_mode()
def draft_batch_round(model, rows: list[tuple[Sequence, DraftPolicy]], vocab_size: int
                      ) -> list[tuple[DraftTree, dict[int, int]]]:
    """One draft round for every (sequence, its call's policy), one batched draft forward per step of
    the longest round. Each sequence drafts with its own call's sampling params (`seq.rule.params`)."""
    by_policy: dict[int, tuple[DraftPolicy, list[Sequence]]] = {}
    for seq, policy in rows:
        by_policy.setdefault(id(policy), (policy, []))[1].append(seq)
    for policy, seqs in by_policy.values():
        policy.plan_batch(seqs, len(rows))
    if len(rows) == 1:  # one row needs no padding
        return [draft_round(model, seq, policy, seq.rule.params, vocab_size) for seq, policy in rows]
    # policies that read hidden states (specdec, auto with a head): a capture holds the whole batch's
    # final hidden states, row j's first len(feed) entries are its own
    captures = {id(policy.capture): policy.capture for _, policy in rows if policy.capture is not None}
    seqs = [seq for seq, _ in rows]
    start = time.perf_counter()
    rounds = [policy.begin(seq, seq.rule.params, vocab_size) for seq, policy in rows]
    feeds = [r.first_feed() for r in rounds]
    while True:
        active = [i for i, feed in enumerate(feeds) if feed is not None]
        if not active:
            break
        features = [feeds[i].features for i in active]
        logits = forward_batch(model, [seqs[i].draft for i in active], [feeds[i].tokens for i in active],
                               [feeds[i].parents for i in active], what="batched drafting (draft_batch > 1)",
                               features=features if any(f is not None for f in features) else None)
        hidden = {key: capture.take_rows() for key, capture in captures.items()}
        for j, (i, row_logits) in enumerate(zip(active, logits)):
            seqs[i].stats.draft_forwards += 1 / len(active)  # one forward shared by the active rows
            capture = rows[i][1].capture
            row_hidden = hidden[id(capture)][j, :len(feeds[i].tokens)] if rounds[i].needs_hidden else None
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


@dataclass
class _Request:
    seq: Sequence
    policy: DraftPolicy
    max_rows: int | None  # its call's draft_batch (None: every ready worker)
    done: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class DraftBatcher:
    """Gathers the draft workers that are ready and drafts them in batched rounds, FCFS, up to the
    head request's draft_batch rows per round.

    Continuous batching on the draft side: while a batched round runs in the draft thread, workers
    whose verification comes back queue up, and the next round takes them.
    """

    def __init__(self, model, vocab_size: int, pool: ThreadPoolExecutor, run_in_stream, wait_turn: bool = False,
                 settle=None):
        self.model, self.vocab_size = model, vocab_size
        self.pool, self.run_in_stream = pool, run_in_stream
        # with one forward thread for drafts and verification (a CPU engine), gather the round's rows
        # when that thread is free, not before: workers verified meanwhile join the round
        self.wait_turn = wait_turn
        # and (`settle`, awaited first) once no verification is queued or running: see SeedScheduler
        self.settle = settle
        self._waiting: list[_Request] = []
        self._wake = asyncio.Event()

    async def draft(self, seq: Sequence, policy: DraftPolicy, max_rows: int | None) -> tuple[DraftTree, dict[int, int]]:
        request = _Request(seq, policy, max_rows)
        self._waiting.append(request)
        self._wake.set()
        return await request.done

    async def run(self) -> None:
        """The drafting loop; cancel it when every worker has finished."""
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._waiting:
                batch: list[_Request] = []
                try:
                    if self.settle is not None:
                        await self.settle()
                    if self.wait_turn:
                        await after_queued_work(self.pool)
                    self._waiting = [r for r in self._waiting if not r.done.done()]  # drop cancelled workers
                    take = self._waiting[0].max_rows if self._waiting else 0
                    take = len(self._waiting) if take is None else take
                    batch, self._waiting = self._waiting[:take], self._waiting[take:]
                    if not batch:
                        break
                    drafts = await loop.run_in_executor(self.pool, self.run_in_stream, draft_batch_round, self.model,
                                                        [(r.seq, r.policy) for r in batch], self.vocab_size)
                except Exception as err:  # each affected worker raises it, naming its sequence; a failure
                    # before the batch was chosen (the executor refused even to wait) fails every waiting one
                    if not batch:
                        batch, self._waiting = self._waiting, []
                    for r in batch:
                        if not r.done.done():
                            r.done.set_exception(err)
                    continue
                for r, draft in zip(batch, drafts):
                    if not r.done.done():  # a cancelled worker has stopped waiting
                        r.done.set_result(draft)
