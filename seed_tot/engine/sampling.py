"""Turn logits into the exact distributions that are sampled from (draft q and target p alike)."""
from __future__ import annotations

import torch

from .params import SamplingParams


def process_logits(logits: torch.Tensor, params: SamplingParams, vocab_size: int) -> torch.Tensor:
    """logits [..., V_model] -> float32 probabilities [..., vocab_size] after temperature, top-k, top-p.

    Both models go through this one function, so q and p are processed identically and share a dtype.
    Columns past `vocab_size` (embedding padding beyond the tokenizer) are never sampled.
    Greedy (temperature 0) gives the one-hot of the argmax.
    """
    logits = logits[..., :vocab_size].float()
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), vocab_size).float()
    logits = logits / params.temperature
    if 0 < params.top_k < vocab_size:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(-1)
        # drop a token when the tokens strictly more likely than it already cover top_p (keeps >= 1)
        drop_sorted = (sorted_probs.cumsum(-1) - sorted_probs) >= params.top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


def processing_key(params: SamplingParams) -> tuple:
    """What `process_logits` reads of a row's params: rows with equal keys are processed together."""
    return params.temperature, params.top_k, params.top_p


def process_by_params(logits: list[torch.Tensor], params: list[SamplingParams],
                      vocab_size: int) -> tuple[torch.Tensor, list[int]]:
    """`process_logits` of many rows' logits ([n_i, V] each, with their params), one call per group of
    equal params: the distributions stacked in the returned order of the rows' indices."""
    groups: dict[tuple, list[int]] = {}
    for i, p in enumerate(params):
        groups.setdefault(processing_key(p), []).append(i)
    order = [i for members in groups.values() for i in members]
    return torch.cat([process_logits(torch.cat([logits[i] for i in members]), params[members[0]], vocab_size)
                      for members in groups.values()]), order


def inverse_cdf(dist: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One token per row of the unnormalised [rows, V] `dist`, u [rows] in [0, 1): the first token
    whose cumulative mass exceeds u * total (token 0 for a row without mass). A draw on the device
    that depends only on u, so a row's uniforms can come from its own generator on the host and no
    draw reads the device."""
    # float64: a float32 cumsum over a large vocabulary moves each token's interval by up to an ulp of
    # the running total, a bias a rare token would feel; `last` (the last token with mass) guards
    # against u * total rounding up to the total
    cdf = dist.double().cumsum(-1)
    total = cdf[:, -1:]
    last = (cdf < total).sum(-1, keepdim=True)
    return torch.minimum(torch.searchsorted(cdf, u.double()[:, None] * total, right=True), last)[:, 0]


def draw_without_replacement(q: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Sibling groups drawn on the device: row g of q [G, V] gives u.shape[1] tokens [G, W], the c-th
    the inverse CDF of q without the tokens drawn before it, at u[g, c]. A group that asks for more
    tokens than q holds draws, once q is spent, a token of no mass, which the verifier rejects with
    its residual unchanged (q(x) = 0)."""
    dist, tokens = q, []
    for c in range(u.shape[1]):
        tokens.append(inverse_cdf(dist, u[:, c])[:, None])
        if c + 1 < u.shape[1]:
            dist = dist.scatter(-1, tokens[-1], 0.0)
    return torch.cat(tokens, 1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token from a 1-D distribution (argmax when it is one-hot, without spending randomness)."""
    if probs.max() == 1.0:
        return int(probs.argmax())
    return int(multinomial(probs, 1, generator))


def multinomial(probs: torch.Tensor, n: int, generator: torch.Generator | None,
                replacement: bool = False) -> torch.Tensor:
    """`torch.multinomial` drawing from `generator` wherever `probs` are. A sequence's generator
    lives on the host (its draws must not depend on the device or on what shares a forward), and
    torch refuses a generator of another device, so the distribution goes to the generator: the
    drawn tokens are read on the host next anyway."""
    if generator is not None and probs.device != generator.device:
        probs = probs.to(generator.device)
    return torch.multinomial(probs, n, replacement=replacement, generator=generator)
