"""`EndpointEngine`: the search's `GenerationEngine` on any OpenAI-compatible server.

`seed-tot solve --api-base URL` runs the ToT layer (every task, BFS and DFS, results.jsonl, --resume,
the tree page) against a server instead of an engine in this process: `seed-tot serve`, vLLM,
SGLang, llama.cpp's server or a hosted API. It speaks the protocol with the official `openai`
client (the `api` extra), whose retries with backoff cover 429 (honouring Retry-After), 5xx and
dropped connections.

How a search call becomes requests, so that greedy predictions equal the in-process solve's:
- A `Prompt` is a user turn plus an optional start of the assistant's answer. The in-process
  engine renders it with the target tokenizer's chat template (engine.render_prompt); here the
  server does, so "chat" prompts go to /v1/chat/completions as messages, the assistant start as a
  last assistant message the server continues (`continue_final_message`, vLLM's name). A model
  without a chat template renders as user + assistant start in process; "text" prompts send
  exactly that to /v1/completions.
- A run of equal prompts in one call (a step's n thoughts of one state) is one request with n
  choices, seeded `seed + index of its first prompt`: the in-process engine seeds sequence i of a
  call with `seed + i`, and a server that seeds choice j with `seed + j` draws the same samples.
  The call's requests go out at once, so a server that batches (seed-tot serve, vLLM) shares its
  forwards among them as the in-process engine shares them among a call's rows.
- Counters come from each response's `usage`: its completion tokens as `new_tokens`, shared among
  the n choices (the protocol counts tokens per request, not per choice), its prompt tokens as
  `target_prefill_tokens`, and the request's time as `wall_s`. Drafting counters stay zero: the
  protocol does not carry them (a seed-tot server shows them on its /metrics page).
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Sequence

from seed_tot.engine.decode_spec import DecodeSpec
from seed_tot.engine.params import GenerationResult, GenerationStats, SamplingParams

log = logging.getLogger(__name__)

PROMPT_FORMATS = ("chat", "text")
DEFAULT_KEY_ENV = "OPENAI_API_KEY"
# a server without authentication (seed-tot serve, a local vLLM) still needs the client to hold a key
NO_KEY = "EMPTY"
# a chat prompt's rendering here: its two parts, as JSON behind this tag (a value, so node_work's
# matching of re-rendered prompts and equal-prompt grouping work on it as on rendered text)
_CHAT_TAG = "\x00chat:"


class EndpointError(RuntimeError):
    """The endpoint cannot be reached, or refused a request: one line naming the URL and the reason."""


@dataclass(frozen=True)
class EndpointConfig:
    """Where the requests go and how they are shaped.

    base_url: the server's OpenAI base URL (e.g. http://127.0.0.1:8000/v1). model: the name
    requests carry (None: the only one /v1/models lists). api_key_env: the environment variable
    holding the key, never the key itself (so that run.json and logs cannot leak it). decoding: the
    DecodeSpec fields sent with every request as extra body fields (seed-tot serve decodes with
    them; None sends none and the server decodes as it was started). max_in_flight: requests in
    flight at once, over every call of every thread."""

    base_url: str
    model: str | None = None
    api_key_env: str = DEFAULT_KEY_ENV
    prompt_format: str = "chat"
    decoding: tuple[str, ...] | None = None
    max_retries: int = 5
    timeout_s: float = 600.0
    max_in_flight: int = 64

    def __post_init__(self) -> None:
        if not isinstance(self.base_url, str) or not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"--api-base must be an http:// or https:// URL (e.g. http://127.0.0.1:8000/v1), "
                             f"got {self.base_url!r}")
        if self.prompt_format not in PROMPT_FORMATS:
            raise ValueError(f"prompt format must be one of {', '.join(PROMPT_FORMATS)}, got {self.prompt_format!r}")
        if self.max_in_flight < 1 or self.max_retries < 0 or self.timeout_s <= 0:
            raise ValueError("max_in_flight >= 1, max_retries >= 0 and timeout_s > 0 are required")


@dataclass
class _Request:
    """One request: a run of equal prompts of a call (its first index and how many)."""

    prompt: str
    start: int
    n: int
    results: list[GenerationResult] = field(default_factory=list)


def _import_openai():
    try:
        import openai
    except ImportError:
        raise EndpointError("--api-base needs the openai package: pip install 'seed-tot[api]' "
                            "(or pip install 'openai>=1.0')") from None
    return openai


class EndpointEngine:
    """A `GenerationEngine` (search/llm.py) whose calls are requests to an OpenAI-compatible server.

    `generate` may be called from several threads at once (solve --concurrency): every request runs
    on one event loop in a thread of its own, through one client and its connection pool. Use it
    as a context manager, or call `close`."""

    def __init__(self, config: EndpointConfig):
        self.config = config
        self._openai = _import_openai()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="endpoint-loop", daemon=True)
        self._thread.start()
        self._client = None
        try:
            self._client = self._run(self._make_client())
            self.target_name = self._run(self._resolve_model())
        except BaseException:
            self.close()  # no loop thread or connection left behind by a server that cannot be used
            raise
        self._counters_start = server_counters(config.base_url)  # None: not a server that shows seed-tot's
        log.info("endpoint %s serves %s (%s prompts)", config.base_url, self.target_name, config.prompt_format)

    # ------------------------------------------------------------------ the GenerationEngine seam
    def render_prompt(self, user: str, assistant_prefix: str = "") -> str:
        if self.config.prompt_format == "text":
            return user + assistant_prefix  # what the in-process engine renders for a model without a template
        return _CHAT_TAG + json.dumps([user, assistant_prefix], ensure_ascii=False)

    def generate(self, prompts: list[str], params: SamplingParams, *, spec: DecodeSpec | None = None
                 ) -> list[GenerationResult]:
        """One result per prompt, in order; equal neighbouring prompts are one request with n choices."""
        if not prompts:
            return []
        requests: list[_Request] = []
        for i, prompt in enumerate(prompts):
            if requests and requests[-1].prompt == prompt:
                requests[-1].n += 1
            else:
                requests.append(_Request(prompt, i, 1))
        extra = self._decoding_body(spec)
        self._run(self._send_all(requests, params, extra))
        return [result for request in requests for result in request.results]

    # ------------------------------------------------------------------ what a run records
    @property
    def endpoint_identity(self) -> dict[str, Any]:
        """run.json's and summary.json's "endpoint": where the run's calls went (the key stays out)."""
        c = self.config
        return {"base_url": c.base_url, "model": self.target_name, "prompt_format": c.prompt_format,
                "decoding_sent": list(c.decoding) if c.decoding is not None else None}

    def server_work(self) -> dict[str, float] | None:
        """What a seed-tot server's /metrics counted since this engine connected: its forwards, rows
        and drafts, which `usage` does not carry. Everything the server did in that time, so other
        clients' requests too; None for a server without seed-tot's counters."""
        start, now = self._counters_start, server_counters(self.config.base_url)
        if start is None or now is None:
            return None
        work = {name: now[name] - start.get(name, 0.0) for name in _WORK_COUNTERS if name in now}
        forwards, offered = work.get("target_forwards_total", 0.0), work.get("draft_tokens_offered_total", 0.0)
        work["rows_per_target_forward"] = work.get("target_rows_total", 0.0) / forwards if forwards else 0.0
        work["acceptance_rate"] = work.get("draft_tokens_accepted_total", 0.0) / offered if offered else 0.0
        return work

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            if self._client is not None:
                self._run(self._client.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()

    def __enter__(self) -> "EndpointEngine":
        return self

    def __exit__(self, *exc: Any) -> bool:
        self.close()
        return False

    # ------------------------------------------------------------------ requests
    def _run(self, coroutine):
        """Run a coroutine on the loop thread and wait for it (from any thread but that one). Interrupted
        (Ctrl-C), it is cancelled: its requests' connections close, and a server that watches for
        that (seed-tot serve) stops their rows instead of decoding them for no one."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    async def _make_client(self):
        c = self.config
        key = os.environ.get(c.api_key_env) or NO_KEY
        self._limit = asyncio.Semaphore(c.max_in_flight)
        return self._openai.AsyncOpenAI(base_url=c.base_url, api_key=key, max_retries=c.max_retries,
                                        timeout=c.timeout_s)

    async def _resolve_model(self) -> str:
        """The model the requests name: checked against /v1/models when the server lists it, so a wrong
        name or URL fails here, before a run writes anything (one retry: a bad URL fails fast)."""
        c = self.config
        try:
            listed = [m.id async for m in self._client.with_options(max_retries=1).models.list()]
        except self._openai.APIStatusError as err:
            if c.model is not None and err.status_code == 404:  # a server without /v1/models
                log.warning("%s has no /v1/models; using model %r unchecked", c.base_url, c.model)
                return c.model
            raise EndpointError(self._describe(err, "GET /models")) from None
        except self._openai.APIError as err:
            raise EndpointError(self._describe(err, "GET /models")) from None
        if c.model is None:
            if len(listed) != 1:
                raise EndpointError(f"{c.base_url} serves {len(listed)} models ({', '.join(listed) or 'none'}): "
                                    f"name one with --api-model")
            return listed[0]
        if c.model not in listed:
            raise EndpointError(f"{c.base_url} does not serve model {c.model!r}; it serves {', '.join(listed) or 'none'}")
        return c.model

    def _decoding_body(self, spec: DecodeSpec | None) -> dict[str, Any]:
        if self.config.decoding is None or spec is None:
            return {}
        values = spec.to_dict()
        return {name: values[name] for name in self.config.decoding if values.get(name) is not None}

    async def _send_all(self, requests: Sequence[_Request], params: SamplingParams, extra: dict[str, Any]) -> None:
        tasks = [asyncio.ensure_future(self._send(r, params, extra)) for r in requests]
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:  # one failed request ends the call: the others are not left running
                task.cancel()
            raise

    async def _send(self, request: _Request, params: SamplingParams, extra: dict[str, Any]) -> None:
        c = self.config
        body: dict[str, Any] = dict(model=self.target_name, n=request.n, max_tokens=params.max_new_tokens,
                                    temperature=params.temperature, seed=params.seed + request.start)
        if params.stop:
            body["stop"] = list(params.stop)
        if params.top_p != 1.0:
            body["top_p"] = params.top_p
        extra = dict(extra)
        if params.top_k:
            extra["top_k"] = params.top_k  # vLLM's name; OpenAI has none
        async with self._limit:
            start = time.perf_counter()
            try:
                if request.prompt.startswith(_CHAT_TAG):
                    what = "POST /chat/completions"
                    user, prefix = json.loads(request.prompt[len(_CHAT_TAG):])
                    messages = [{"role": "user", "content": user}]
                    if prefix:  # the assistant's answer so far, continued rather than answered anew
                        messages.append({"role": "assistant", "content": prefix})
                        extra.update(add_generation_prompt=False, continue_final_message=True)
                    response = await self._client.chat.completions.create(messages=messages, extra_body=extra or None,
                                                                          **body)
                    texts = [(ch.index, ch.message.content or "", ch.finish_reason) for ch in response.choices]
                else:
                    what = "POST /completions"
                    response = await self._client.completions.create(prompt=request.prompt, extra_body=extra or None,
                                                                     **body)
                    texts = [(ch.index, ch.text or "", ch.finish_reason) for ch in response.choices]
            except self._openai.APIError as err:
                raise EndpointError(self._describe(err, what)) from None
            wall = time.perf_counter() - start
        if len(texts) != request.n:
            raise EndpointError(f"{c.base_url}: {what} asked for n={request.n} choices, got {len(texts)}")
        texts.sort(key=lambda t: t[0])
        usage = response.usage
        completion = usage.completion_tokens if usage is not None else 0
        prompt_tokens = usage.prompt_tokens if usage is not None else 0
        request.results = [GenerationResult(token_ids=[], text=text, finish_reason=_finish(reason),
                                            stats=_stats(completion, prompt_tokens, request.n, j, wall))
                           for j, (_, text, reason) in enumerate(texts)]

    def _describe(self, err: Exception, what: str) -> str:
        """One line: the URL, the request, and the server's own message where it sent one."""
        status = getattr(err, "status_code", None)
        if status is None:  # never reached the server, or no answer in time
            return f"cannot reach {self.config.base_url} ({what}): {err}"
        message = err.message if isinstance(getattr(err, "message", None), str) else str(err)
        body = getattr(err, "body", None)
        if isinstance(body, dict):  # the OpenAI error object: {"message", "type", "param", "code"}
            inner = body.get("error", body)
            if isinstance(inner, dict) and isinstance(inner.get("message"), str):
                message = inner["message"]
        hint = ""
        if what.endswith("chat/completions") and "template" in message.lower():
            hint = " (a model without a chat template takes --api-prompt text)"
        return f"{self.config.base_url} refused {what} with {status}: {message}{hint}"


# seed-tot serve's /metrics counters a run reports the change of (metric names without "seed_tot_")
_WORK_COUNTERS = ("requests_finished_total", "prompt_tokens_total", "completion_tokens_total", "target_forwards_total",
                  "target_prefills_total", "target_rows_total", "draft_forwards_total", "draft_tokens_offered_total",
                  "draft_tokens_accepted_total", "target_busy_seconds_total")


def server_counters(base_url: str) -> dict[str, float] | None:
    """seed-tot serve's /metrics (beside /v1) as name -> value, without the "seed_tot_" prefix; None
    where the server has no such page or it holds none of seed-tot's counters (vLLM's has its own)."""
    root = base_url.rstrip("/").removesuffix("/v1")
    try:
        with urllib.request.urlopen(root + "/metrics", timeout=5) as response:
            text = response.read().decode("utf-8", "replace")
    except (OSError, ValueError):
        return None
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name.startswith("seed_tot_"):
            try:
                values[name.removeprefix("seed_tot_")] = float(value)
            except ValueError:
                continue
    return values or None


def _finish(reason: str | None) -> str:
    """The engine's names: OpenAI's "stop" covers both a stop string and EOS."""
    return {"length": "length"}.get(reason or "", "stop")


def _stats(completion_tokens: int, prompt_tokens: int, n: int, j: int, wall_s: float) -> GenerationStats:
    """Choice j's share of a request's usage: the tokens split so that the choices sum to the
    request's counts exactly (the protocol reports them per request), the wall time the request's."""
    new = completion_tokens // n + (j < completion_tokens % n)
    prefill = prompt_tokens if j == 0 else 0  # n choices share one scoring of their prompt
    return GenerationStats(new_tokens=new, target_prefill_tokens=float(prefill), wall_s=wall_s)
