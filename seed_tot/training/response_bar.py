"""The bar of a trainer's data generation: the target's responses, batch by batch.

A batched engine call returns all its responses at once, so on a CPU the bar of a 1024-prompt run
sat at 0 for the minutes of its first batch, looking stuck. This one says what runs until then
("first batch of 16 running"), then tokens/s beside tqdm's own estimate of the time left, and each
update is a stop point: a Ctrl-C ends the generation there (forward_thread.stop_point)."""
from __future__ import annotations

import time

from tqdm import tqdm


class ResponseBar:
    def __init__(self, total: int, batch: int, desc: str = "target responses"):
        self.bar = tqdm(total=total, desc=desc, unit="response")
        self.bar.set_postfix_str(f"first batch of {min(batch, total)} running: the bar moves once per batch")
        self.tokens, self.start = 0, time.perf_counter()

    def done(self, responses: int, tokens: int = 0) -> None:
        """`responses` more are generated, with `tokens` new tokens among them (0: not counted)."""
        from seed_tot.engine.forward_thread import stop_point

        stop_point()
        self.tokens += tokens
        self.bar.update(responses)
        elapsed = time.perf_counter() - self.start
        self.bar.set_postfix_str(f"{self.tokens / elapsed:.1f} tokens/s" if self.tokens else "")

    def __enter__(self) -> "ResponseBar":
        return self

    def __exit__(self, *exc) -> None:
        self.bar.close()
