"""Text of a choice as its tokens arrive, such that the streamed pieces join to exactly the text of the
finished (non-streamed) answer: the engine's stop rule (sequence.StopRule) cuts the text where a stop
string starts, and a stop string can complete several tokens after it began, so the last
(longest stop - 1) characters are held back until they cannot start one; an incomplete character
(a byte-level tokenizer's U+FFFD) is held back until its next byte comes (vLLM's detokenizer does both)."""
from __future__ import annotations

import json


class IncrementalText:
    def __init__(self, tokenizer, stop: tuple[str, ...]):
        self.tokenizer, self.stop = tokenizer, stop
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.ids: list[int] = []
        self.sent = 0  # characters sent so far

    def add(self, tokens: list[int], engine_finish: str | None) -> str:
        """The new text after `tokens`; engine_finish: the engine's finish reason once the row ended."""
        self.ids += tokens
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if engine_finish is None:
            end = len(text) - self.hold
            while end > self.sent and text[end - 1] == "\ufffd":
                end -= 1
        else:
            if engine_finish == "stop":  # as Sequence.result cuts it
                hits = [i for i in (text.find(s) for s in self.stop) if i >= 0]
                text = text[: min(hits)] if hits else text
            end = len(text)
        if end <= self.sent:
            return ""
        piece, self.sent = text[self.sent:end], end
        return piece


def sse(payload: dict | str) -> str:
    """One server-sent event as OpenAI streams them."""
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


OPENAI_FINISH = {"eos": "stop", "stop": "stop", "length": "length"}
