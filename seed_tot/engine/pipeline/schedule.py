"""Tick loops of PipeDec and its two baselines, over any comm (in-memory or torch.distributed).

A tick is one step of every stage at once. PipeDec, per tick:
  1. every stage computes: the draft adds a tree layer, each target stage runs the layer it got
     on the previous tick (the first one embeds the shallowest layer it has not seen);
  2. the new layer's structure reaches every tree replica, activations move one stage on;
  3. when the root's target logits are known, the last stage samples the next token from the
     target's own distribution and every process applies it: hit -> reroot at that child (its
     subtree and its in-flight activations survive), miss -> restart from the new token.
PP is the same loop with a draft that never drafts (one token through all N stages, N ticks).
STPP drafts a static k_config tree (one draft forward per level, one tick each) and sends it
through the N stages as one microbatch (N ticks); the engine's verifier accepts a path.
Every role keeps its own Sequence replica, so the ones that sample (the last stage at the root,
the draft in STPP) own their own generators: the output never depends on how ranks are placed.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..sampling import process_logits
from ..speculative import commit_draft, draft_round
from ..verify import decide_row
from .roles import Message, prompt_message

from . import PIPELINE_MODES  # noqa: F401 - defined with the package, torch-free; launch.py reads it here
DRAFT_SEED_OFFSET = 1_000_003  # the STPP draft's own random stream, apart from the target's


@dataclass
class PipelineStats:
    ticks: int = 0
    tokens: int = 0
    hits: int = 0  # emitted tokens that were already in the tree (PipeDec) / accepted drafts (STPP)
    rounds: int = 0  # STPP verification rounds
    stage_forwards: list[int] = field(default_factory=list)  # per rank, what that process ran

    @property
    def hit_rate(self) -> float:
        return self.hits / self.tokens if self.tokens else 0.0

    @property
    def ticks_per_token(self) -> float:
        return self.ticks / self.tokens if self.tokens else 0.0

    def to_dict(self) -> dict:
        return dict(ticks=self.ticks, tokens=self.tokens, hits=self.hits, rounds=self.rounds,
                    hit_rate=self.hit_rate, ticks_per_token=self.ticks_per_token,
                    stage_forwards=list(self.stage_forwards))


def prefill_targets(roles, comm) -> None:
    """Commit the prompt (all but its last token) in every target stage's cache; not counted as ticks."""
    prompt = roles[0].seq.prompt if roles else []
    if len(prompt) < 2:
        return
    comm.relay(roles, prompt_message(prompt))
    for role in roles:
        if not role.is_draft:
            role.commit_all()


def run_pipedec(roles, comm, n_stages: int) -> PipelineStats:
    """PipeDec (or PP, when the draft role is disabled). `roles` are this process's roles."""
    stats = PipelineStats()
    prefill_targets(roles, comm)
    seq = roles[0].seq
    while not seq.done:
        stats.ticks += 1
        layer = None
        for role in roles:
            out = role.compute()
            if role.is_draft:
                layer = out
        layer = comm.share_layer(roles, layer)
        for role in roles:
            role.add_layer(layer)
        comm.pass_on(roles)
        last = next((r for r in roles if r.is_last), None)
        token = comm.share_token(roles, last.choose() if last is not None else -1)
        if token >= 0:
            stats.tokens += 1
            hits = {role.apply(token) for role in roles}
            stats.hits += hits.pop()  # every replica decides identically
    stats.stage_forwards = comm.gather_forwards(roles, n_stages)
    return stats


def run_stpp(roles, comm, n_stages: int, k_config: tuple[int, ...]) -> PipelineStats:
    """Static-tree speculative decoding through the same stages (the draft on rank 0)."""
    stats = PipelineStats()
    prefill_targets(roles, comm)
    seq = roles[0].seq
    draft = next((r for r in roles if r.is_draft), None)
    last = next((r for r in roles if r.is_last), None)
    while not seq.done:
        tree = node_entry = None
        levels = 0
        if draft is not None:
            draft.seq.draft = draft.cache.kv
            calls: list[int] = []  # count the draft's forwards, whatever the drafting code does per level
            handle = draft.runtime.model.register_forward_hook(lambda *_: calls.append(1))
            try:
                tree, node_entry = draft_round(draft.runtime, draft.seq, k_config, draft.params, draft.vocab_size)
            finally:
                handle.remove()
            levels = len(calls)
            draft.forwards += levels
        tree, levels = comm.share_tree(roles, tree, levels)
        root = seq.tokens[-1]  # the pending token: everything before it is committed in every stage
        ids = list(range(len(tree) + 1))
        parents = [-1] + [0 if p < 0 else p + 1 for p in tree.parents]
        comm.relay(roles, Message(ids, [root] + tree.tokens, parents, None))
        acc = None
        if last is not None:
            rows = [last.logits[i] for i in ids]
            probs = process_logits(torch.stack(rows), last.params, last.vocab_size)
            acc = decide_row(last.seq, tree, probs, last.params)
        acc = comm.share_acceptance(roles, acc)
        for role in roles:
            if role.is_draft:
                commit_draft(role.seq, acc, node_entry)
            else:
                role.cache.retain([0] + [i + 1 for i in acc.path], [])
                role.logits = {}
            kept = role.seq.append(acc.tokens)
        stats.ticks += levels + n_stages
        stats.rounds += 1
        stats.hits += min(len(acc.path), kept)  # drafts accepted past a stop are dropped with it: not hits
    stats.tokens = len(seq.generated)
    stats.stage_forwards = comm.gather_forwards(roles, n_stages)
    return stats
