"""One sequence being generated: its tokens, its two KV caches, its stop rule and its randomness."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from .kv_cache import KVCache
from .params import GenerationResult, GenerationStats, SamplingParams
from .target_features import FeatureLog


@dataclass
class StopRule:
    """When to stop, applied identically in every mode: the max_new_tokens budget, EOS (kept in
    the tokens, like transformers' generate) and stop strings (generation ends at the token that
    completes one; the text is cut where the stop string starts)."""

    params: SamplingParams
    eos_ids: frozenset[int]
    tokenizer: object | None

    def decode(self, token_ids: list[int]) -> str | None:
        if self.tokenizer is None:
            return None
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def stop_index(self, text: str) -> int | None:
        hits = [i for i in (text.find(s) for s in self.params.stop) if i >= 0]
        return min(hits) if hits else None


@dataclass
class Sequence:
    index: int  # position of its prompt in the call
    prompt: list[int]
    rule: StopRule
    generator: torch.Generator
    target: KVCache | None = None
    draft: KVCache | None = None
    features: FeatureLog | None = None  # the target's hidden states, when the drafter reads them
    generated: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stats: GenerationStats = field(default_factory=GenerationStats)
    # called on the step thread with (index, tokens kept, finish_reason or None) whenever tokens are
    # committed: a streaming caller's exact view of the sequence (the stop rule has been applied)
    on_tokens: Callable[[int, list[int], str | None], None] | None = None

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.generated

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def length(self) -> int:
        return len(self.prompt) + len(self.generated)

    def pending(self, kv: KVCache) -> list[int]:
        """Tokens that this cache has not seen yet (at least the last token); per step, so without
        building the whole token list (a row's per-step host cost would grow with its length)."""
        start = kv.length - len(self.prompt)
        return self.generated[start:] if start >= 0 else self.prompt[start:] + self.generated

    def append(self, new_tokens: list[int]) -> int:
        """Add accepted tokens, applying the stop rule; returns how many were kept."""
        params = self.rule.params
        kept = 0
        for tok in new_tokens:
            self.generated.append(tok)
            kept += 1
            if tok in self.rule.eos_ids:
                self.finish_reason = "eos"
            elif len(self.generated) >= params.max_new_tokens:
                self.finish_reason = "length"
            if self.done:
                break
        if params.stop and self.rule.tokenizer is not None:
            # a stop string may span several tokens: find the first token whose text completes one
            text = self.rule.decode(self.generated)
            if self.rule.stop_index(text) is not None:
                start = len(self.generated) - kept
                for end in range(max(start, 1), len(self.generated) + 1):
                    if self.rule.stop_index(self.rule.decode(self.generated[:end])) is not None:
                        kept -= len(self.generated) - end
                        del self.generated[end:]
                        self.finish_reason = "stop"
                        break
        self.stats.new_tokens = len(self.generated)
        if self.on_tokens is not None and (kept or self.done):
            self.on_tokens(self.index, self.generated[len(self.generated) - kept:], self.finish_reason)
        return kept

    def result(self) -> GenerationResult:
        text = self.rule.decode(self.generated)
        if text is not None and self.finish_reason == "stop":
            text = text[: self.rule.stop_index(text)]
        return GenerationResult(list(self.generated), text, self.stats, self.finish_reason or "length")
