"""The OpenAI-compatible request and response bodies of `seed-tot serve`, in vLLM's style: one pydantic
model per body, OpenAI's names and meanings, vLLM's extra sampling names (`top_k`, `seed`) and this
engine's decoding settings under the command line's names (`mode`, `k_config`, ...).

Fields that would change the output and that the engine does not implement (penalties, logit_bias,
best_of, tools, ...) are declared so that a non-default value is refused naming the field
(`unsupported`), where an unknown field is ignored as OpenAI and vLLM ignore it."""
from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_N = 128  # choices per request, and rows (prompts x n): ToT samples up to 20 thoughts per call
MAX_LOGPROBS = 20  # OpenAI's bound on top_logprobs / logprobs


class StreamOptions(BaseModel):
    include_usage: bool = False


class DecodeSettings(BaseModel):
    """The engine's decoding settings, as the CLI names them; None: the server's flag."""

    mode: str | None = None
    k_config: list[int] | str | None = None
    draft_policy: str | None = None
    policy_options: dict[str, Any] | None = None
    n_workers: int | None = None
    verify_batch: int | str | None = None
    draft_batch: int | str | None = None

    def decode_changes(self) -> dict[str, Any]:
        """The settings this request gives (DecodeSpec.replace keywords)."""
        fields = ("mode", "k_config", "draft_policy", "policy_options", "n_workers", "verify_batch", "draft_batch")
        return {name: getattr(self, name) for name in fields if getattr(self, name) is not None}


class SamplingFields(DecodeSettings):
    """What both endpoints share."""

    model_config = ConfigDict(extra="ignore")

    model: str
    n: int = Field(1, ge=1, le=MAX_N)
    temperature: float | None = Field(None, ge=0.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)  # vLLM: -1 or 0 is off
    seed: int | None = Field(None, ge=-(2 ** 63), le=2 ** 63 - 1)  # int64, as OpenAI's; row i samples with seed + i
    # this server's own extra (extra_body): tokens drawn at uniforms keyed by seed and position, so a
    # seed gives the same text whatever the server's mode, policy or load (engine/keyed_draws.py)
    draft_invariant: bool = False
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # refused unless left at their no-op value (see `unsupported`)
    presence_penalty: float | None = 0.0
    frequency_penalty: float | None = 0.0
    repetition_penalty: float | None = 1.0
    logit_bias: dict[str, float] | None = None
    min_tokens: int | None = 0

    def unsupported(self) -> str | None:
        """The first field set to a value that would change the output and that this server does not implement."""
        for name, neutral in (("presence_penalty", 0.0), ("frequency_penalty", 0.0), ("repetition_penalty", 1.0),
                              ("min_tokens", 0)):
            value = getattr(self, name)
            if value is not None and value != neutral:
                return name
        if self.logit_bias:
            return "logit_bias"
        return None


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=0)  # OpenAI's default; 0 with echo scores the prompt alone
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None

    def unsupported(self) -> str | None:
        if self.best_of is not None and self.best_of != self.n:
            return "best_of"
        if self.suffix:
            return "suffix"
        return super().unsupported()


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "developer", "tool", "function"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    tools: list[dict] | None = None
    functions: list[dict] | None = None  # the 0.x clients' name of tools
    response_format: dict | None = None

    def unsupported(self) -> str | None:
        for name in ("tools", "functions"):
            if getattr(self, name):
                return name
        if self.response_format and self.response_format.get("type", "text") != "text":
            return "response_format"
        return super().unsupported()


# ---------------------------------------------------------------------------- responses
def request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(BaseModel):
    """The legacy shape: parallel lists, one entry per token."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stats: dict | None = None  # this engine's counters of the choice's row (GenerationStats.to_dict); an extra field


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None
    stats: dict | None = None  # as CompletionChoice.stats


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class Delta(BaseModel):
    role: str | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: Delta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "seed-tot"
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
