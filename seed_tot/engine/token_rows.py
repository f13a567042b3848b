"""A forward's rows of new tokens: host lists, or 1-D LongTensors on the model's device.

A draft policy's picks stay on the device (policies/fixed.py): reading them back before the next
draft forward would make every draft step wait for the device. The forwards take either kind, and
only the paths that build their inputs on the host read them (`host_tokens`).
"""
from __future__ import annotations

import torch

from .host_to_device import to_device


def host_tokens(tokens) -> list[int]:
    """`tokens` as a host list (reading a device tensor waits for the device)."""
    return tokens.tolist() if isinstance(tokens, torch.Tensor) else list(tokens)


def packed_ids(tokens: list, pad: int, device) -> torch.Tensor:
    """[1, sum of the rows' lengths + pad] input ids: every row's tokens, packed, then `pad` zeros.
    Rows on the device are joined there, so none of them is read back to the host."""
    if not any(isinstance(row, torch.Tensor) for row in tokens):
        return to_device([t for row in tokens for t in row] + [0] * pad, device)[None]
    parts = [to_device(row, device) for row in tokens]
    if pad:
        parts.append(torch.zeros(pad, dtype=torch.long, device=device))
    return torch.cat(parts)[None]
