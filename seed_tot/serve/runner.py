"""The bridge between HTTP requests and the one engine: admission (a bounded queue), the call itself
(every request's rows go to `Engine.agenerate`, so the engine's one step loop batches the rows of all
concurrent requests and the n choices of each), cancellation, and the target's log-probabilities.

Log-probabilities, as OpenAI and vLLM define them (vLLM's default `raw_logprobs`): the target's
log-softmax of its raw logits at temperature 1, whatever the request's temperature, top_p or top_k,
over the tokens the engine samples from (`Engine.vocab_size`). They come from one target forward over
prompt + completion after the call: the verification forwards of a speculative round score drafts,
not always the committed token (a resampled token was never scored as a draft), so reading them there
would be neither simpler nor exact in every mode, while this forward is the target's own distribution
by definition."""
from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

import torch

from seed_tot.engine.decode_spec import DecodeSpec, DecodeSpecError
from seed_tot.engine.params import GenerationResult, SamplingParams

from .errors import APIError, bad_request
from .metrics import ServerMetrics

log = logging.getLogger(__name__)


@dataclass
class TokenScores:
    """Per scored token: its log-probability and the `top` likeliest tokens' (id, log-probability)."""

    logprobs: list[float]
    top: list[list[tuple[int, float]]]


class EngineRunner:
    def __init__(self, engine, spec: DecodeSpec, max_running: int, max_waiting: int):
        self.engine = engine
        self.spec = spec
        self.max_running, self.max_waiting = max_running, max_waiting
        self.metrics = ServerMetrics()
        self._places: asyncio.Semaphore | None = None  # made in the server's event loop

    @property
    def context_length(self) -> int | None:
        """Positions the target takes: its config's max_position_embeddings (None: not stated)."""
        return getattr(self.engine.target.config, "max_position_embeddings", None)

    def decode_spec(self, changes: dict) -> DecodeSpec:
        """The server's spec with a request's settings, checked by DecodeSpec (400 naming the setting)."""
        try:
            return self.spec.replace(**changes)
        except DecodeSpecError as err:
            raise bad_request(str(err), err.setting) from None

    @contextlib.asynccontextmanager
    async def admitted(self):
        """A place among --max-running requests, queueing behind at most --max-waiting others; past
        those, 429 with Retry-After, so memory stays bounded however many clients call."""
        metrics = self.metrics
        if self._places is None:
            self._places = asyncio.Semaphore(self.max_running)
        if self._places.locked() and metrics.waiting >= self.max_waiting:
            metrics.rejected += 1
            raise APIError(429, f"the server is busy: {metrics.running} requests running and {metrics.waiting} "
                                f"waiting (--max-running {self.max_running}, --max-waiting {self.max_waiting}); "
                                f"retry later", None, type_="rate_limit_error", code="queue_full",
                           headers={"Retry-After": "1"})
        metrics.waiting += 1
        try:
            await self._places.acquire()
        finally:
            metrics.waiting -= 1
        metrics.running += 1
        try:
            yield
        finally:
            metrics.running -= 1
            self._places.release()

    async def generate(self, rows: list[list[int]], params: SamplingParams, spec: DecodeSpec,
                       on_tokens=None) -> list[GenerationResult]:
        """One engine call for every row of a request (its prompts times n). Cancelling the awaiting
        task cancels the call: its rows leave at the engine's next step and their KV slots are freed."""
        self.metrics.add_prompt_tokens(sum(len(row) for row in rows))
        try:
            # the call's draft policy first, in a worker thread: building one may calibrate (seconds of
            # forwards), which inside agenerate's submission would stall every other request's I/O
            await asyncio.to_thread(self.engine.policy, spec.mode, spec.k_config, params, spec.draft_policy,
                                    spec.options)
            results = await self.engine.agenerate(rows, params, spec=spec, on_tokens=on_tokens)
        except asyncio.CancelledError:
            self.metrics.cancelled += 1
            raise
        except DecodeSpecError as err:
            raise bad_request(str(err), err.setting) from None
        except ValueError as err:  # refused before any forward (context, policy options, attention)
            raise bad_request(str(err)) from None
        self.metrics.add_results(results)
        return results

    async def score(self, sequences: list[list[int]], top: int) -> list[TokenScores]:
        """For each sequence, the target's log-probability of each token after the first given those
        before it, and its `top` likeliest alternatives: one forward per sequence, on the engine's
        forward thread, between the step loop's steps."""
        return await asyncio.to_thread(self.engine.on_forward_thread, self._score, sequences, top)

    @torch.inference_mode()
    def _score(self, sequences: list[list[int]], top: int) -> list[TokenScores]:
        model, vocab = self.engine.target, self.engine.vocab_size
        out = []
        for ids in sequences:
            if len(ids) < 2:
                out.append(TokenScores([], []))
                continue
            tokens = torch.tensor([ids], device=model.device)
            logits = model(input_ids=tokens, use_cache=False).logits[0, :-1, :vocab].float()
            logprobs = torch.log_softmax(logits, dim=-1)
            chosen = logprobs.gather(1, tokens[0, 1:, None])[:, 0].tolist()
            alternatives = [[] for _ in chosen]
            if top:
                values, indices = logprobs.topk(min(top, vocab), dim=-1)
                alternatives = [list(zip(i, v)) for i, v in zip(indices.tolist(), values.tolist())]
            out.append(TokenScores(chosen, alternatives))
        return out

    def engine_gauges(self) -> dict[str, tuple[str, float]]:
        """What the engine holds now: calls in its step loop and the target's KV pool lines (one per row
        and per kept prompt stretch) and slots, after freeing what finished rows let go."""
        pool = self.engine.target_runtime.pool
        pool.collect()
        return {
            "engine_calls_active": ("Engine calls (requests) in the step loop.", self.engine.scheduler.active_calls),
            "kv_lines_used": ("Target KV pool lines held (rows and kept prompt stretches).",
                              pool.table.shape[0] - len(pool.free_lines)),
            "kv_slots_used": ("Target KV pool slots held.", max(0, pool.capacity - pool.n_free - 1)),
        }
