"""What each pipeline process does: the draft stage (rank 0) and the target stages (ranks 1..N).

A role owns one stage's model part, its KV cache, a replica of the prediction tree and a replica
of the sequence (for the stop rule). Roles never talk to each other directly: the tick loops in
`schedule.py` move their outputs through a `comm` (in memory, or torch.distributed), so the
single-process simulation and the multi-process run execute the very same role code.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..params import SamplingParams
from ..draft_tree import DraftTree
from ..sampling import process_logits
from ..sequence import Sequence, StopRule
from ..speculative import prefill
from ..verify import decide_row
from .stages import StageKV, TargetStage
from .tree import PredictionTree, expand_layer


@dataclass
class Message:
    """Activations of some tree nodes on their way from stage s to stage s + 1."""

    ids: list[int]
    tokens: list[int]
    parents: list[int]  # node ids (-1: the committed prefix)
    hidden: torch.Tensor | None  # [1, n, H]; None for token-only messages into the first stage

    def keep(self, alive) -> "Message":
        rows = [i for i, n in enumerate(self.ids) if n in alive]
        if len(rows) == len(self.ids):
            return self
        hidden = self.hidden[:, rows] if self.hidden is not None else None
        return Message([self.ids[i] for i in rows], [self.tokens[i] for i in rows],
                       [self.parents[i] for i in rows], hidden)


def prompt_message(prompt: list[int]) -> Message:
    """All prompt tokens but the last as a chain with negative node ids (the tree's ids are >= 0)."""
    ids = [-(i + 2) for i in range(len(prompt) - 1)]
    return Message(ids, prompt[:-1], [-1] + ids[:-1], None)


def new_sequence(prompt: list[int], params: SamplingParams, eos_ids, tokenizer, seed: int) -> Sequence:
    return Sequence(0, list(prompt), StopRule(params, frozenset(eos_ids), tokenizer), torch.Generator().manual_seed(seed))


class Role:
    rank: int
    is_draft = False
    is_last = False

    def __init__(self, seq: Sequence):
        self.seq = seq
        self.tree = PredictionTree(seq.prompt[-1])
        self.inbox: Message | None = None
        self.outbox: Message | None = None
        self.forwards = 0

    def add_layer(self, layer) -> None:
        if layer is not None:
            self.tree.add_layer(*layer)


class DraftRole(Role):
    """Rank 0: grows the prediction tree by one layer per tick (PipeDec) or drafts a static tree (STPP)."""

    is_draft = True

    def __init__(self, runtime, seq: Sequence, params: SamplingParams, vocab_size: int, width: int, children: int,
                 enabled: bool = True):
        """runtime: the draft model's ModelRuntime, made once per process for every prompt's role."""
        super().__init__(seq)
        self.rank = 0
        self.runtime, self.params, self.vocab_size = runtime, params, vocab_size
        self.width, self.children, self.enabled = width, children, enabled
        self.cache = StageKV()
        self.child_logp: dict[int, torch.Tensor] = {}  # node -> draft log-probabilities of its next token
        if enabled:
            prefill(self.runtime, self.cache.kv, seq.prompt)

    @torch.inference_mode()
    def compute(self):
        """Run the draft on the deepest layer (if new) and return the next layer (parents, tokens, logps)."""
        if not self.enabled:
            return None
        tree = self.tree
        deepest = tree.layers[-1]
        todo = [n for n in deepest if n not in self.child_logp]
        if todo:
            parents = self.cache.parents_for([tree.nodes[n].parent for n in todo], todo)
            logits = self.cache.kv.forward(self.runtime, [tree.nodes[n].token for n in todo], parents)
            self.cache.ids = self.cache.ids + todo
            self.forwards += 1
            for n, row in zip(todo, torch.log_softmax(logits[:, : self.vocab_size].double(), -1)):
                self.child_logp[n] = row
        path = torch.tensor([tree.nodes[n].logp for n in deepest], dtype=torch.float64)
        rows, tokens, logps = expand_layer(path, torch.stack([self.child_logp[n] for n in deepest]),
                                           self.children, self.width)
        return [deepest[r] for r in rows], tokens, logps.tolist()

    def apply(self, token: int) -> bool:
        old_root = self.tree.root
        hit = self.tree.advance(token)
        if self.enabled:
            self.cache.retain([old_root], self.tree.ids())
            self.child_logp = {n: v for n, v in self.child_logp.items() if n in self.tree}
        self.seq.append([token])
        return hit


class TargetRole(Role):
    """Rank s in 1..N: runs its decoder layers on the layer it received on the previous tick."""

    def __init__(self, stage: TargetStage, rank: int, seq: Sequence, params: SamplingParams, vocab_size: int):
        super().__init__(seq)
        self.stage, self.rank = stage, rank
        self.is_last = stage.last
        self.params, self.vocab_size = params, vocab_size
        self.cache = StageKV()
        self.logits: dict[int, torch.Tensor] = {}  # last stage: node -> target logits after it

    def run(self, msg: Message | None) -> None:
        """Process a message; the output goes to `outbox` (hidden states) or `logits` (last stage)."""
        self.outbox = None
        if msg is None or not msg.ids:
            return
        out = self.stage.run(self.cache, msg.ids, msg.tokens, msg.parents, msg.hidden)
        self.forwards += 1
        if self.is_last:
            self.logits.update(zip(msg.ids, out))
        else:
            self.outbox = Message(msg.ids, msg.tokens, msg.parents, out)

    def compute(self) -> None:
        """PipeDec tick: the first stage takes the shallowest tree layer it has not seen; the others
        take what the previous stage sent on the last tick."""
        if self.stage.first:
            seen = set(self.cache.ids)
            msg = None
            for layer in self.tree.layers:
                todo = [n for n in layer if n not in seen]
                if todo:
                    nodes = self.tree.nodes
                    msg = Message(todo, [nodes[n].token for n in todo], [nodes[n].parent for n in todo], None)
                    break
        else:
            msg, self.inbox = self.inbox, None
        self.run(msg)

    def choose(self) -> int:
        """Last stage: the next token, sampled from the target's distribution at the root; -1 if unknown yet."""
        row = self.logits.get(self.tree.root)
        if row is None:
            return -1
        probs = process_logits(row, self.params, self.vocab_size)[None]  # a plain decode step: an empty draft
        return decide_row(self.seq, DraftTree.empty(probs.shape[-1]), probs, self.params).tokens[-1]

    def apply(self, token: int) -> bool:
        old_root = self.tree.root
        hit = self.tree.advance(token)
        self.cache.retain([old_root], self.tree.ids())
        self.logits = {n: v for n, v in self.logits.items() if n in self.tree}
        if self.inbox is not None:
            self.inbox = self.inbox.keep(self.tree.nodes)
        self.seq.append([token])
        return hit

    def commit_all(self) -> None:
        """After a prefill or a verified STPP round: the chain just processed becomes the prefix."""
        self.cache.retain(list(self.cache.ids), [])
        self.logits = {}
