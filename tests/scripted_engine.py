"""A fake engine for the search tests: replies come from a script, every call is recorded."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable

from seed_tot.engine.decode_spec import DecodeSpec
from seed_tot.engine.params import GenerationResult, GenerationStats, SamplingParams

# respond(user_message, copy_index) -> reply; copy_index counts earlier identical prompts of the
# same call, so n samples of one prompt can be scripted to differ.
Responder = Callable[[str, int], str]


@dataclass
class RecordedCall:
    prompts: list[str]
    params: SamplingParams
    spec: DecodeSpec


class ScriptedEngine:
    def __init__(self, respond: Responder):
        self.respond = respond
        self.calls: list[RecordedCall] = []

    def render_prompt(self, user: str, assistant_prefix: str = "") -> str:
        return f"<user>{user}</user><assistant>{assistant_prefix}"

    @staticmethod
    def user_of(rendered: str) -> str:
        return rendered.removeprefix("<user>").split("</user>")[0]

    def generate(self, prompts: list[str], params: SamplingParams, *, spec: DecodeSpec) -> list[GenerationResult]:
        if not prompts:
            raise ValueError("prompts is empty")  # like the real engine
        self.calls.append(RecordedCall(list(prompts), params, spec))
        copies: Counter[str] = Counter()
        results = []
        for prompt in prompts:
            text = self.respond(self.user_of(prompt), copies[prompt])
            copies[prompt] += 1
            n = max(1, len(text.split()))
            # fixed rates so summaries are checkable: acceptance 0.5, 2 tokens per target forward
            stats = GenerationStats(new_tokens=2 * n, drafted=2 * n, draft_depth=2 * n, accepted=n,
                                    verifications=n, target_forwards=n, draft_forwards=2 * n, wall_s=0.01)
            results.append(GenerationResult(token_ids=list(range(2 * n)), text=text, stats=stats,
                                            finish_reason="stop"))
        return results
