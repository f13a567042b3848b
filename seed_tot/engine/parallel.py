"""The Parallel baseline (the SEED paper's Fig. 1(d)) as one static batch per call.

`parallel` normally runs on the engine's SeedScheduler as plain target steps, so that overlapping
calls share forwards (Engine._scheduled); this static batch serves the targets that cannot take the
scheduler's batched 4D masks (ALiBi: Bloom, MPT), whose 2D padding mask it builds exactly.

Prompts are left-padded to one length; position ids come from the attention mask so that each
row sees exactly the positions it would see alone. The prompt is scored inside the first decode forward (no separate prefill is
counted). Rows that have stopped keep riding along
(their tokens are ignored) until every row is done, as a static batch does.
"""
from __future__ import annotations

import threading
import time

import torch
from transformers import DynamicCache

from .cache_argument import cache_kwargs
from .params import SamplingParams
from .draft_tree import DraftTree
from .sampling import process_logits
from .sequence import Sequence
from .verify import decide_row


@torch.inference_mode()
def generate_parallel(model, seqs: list[Sequence], params: SamplingParams, vocab_size: int,
                      stop: threading.Event | None = None) -> None:
    """Decode every row to its end, or until `stop` is set (its caller was cancelled: the batch
    gives its thread back at the next step instead of running out the rows' budgets)."""
    empty = DraftTree.empty(vocab_size)  # each row's step decided as the scheduler decides a plain step
    device = model.device
    width = max(len(s.prompt) for s in seqs)
    pad = 0
    input_ids = torch.tensor([[pad] * (width - len(s.prompt)) + s.prompt for s in seqs], device=device)
    mask = torch.tensor([[0] * (width - len(s.prompt)) + [1] * len(s.prompt) for s in seqs], device=device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache()
    while stop is None or not stop.is_set():
        start = time.perf_counter()
        logits = model(input_ids=input_ids, attention_mask=mask, position_ids=positions,
                       use_cache=True, **cache_kwargs(model, cache)).logits[:, -1]
        probs = process_logits(logits, params, vocab_size)
        busy = time.perf_counter() - start
        next_ids = []
        active = sum(not s.done for s in seqs)
        for row, seq in enumerate(seqs):
            if not seq.done:
                # one forward shared by the active rows: summing rows gives one forward and its time once
                seq.stats.verifications += 1
                seq.stats.target_forwards += 1 / active
                seq.stats.target_query_tokens += 1
                seq.stats.target_busy_s += busy / active
                seq.append([decide_row(seq, empty, probs[row][None], params).tokens[-1]])
            next_ids.append(seq.generated[-1] if seq.generated else pad)
        if all(s.done for s in seqs):
            return
        input_ids = torch.tensor(next_ids, device=device)[:, None]
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        positions = positions[:, -1:] + 1
