"""The training sample a drafter learns from, shared by the data, labelling and training modules
(kept apart from them so that each imports it without importing the others)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

DATA_FILE = "data.safetensors"  # a drafter directory's cached samples (drafter_data.pack)


@dataclass
class Sample:
    """One training sequence: prompt + the target's response; labels start at `start` (the response)."""

    tokens: list[int]
    start: int
    hidden: torch.Tensor | None = None  # the target's final hidden states [len(tokens), size], for a drafter that reads them
