"""The draft tree: the one structure every draft policy hands to the verifier.

A chain (SD, SEED with k_config (1,1,1)) is a tree with one child per node; MCSD's k_config
products, OPT-Tree's adaptive trees or SpecDec++'s variable-length chains are other shapes of it.

Two kinds of nodes, because the verifier needs a different (each exact) rule for each:
- *sampled* nodes were drawn from a draft distribution q; the verifier needs q, stored once per
  sibling group in `draft_probs` and pointed to by `q_index[i]`;
- *deterministic* nodes (`q_index[i] == -1`) were chosen without randomness (the draft's top
  tokens, OPT-Tree's best paths); the verifier treats them as one-hot proposals without
  replacement, so they cost no vocabulary-sized row at all.
Within one sibling group the deterministic children come first (the verifier tries them, then runs
the sampled ones against the residual they leave: verify.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

DETERMINISTIC = -1  # q_index of a node that was picked, not sampled
UNREAD = -1  # a token still on the device (DraftTree.device_tokens)


@dataclass
class DraftTree:
    """Nodes in topological order (a parent comes before its children, siblings in draw order).

    parents[i]     index of node i's parent, -1 for a child of the root (the sequence's last token)
    tokens[i]      the drafted token
    draft_probs    processed draft distributions q, float32 [m, V]; one row per sibling group is
                   enough (without replacement every sibling was drawn from the same q)
    q_index[i]     the row of draft_probs node i was drawn from, or DETERMINISTIC (-1);
                   None means row i for node i (one row per node, the original layout)
    without_replacement: siblings were drawn one after another from the same q with earlier
        siblings removed (MCSD, Yang et al. 2024); False means each sibling was an independent draw
        from its own draft_probs row (SpecInfer-style multi-draft).
    path_probs[i]  optional: the policy's estimate that node i is accepted (OPT-Tree's p̂)
    device_tokens  the tokens as a LongTensor on the draft's device while they are not read yet
                   (`tokens` holds UNREAD until `read_tokens`): a policy's picks stay there so that
                   neither a draft step nor the target's forward waits for them (policies/fixed.py)
    """

    parents: list[int]
    tokens: list[int]
    draft_probs: torch.Tensor
    without_replacement: bool = True
    q_index: list[int] | None = None
    path_probs: list[float] | None = field(default=None, compare=False)
    device_tokens: torch.Tensor | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        n = len(self.tokens)
        rows = self.draft_probs.shape[0] if self.draft_probs.dim() == 2 else 0
        if self.q_index is None:
            if len(self.parents) != n or (n and rows != n):
                raise ValueError(f"draft tree has {n} tokens, {len(self.parents)} parents, {rows} draft distributions")
            self.q_index = list(range(n))
        elif len(self.parents) != n or len(self.q_index) != n:
            raise ValueError(f"draft tree has {n} tokens, {len(self.parents)} parents, {len(self.q_index)} q indices")
        for i, p in enumerate(self.parents):
            if not -1 <= p < i:
                raise ValueError(f"draft tree node {i} has parent {p}; parents must precede children")
            if not DETERMINISTIC <= self.q_index[i] < rows:
                raise ValueError(f"draft tree node {i} points at q row {self.q_index[i]}; there are {rows}")
        sampled_seen: set[int] = set()
        for p, q in zip(self.parents, self.q_index):
            if q != DETERMINISTIC:
                sampled_seen.add(p)
            elif p in sampled_seen:
                raise ValueError(f"draft node {p} has a deterministic child after a sampled one; deterministic "
                                 f"candidates must come first in their sibling group")

    def read_tokens(self, values: list[int] | None = None) -> None:
        """Fill `tokens` from `device_tokens` (values: them, read already by a shared transfer)."""
        if self.device_tokens is not None:
            self.tokens = self.device_tokens.tolist() if values is None else list(values)
            self.device_tokens = None

    @classmethod
    def empty(cls, vocab_size: int) -> "DraftTree":
        return cls([], [], torch.empty(0, vocab_size))

    def __len__(self) -> int:
        return len(self.tokens)

    def deterministic(self, node: int) -> bool:
        return self.q_index[node] == DETERMINISTIC

    def q(self, node: int) -> torch.Tensor:
        return self.draft_probs[self.q_index[node]]

    def children(self, node: int) -> list[int]:
        return [i for i, p in enumerate(self.parents) if p == node]

    def depth(self) -> int:
        depths: list[int] = []
        for p in self.parents:
            depths.append(1 + (depths[p] if p >= 0 else 0))
        return max(depths, default=0)

    def expected_tokens(self) -> float | None:
        """OPT-Tree's E(A): 1 (the target's own token) + the sum of the nodes' acceptance estimates."""
        return None if self.path_probs is None else 1.0 + sum(self.path_probs)


def read_tokens(trees: list[DraftTree]) -> None:
    """Every tree's tokens still on the device, read with one transfer for all of them."""
    waiting = [tree for tree in trees if tree.device_tokens is not None]
    if not waiting:
        return
    values = torch.cat([tree.device_tokens for tree in waiting]).tolist()
    at = 0
    for tree in waiting:
        n = tree.device_tokens.numel()
        tree.read_tokens(values[at: at + n])
        at += n


# A verification sends its rows' draft tokens to the device packed as float32 with other per-node
# numbers, in one copy; a tree's tokens still on the device hold their place there as 0 and are copied
# into place on the device (`place_device_tokens`), never read.
def packed_tokens(tree: DraftTree) -> list:
    """The tree's tokens for a host-built packed row: 0 for each token still on the device."""
    return [0.0] * len(tree) if tree.device_tokens is not None else tree.tokens


def place_device_tokens(tokens: torch.Tensor, trees: list[DraftTree]) -> None:
    """Write each tree's device tokens into its row of the unpacked `tokens` [rows, >= len(tree)]."""
    for b, tree in enumerate(trees):
        if tree.device_tokens is not None:
            tokens[b, : len(tree)] = tree.device_tokens.to(tokens.device)


def check_packable(trees: list[DraftTree], vocab: int) -> None:
    """Host tokens travel as float32, exact below 2**24."""
    if vocab > 2 ** 24 and any(tree.device_tokens is None for tree in trees):
        raise ValueError(f"a vocabulary of {vocab} tokens does not fit the float32 transfer of draft tokens")
