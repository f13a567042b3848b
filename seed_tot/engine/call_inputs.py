"""What a caller hands the engine, checked before any model work: prompts, sampling params, a dtype.
Each bad input is an error naming what it is and what was expected, where torch would fail later
with a message about something else."""
from __future__ import annotations

import operator
from typing import Sequence as Seq

import torch

from .params import SamplingParams


def encode_prompts(prompts: Seq[str] | Seq[Seq[int]], tokenizer, vocab_rows: int) -> list[list[int]]:
    """A call's prompts as token-id lists: strings through `tokenizer`, id lists checked as integers
    inside the model's `vocab_rows` embedding rows; anything else a ValueError naming the prompt."""
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Seq):
        raise ValueError("prompts must be a list of strings or a list of token-id lists")
    if len(prompts) == 0:
        raise ValueError("prompts is empty: pass at least one prompt")
    encoded = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            if tokenizer is None:
                raise ValueError("string prompts need a tokenizer; pass token-id lists or a tokenizer")
            ids = tokenizer(p, add_special_tokens=False)["input_ids"] if p else []
        else:
            ids = _token_ids(i, p)
        if not ids:
            raise ValueError(f"prompt {i} is empty: a prompt needs at least one token")
        if max(ids) >= vocab_rows or min(ids) < 0:
            raise ValueError(f"prompt {i} has a token id outside the model's vocabulary")
        encoded.append(ids)
    return encoded


def torch_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    """A floating torch dtype, given as one or by name ("bfloat16"), or None (the device's default)."""
    resolved = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
    if dtype is not None and not (isinstance(resolved, torch.dtype) and resolved.is_floating_point):
        raise ValueError(f"dtype {dtype!r} is not a floating torch dtype; expected float32, bfloat16 or float16 "
                         f"(a torch.dtype or its name)")
    return resolved


def sampling_params(params) -> SamplingParams:
    """A call's params (None: the defaults); anything else failed later as "'dict' object has no
    attribute 'stop'"."""
    if params is None:
        return SamplingParams()
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params must be a SamplingParams (e.g. SamplingParams(max_new_tokens=64)), "
                        f"got {type(params).__name__}")
    return params


def _token_ids(i: int, prompt) -> list[int]:
    """Prompt i as token ids, or a ValueError saying what it is: int() alone would truncate 1.7 to 1,
    read bytes as ids and fail on a flat id list with "'int' object is not iterable"."""
    if isinstance(prompt, (int, bytes, bytearray)) or not hasattr(prompt, "__iter__"):
        hint = " (one prompt of token ids is a list inside the list: [[1, 2, 3]])" if isinstance(prompt, int) else ""
        raise ValueError(f"prompt {i} is {prompt!r}: each prompt must be a string or a list of token ids{hint}")
    ids = []
    for t in prompt:
        try:
            # ints, numpy ints and 0-d integer tensors; floats raise here, bools (ints to Python) below
            ids.append(operator.index(t))
            ok = not isinstance(t, bool)
        except TypeError:
            ok = False
        if not ok:
            raise ValueError(f"prompt {i} holds {t!r}: a prompt of token ids must hold integers only")
    return ids
