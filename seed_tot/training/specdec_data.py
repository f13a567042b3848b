"""SpecDec++ training data (Huang et al. 2024, section 4): what the head learns from.

For each prompt: the target's response X; at each response position i the draft token
Y_i ~ q_i(. | X_<i) and its label min(1, p_i(Y_i) / q_i(Y_i)) (greedy: Y_i = argmax q_i, label
1 if it equals argmax p_i); the mixed sequence Z (Z_i = X_i with probability r, else Y_i), run
through the draft, gives the hidden state at each Z_i; the loss sees only positions where Z_i = Y_i.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from seed_tot.engine.params import SamplingParams
from seed_tot.engine.policies.base import HiddenCapture
from seed_tot.engine.sampling import process_logits


def acceptance_labels(p: torch.Tensor, q: torch.Tensor, y: torch.Tensor, greedy: bool) -> torch.Tensor:
    """p, q [n, V] processed distributions, y [n] draft tokens -> [n] probability each is accepted."""
    if greedy:
        return (p.argmax(-1) == y).float()
    py, qy = p.gather(-1, y[:, None])[:, 0], q.gather(-1, y[:, None])[:, 0]
    return torch.where(qy > 0, torch.clamp(py / qy.clamp_min(1e-30), max=1.0), torch.zeros_like(py))


def mix(x: torch.Tensor, y: torch.Tensor, r: float, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Z_i = X_i with probability r, else Y_i; returns Z and the mask of Y positions (where the loss applies)."""
    take_x = torch.rand(x.shape, generator=generator) < r
    return torch.where(take_x, x, y), ~take_x


@dataclass
class HeadData:
    hidden: torch.Tensor  # [N, d] draft hidden states at Y positions
    labels: torch.Tensor  # [N] acceptance probabilities
    # [N] the prompt each row came from: held-out and validation rows are whole prompts, since a
    # response's neighbouring positions are near copies of each other (None: each row its own)
    prompt: torch.Tensor | None = None

    def groups(self) -> torch.Tensor:
        return self.prompt if self.prompt is not None else torch.arange(len(self.labels))

    def subset(self, rows: torch.Tensor) -> "HeadData":
        return HeadData(self.hidden[rows], self.labels[rows], self.groups()[rows])


@torch.inference_mode()
def example_data(target, draft, prompt: list[int], response: list[int], params: SamplingParams, vocab_size: int,
                 r: float, generator: torch.Generator, capture: HiddenCapture) -> HeadData:
    """One prompt's training rows (teacher-forced full forwards, no KV cache)."""
    ids = torch.tensor([prompt + response], device=target.device)
    start, end = len(prompt) - 1, len(prompt) + len(response) - 1  # logits that predict the response tokens
    p = process_logits(target(input_ids=ids).logits[0, start:end], params, vocab_size)
    q = process_logits(draft(input_ids=ids.to(draft.device)).logits[0, start:end], params, vocab_size).cpu()
    capture.take()
    if params.greedy:
        y = q.argmax(-1)
    else:
        y = torch.multinomial(q, 1, generator=generator)[:, 0]
    labels = acceptance_labels(p.cpu(), q, y, params.greedy)
    x = torch.tensor(response)
    z, is_y = mix(x, y, r, generator)
    draft(input_ids=torch.tensor([prompt + z.tolist()], device=draft.device))
    hidden = capture.take()[len(prompt): len(prompt) + len(response)].float().cpu()  # the entry of each Z_i
    return HeadData(hidden[is_y], labels[is_y])


GEN_BATCH = 16  # prompts per batched target call


def generate_data(engine, prompts: list[list[int]], params: SamplingParams, r: float, seed: int,
                  progress=None, batch: int = GEN_BATCH) -> HeadData:
    """Target responses X (the engine's batched `parallel` mode with `params`, `batch` prompts per
    call: on a CPU a batched decode step costs little more than one row's), then each prompt's rows."""
    generator = torch.Generator().manual_seed(seed)
    capture = HiddenCapture(engine.draft)
    rows = []
    try:
        for first in range(0, len(prompts), batch):
            chunk = prompts[first: first + batch]
            for i, (prompt, result) in enumerate(zip(chunk, engine.generate(chunk, params, mode="parallel"))):
                if result.token_ids:
                    data = example_data(engine.target, engine.draft, prompt, result.token_ids, params,
                                        engine.vocab_size, r, generator, capture)
                    data.prompt = torch.full((len(data.labels),), first + i)
                    rows.append(data)
                if progress is not None:
                    progress(first + i + 1)
    finally:
        capture.remove()
    if not rows:
        raise ValueError("no training rows: every target response was empty")
    return HeadData(*(torch.cat([getattr(d, name) for d in rows]) for name in ("hidden", "labels", "prompt")))
