"""Host data to the model's device without a hidden wait.

A blocking copy from pageable host memory waits for every kernel queued before it: a host sync in
all but name, paid once per copy. So every host-built input of a forward (token ids, positions,
masks, slot indices) and of a verification (uniforms, draft tokens) goes through `to_device`: staged
in pinned memory and copied without waiting. PyTorch's pinned-memory allocator keeps the staging
buffer until the copy has run, so the caller may drop its tensor at once.
"""
from __future__ import annotations

import torch


def pinnable(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` itself, or a compact copy where elements share memory (a broadcast from `expand`): pinning
    writes every element, and torch refuses a write through a view that aliases one location twice."""
    return tensor if tensor.is_contiguous() else tensor.contiguous()


def to_device(values: "list | torch.Tensor", device, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """`values` (a list, made a `dtype` tensor, or a tensor) on `device`, copied without waiting."""
    tensor = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
    device = torch.device(device)
    if device.type == "cuda" and tensor.device.type == "cpu":
        tensor = pinnable(tensor).pin_memory()
    return tensor.to(device, non_blocking=True)
