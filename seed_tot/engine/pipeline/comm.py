"""How roles' outputs move: in memory (one process simulates every stage) or over torch.distributed.

Both comms offer the same operations, so the tick loops cannot tell them apart:
  share_layer     the draft's new tree layer (structure only) to every tree replica
  pass_on         each target stage's output to the next stage's inbox (one tick's hop)
  share_token     the last stage's sampled token (-1: none this tick) to everyone
  relay           one message through all target stages in order (prefill, STPP verification)
  share_tree / share_acceptance   STPP's draft tree (+ its forward count) out of rank 0, the verdict out of rank N
  gather_forwards per-rank forward counts
Over torch.distributed, rank 0 is the draft, ranks 1..N the target stages, point-to-point
sends carry activations behind a small shape header, broadcasts carry the decisions.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ..draft_tree import DraftTree
from ..verify import Acceptance
from .roles import Message


def _targets(roles):
    return sorted((r for r in roles if not r.is_draft), key=lambda r: r.rank)


class LocalComm:
    """Every role lives in this process; a hop is an assignment."""

    def share_layer(self, roles, layer):
        return layer

    def pass_on(self, roles) -> None:
        targets = _targets(roles)
        for sender, receiver in zip(targets, targets[1:]):
            receiver.inbox, sender.outbox = sender.outbox, None

    def share_token(self, roles, token: int) -> int:
        return token

    def relay(self, roles, msg: Message) -> None:
        for role in _targets(roles):
            role.run(msg)
            msg = role.outbox

    def share_tree(self, roles, tree: DraftTree, levels: int) -> tuple[DraftTree, int]:
        return tree, levels

    def share_acceptance(self, roles, acc: Acceptance) -> Acceptance:
        return acc

    def gather_forwards(self, roles, n_stages: int) -> list[int]:
        return [r.forwards for r in sorted(roles, key=lambda r: r.rank)]


class DistComm:
    """This process runs one role (rank r of N + 1) in an initialised torch.distributed group."""

    def __init__(self, n_stages: int, hidden_size: int, dtype: torch.dtype):
        self.rank, self.last = dist.get_rank(), n_stages
        self.hidden_size, self.dtype = hidden_size, dtype

    # ---------------------------------------------------------------- point to point
    def _send(self, msg: Message | None, dst: int) -> list:
        n = len(msg.ids) if msg is not None else 0
        works = [dist.isend(torch.tensor([n], dtype=torch.long), dst)]
        if n:
            meta = torch.tensor([msg.ids, msg.tokens, msg.parents], dtype=torch.long)
            works += [dist.isend(meta, dst), dist.isend(msg.hidden.contiguous(), dst)]
        return works

    def _recv(self, src: int) -> Message | None:
        header = torch.zeros(1, dtype=torch.long)
        dist.recv(header, src)
        n = int(header)
        if not n:
            return None
        meta = torch.zeros(3, n, dtype=torch.long)
        hidden = torch.zeros(1, n, self.hidden_size, dtype=self.dtype)
        dist.recv(meta, src)
        dist.recv(hidden, src)
        ids, tokens, parents = meta.tolist()
        return Message(ids, tokens, parents, hidden)

    def pass_on(self, roles) -> None:
        role = roles[0]
        if role.is_draft:
            return
        works = self._send(role.outbox, self.rank + 1) if self.rank < self.last else []
        role.outbox = None
        if self.rank > 1:
            role.inbox = self._recv(self.rank - 1)
        for work in works:
            work.wait()

    def relay(self, roles, msg: Message) -> None:
        role = roles[0]
        if role.is_draft:
            return
        if self.rank > 1:
            msg = self._recv(self.rank - 1)
        role.run(msg)
        if self.rank < self.last:
            for work in self._send(role.outbox, self.rank + 1):
                work.wait()

    # ---------------------------------------------------------------- broadcasts
    def _bcast_long(self, values: list[int] | None, n: int, src: int) -> list[int]:
        if n == 0:  # every rank knows the size already: nothing to send
            return []
        t = torch.tensor(values, dtype=torch.long) if self.rank == src else torch.zeros(n, dtype=torch.long)
        dist.broadcast(t, src)
        return t.tolist()

    def share_layer(self, roles, layer):
        n = self._bcast_long([len(layer[1]) if layer is not None else -1], 1, 0)[0]
        if n < 0:
            return None
        parents = self._bcast_long(layer[0] if self.rank == 0 else None, n, 0)
        tokens = self._bcast_long(layer[1] if self.rank == 0 else None, n, 0)
        logps = torch.tensor(layer[2], dtype=torch.float64) if self.rank == 0 else torch.zeros(n, dtype=torch.float64)
        dist.broadcast(logps, 0)
        return parents, tokens, logps.tolist()

    def share_token(self, roles, token: int) -> int:
        return self._bcast_long([token], 1, self.last)[0]

    def share_tree(self, roles, tree: DraftTree | None, levels: int) -> tuple[DraftTree, int]:
        """Structure (and the draft's forward count) to every rank; the draft distributions q (rows of
        draft_probs) to the verifier alone."""
        head = None
        if self.rank == 0:
            q_index = getattr(tree, "q_index", None)  # one q row per sibling group, where the tree says so
            head = [len(tree), tree.draft_probs.shape[0], tree.draft_probs.shape[-1], int(tree.without_replacement),
                    int(q_index is not None), levels]
        n, rows, vocab, without_replacement, has_index, levels = self._bcast_long(head, 6, 0)
        parents = self._bcast_long(tree.parents if self.rank == 0 else None, n, 0)
        tokens = self._bcast_long(tree.tokens if self.rank == 0 else None, n, 0)
        extra = {}
        if has_index:
            extra["q_index"] = self._bcast_long(list(tree.q_index) if self.rank == 0 else None, n, 0)
        probs = torch.zeros(rows, 0)
        if self.rank == 0:
            if rows:
                dist.send(tree.draft_probs.float().contiguous(), self.last)
            probs = tree.draft_probs
        elif self.rank == self.last:
            probs = torch.zeros(rows, vocab)
            if rows:
                dist.recv(probs, 0)
        return DraftTree(parents, tokens, probs, bool(without_replacement), **extra), levels

    def share_acceptance(self, roles, acc: Acceptance | None) -> Acceptance:
        src = self.last
        sizes = self._bcast_long([len(acc.path), len(acc.tokens), int(acc.resampled)] if self.rank == src else None, 3, src)
        path = self._bcast_long(acc.path if self.rank == src else None, sizes[0], src)
        tokens = self._bcast_long(acc.tokens if self.rank == src else None, sizes[1], src)
        return Acceptance(path, tokens, bool(sizes[2]))

    def gather_forwards(self, roles, n_stages: int) -> list[int]:
        counts = [torch.zeros(1, dtype=torch.long) for _ in range(n_stages + 1)]
        dist.all_gather(counts, torch.tensor([roles[0].forwards], dtype=torch.long))
        return [int(c) for c in counts]
