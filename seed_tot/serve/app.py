"""The routes of `seed-tot serve`: OpenAI's /v1/models, /v1/completions, /v1/chat/completions, plus
/health and /metrics. Each request becomes one `Job` (its distinct prompts, n, sampling params and
decoding spec, all checked before any forward), whose prompts x n rows are one engine call."""
from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, StreamingResponse

from seed_tot.engine.decode_spec import DecodeSpec
from seed_tot.engine.params import GenerationResult, GenerationStats, SamplingParams

from .errors import APIError, bad_request, install_handlers
from .protocol import (MAX_N, AssistantMessage, ChatChoice, ChatCompletionRequest, ChatCompletionResponse, ChoiceLogprobs,
                       CompletionChoice, CompletionLogprobs, CompletionRequest, CompletionResponse, ModelCard,
                       ModelList, SamplingFields, TokenLogprob, TopLogprob, Usage, now, request_id)
from .runner import EngineRunner, TokenScores
from .streaming import OPENAI_FINISH, IncrementalText, sse

log = logging.getLogger(__name__)

DEFAULT_CHAT_MAX_TOKENS = 256  # a chat request that names no limit: this, or what the context leaves


@dataclass
class Job:
    """One request, checked: `prompts` are its distinct prompts, each generated `n` times (one engine
    call of len(prompts) * n rows, choice i being row i)."""

    prompts: list[list[int]]
    prompt_texts: list[str]
    n: int
    params: SamplingParams | None  # None: max_tokens 0, nothing to generate
    spec: DecodeSpec
    logprobs: int | None  # top alternatives per token; None: no log-probabilities
    echo: bool = False

    @property
    def rows(self) -> list[list[int]]:
        return [p for p in self.prompts for _ in range(self.n)]

    def usage(self, results: list[GenerationResult]) -> Usage:
        prompt = sum(len(p) for p in self.prompts)
        completion = sum(len(r.token_ids) for r in results)
        return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


class Server:
    """The app's state: one engine runner, the served model's name and its tokenizer."""

    def __init__(self, runner: EngineRunner, model_name: str):
        self.runner, self.model_name = runner, model_name
        self.engine = runner.engine
        self.tokenizer = self.engine.tokenizer

    # ------------------------------------------------------------------ checking a request
    def _common(self, req: SamplingFields) -> DecodeSpec:
        if req.model != self.model_name:
            raise APIError(404, f"model {req.model!r} is not served here; this server serves {self.model_name!r} "
                                f"(GET /v1/models)", "model", code="model_not_found")
        field = req.unsupported()
        if field is not None:
            raise bad_request(f"{field}={getattr(req, field)!r} is not supported by this server (it would change the "
                              f"output); leave it out or at its neutral value", field)
        return self.runner.decode_spec(req.decode_changes())

    def _params(self, req: SamplingFields, max_tokens: int) -> SamplingParams:
        stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
        if any(not s for s in stop):
            raise bad_request("stop strings must be non-empty", "stop")
        temperature = 1.0 if req.temperature is None else req.temperature
        seed = random.randrange(2 ** 31) if req.seed is None else req.seed
        try:
            return SamplingParams(max_new_tokens=max_tokens, temperature=temperature,
                                  top_k=max(0, req.top_k or 0), top_p=1.0 if req.top_p is None else req.top_p,
                                  stop=stop, seed=seed, draft_invariant=req.draft_invariant)
        except ValueError as err:
            raise bad_request(str(err), str(err).split(" ", 1)[0]) from None

    def _check_length(self, prompts: list[list[int]], max_tokens: int, prompt_field: str, max_field: str) -> None:
        limit = self.runner.context_length
        if limit is None:
            return
        longest = max(len(p) for p in prompts)
        if longest > limit:
            raise bad_request(f"the prompt has {longest} tokens, past the model's context of {limit}", prompt_field)
        if longest + max_tokens > limit:
            raise bad_request(f"{max_field}={max_tokens} with a prompt of {longest} tokens needs {longest + max_tokens} "
                              f"positions, past the model's context of {limit}; lower {max_field}", max_field)

    def _encode(self, prompts, field: str) -> list[list[int]]:
        try:
            return self.engine.encode(prompts)
        except ValueError as err:
            raise bad_request(str(err), field) from None

    def completion_job(self, req: CompletionRequest) -> Job:
        spec = self._common(req)
        prompt = req.prompt
        if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
            prompt = [prompt]
        if not prompt:
            raise bad_request("prompt is empty: give a string, a list of strings or token ids", "prompt")
        if len(prompt) * req.n > MAX_N:  # every row holds KV: a request's memory stays bounded
            raise bad_request(f"{len(prompt)} prompts x n={req.n} is {len(prompt) * req.n} choices; at most {MAX_N} "
                              f"per request", "prompt")
        prompts = self._encode(list(prompt), "prompt")
        texts = [p if isinstance(p, str) else self.tokenizer.decode(p) for p in prompt]
        max_tokens = 16 if req.max_tokens is None else req.max_tokens
        self._check_length(prompts, max_tokens, "prompt", "max_tokens")
        params = self._params(req, max_tokens) if max_tokens > 0 else None
        return Job(prompts, texts, req.n, params, spec, req.logprobs, req.echo)

    def chat_job(self, req: ChatCompletionRequest) -> Job:
        spec = self._common(req)
        if req.top_logprobs and not req.logprobs:
            raise bad_request("top_logprobs needs logprobs: true", "top_logprobs")
        if req.continue_final_message and req.messages[-1].role != "assistant":
            raise bad_request("continue_final_message needs the last message to be the assistant's",
                              "continue_final_message")
        if not getattr(self.tokenizer, "chat_template", None):
            raise bad_request(f"{self.model_name}'s tokenizer has no chat template: use /v1/completions", "messages")
        messages = [{"role": m.role, "content": m.text(), **({"name": m.name} if m.name else {})} for m in req.messages]
        try:
            text = self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=req.add_generation_prompt and not req.continue_final_message,
                continue_final_message=req.continue_final_message)
        except Exception as err:  # noqa: BLE001 - a template's own check (jinja raise_exception) refuses the messages
            raise bad_request(f"the chat template refused the messages: {err}", "messages") from None
        prompts = self._encode([text], "messages")
        limit = self.runner.context_length
        max_tokens = req.max_completion_tokens or req.max_tokens
        if max_tokens is None:
            room = DEFAULT_CHAT_MAX_TOKENS if limit is None else limit - len(prompts[0])
            max_tokens = max(1, min(DEFAULT_CHAT_MAX_TOKENS, room))
        field = "max_completion_tokens" if req.max_completion_tokens else "max_tokens"
        self._check_length(prompts, max_tokens, "messages", field)
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        return Job(prompts, [text], req.n, self._params(req, max_tokens), spec, logprobs)

    # ------------------------------------------------------------------ running a job
    async def prepare(self, job: Job) -> None:
        if job.params is not None:
            await self.runner.prepare(job.params, job.spec)

    async def run(self, job: Job, on_tokens=None) -> list[GenerationResult]:
        if job.params is None:  # max_tokens 0: the prompt alone (echo + logprobs scores it)
            return [GenerationResult([], "", GenerationStats(), "length") for _ in job.rows]
        return await self.runner.generate(job.rows, job.params, job.spec, sum(len(p) for p in job.prompts), on_tokens)

    async def scores(self, job: Job, results: list[GenerationResult]) -> list[TokenScores | None]:
        if job.logprobs is None:
            return [None] * len(results)
        return await self.runner.score([row + r.token_ids for row, r in zip(job.rows, results)], job.logprobs)

    def token_text(self, token: int) -> str:
        return self.tokenizer.decode([token], skip_special_tokens=False)

    def completion_logprobs(self, job: Job, row: list[int], result: GenerationResult, scores: TokenScores,
                            offset: int) -> CompletionLogprobs:
        """The legacy shape; with echo, the prompt's tokens first (its first token has no log-probability)."""
        out = CompletionLogprobs()
        first = 0 if job.echo else len(row)
        tokens = (row + result.token_ids)[first:]
        for k, token in enumerate(tokens, start=first):
            text = self.token_text(token)
            out.tokens.append(text)
            out.text_offset.append(offset)
            offset += len(text)
            if k == 0:
                out.token_logprobs.append(None)
                out.top_logprobs.append(None)
                continue
            out.token_logprobs.append(scores.logprobs[k - 1])
            out.top_logprobs.append({self.token_text(t): lp for t, lp in scores.top[k - 1]} if job.logprobs else None)
        return out

    def chat_logprobs(self, row: list[int], result: GenerationResult, scores: TokenScores) -> ChoiceLogprobs:
        content = []
        for j, token in enumerate(result.token_ids):
            k = len(row) + j - 1  # the score of the token at position len(row) + j
            top = [TopLogprob(token=(t := self.token_text(i)), logprob=lp, bytes=list(t.encode()))
                   for i, lp in scores.top[k]]
            text = self.token_text(token)
            content.append(TokenLogprob(token=text, logprob=scores.logprobs[k], bytes=list(text.encode()),
                                        top_logprobs=top))
        return ChoiceLogprobs(content=content)


async def _until_disconnected(request: Request, work):
    """`work`'s result, or its task cancelled when the client goes away first (so a dropped non-streamed
    request stops its rows at the engine's next step, as a closed stream does)."""
    task = asyncio.ensure_future(work)

    async def gone():
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(gone())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
    return task.result()  # CancelledError when the client left: nobody reads the answer


def _include_usage(req: SamplingFields) -> bool:
    return bool(req.stream_options and req.stream_options.include_usage)


async def _answer(server: Server, job: Job, request: Request):
    """A non-streamed job's results and log-probabilities, once it has a place in the queue."""
    async with server.runner.admitted():
        results = await _until_disconnected(request, server.run(job))
        scores = await server.scores(job, results)
    server.runner.metrics.finished += 1
    return results, scores


def build_app(server: Server) -> FastAPI:
    app = FastAPI(title="seed-tot", docs_url=None, redoc_url=None)
    install_handlers(app)
    runner = server.runner

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return ModelList(data=[ModelCard(id=server.model_name, created=now(), max_model_len=runner.context_length)])

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(runner.metrics.render(runner.engine_gauges()),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        job = server.completion_job(req)
        await server.prepare(job)
        if req.stream:
            return await _stream(server, job, chat=False, include_usage=_include_usage(req))
        results, scores = await _answer(server, job, request)
        choices = []
        for i, (row, result, score) in enumerate(zip(job.rows, results, scores)):
            prompt_text = job.prompt_texts[i // job.n]
            logprobs = (server.completion_logprobs(job, row, result, score, 0 if job.echo else len(prompt_text))
                        if score is not None else None)
            choices.append(CompletionChoice(index=i, text=(prompt_text if job.echo else "") + result.text,
                                            logprobs=logprobs, finish_reason=OPENAI_FINISH[result.finish_reason],
                                            stats=result.stats.to_dict()))
        return CompletionResponse(id=request_id("cmpl"), created=now(), model=server.model_name, choices=choices,
                                  usage=job.usage(results))

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest, request: Request):
        job = server.chat_job(req)
        await server.prepare(job)
        if req.stream:
            return await _stream(server, job, chat=True, include_usage=_include_usage(req))
        results, scores = await _answer(server, job, request)
        choices = [ChatChoice(index=i, message=AssistantMessage(content=result.text),
                              logprobs=server.chat_logprobs(row, result, score) if score is not None else None,
                              finish_reason=OPENAI_FINISH[result.finish_reason], stats=result.stats.to_dict())
                   for i, (row, result, score) in enumerate(zip(job.rows, results, scores))]
        return ChatCompletionResponse(id=request_id("chatcmpl"), created=now(), model=server.model_name,
                                      choices=choices, usage=job.usage(results))

    return app


async def _stream(server: Server, job: Job, chat: bool, include_usage: bool) -> StreamingResponse:
    """Server-sent events: each choice's text as its tokens are committed (with logprobs: whole, once the
    choice is scored), then its finish_reason, the usage chunk if asked, and `data: [DONE]`. A full
    queue is a 429 before the response starts; the place is taken inside the stream, so that it is
    given back however the stream ends, even one whose client left before its first byte. Closing the
    stream cancels the engine call."""
    runner = server.runner
    runner.check_room()
    rid, created = request_id("chatcmpl" if chat else "cmpl"), now()
    loop = asyncio.get_running_loop()
    events: asyncio.Queue = asyncio.Queue()

    def on_tokens(index: int, tokens: list[int], finish: str | None) -> None:  # the engine's step thread
        loop.call_soon_threadsafe(events.put_nowait, (index, tokens, finish))

    def chunk(index: int, text: str | None, finish: str | None = None, logprobs=None, role: bool = False) -> str:
        if chat:
            delta = {"role": "assistant", "content": ""} if role else ({} if text is None else {"content": text})
            choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
            return sse({"id": rid, "object": "chat.completion.chunk", "created": created, "model": server.model_name,
                        "choices": [choice]})
        choice = {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish}
        return sse({"id": rid, "object": "text_completion", "created": created, "model": server.model_name,
                    "choices": [choice]})

    async def pieces(task):
        rows = job.rows
        texts = [IncrementalText(server.tokenizer, job.params.stop if job.params else ()) for _ in rows]
        for i in range(len(rows)):
            if chat:
                yield chunk(i, None, role=True)
            elif job.echo:
                yield chunk(i, job.prompt_texts[i // job.n])
        while (event := await events.get()) is not None:
            index, tokens, finish = event
            piece = texts[index].add(tokens, finish)
            if job.logprobs is None and piece:
                yield chunk(index, piece)
            if finish is not None and job.logprobs is None:
                yield chunk(index, None if chat else "", OPENAI_FINISH[finish])
        results = task.result()  # a failed call raises here, after the choices that finished
        if job.logprobs is not None:  # each choice whole, with its log-probabilities
            for i, (row, result, score) in enumerate(zip(rows, results, await server.scores(job, results))):
                if chat:
                    logprobs = server.chat_logprobs(row, result, score).model_dump()
                else:
                    offset = 0 if job.echo else len(job.prompt_texts[i // job.n])
                    logprobs = server.completion_logprobs(job, row, result, score, offset).model_dump()
                yield chunk(i, result.text, OPENAI_FINISH[result.finish_reason], logprobs)
        elif job.params is None:  # max_tokens 0: no tokens, so no events
            for i in range(len(rows)):
                yield chunk(i, None if chat else "", "length")
        if include_usage:
            yield sse({"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                       "created": created, "model": server.model_name, "choices": [],
                       "usage": job.usage(results).model_dump()})
        runner.metrics.finished += 1
        yield sse("[DONE]")

    async def body():
        try:
            async with runner.admitted():
                task = asyncio.ensure_future(server.run(job, on_tokens))
                task.add_done_callback(lambda _: events.put_nowait(None))
                try:
                    async for piece in pieces(task):
                        yield piece
                finally:  # the client closed the stream (this generator is closed) or it ended
                    if not task.done():
                        task.cancel()
        except APIError as err:
            yield sse(err.body())
            yield sse("[DONE]")
        except Exception as err:  # noqa: BLE001 - the headers are sent: the stream's last event says what failed
            log.exception("streamed request failed")
            yield sse(APIError(500, f"internal error: {type(err).__name__}: {err}", None, type_="server_error",
                               code="internal_error").body())
            yield sse("[DONE]")

    return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

