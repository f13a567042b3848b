"""The name under which a transformers module takes and returns its KV cache.

transformers 5.x renamed the `past_key_values` argument and output field to `cache`: the old
name still works but warns on every forward (a FutureWarning in the middle of every progress
bar) and goes away in 5.40; releases before the rename know only `past_key_values`. So every
forward the engine runs passes its cache under the name that module's own signature
declares, read once per class, and our own modules (the ParallelSpec drafter, the synthetic
oracle) take it under either name.
"""
from __future__ import annotations

import functools
import inspect
from typing import Any


@functools.cache
def _cache_keyword(cls: type) -> str:
    # inspect.signature follows the __wrapped__ that transformers' deprecate_kwarg decorator leaves
    params = inspect.signature(cls.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def cache_kwargs(module, cache) -> dict[str, Any]:
    """`{name: cache}` for `module(..., **cache_kwargs(module, cache))`."""
    return {_cache_keyword(type(module)): cache}


def output_field(output_cls: type) -> str:
    """The field of a transformers ModelOutput class that holds the returned cache."""
    return "cache" if "cache" in getattr(output_cls, "__dataclass_fields__", {}) else "past_key_values"


def returned_cache(output):
    """The cache a transformers forward returned, read without touching a deprecated alias."""
    return getattr(output, output_field(type(output)), None)


def either_cache(cache, past_key_values):
    """One cache from a forward that takes both names (our own modules); both at once is a caller bug."""
    if cache is not None and past_key_values is not None:
        raise ValueError("pass the KV cache as `cache` or as `past_key_values`, not both")
    return cache if cache is not None else past_key_values
