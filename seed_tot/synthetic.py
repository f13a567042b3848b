"""Synthetic engines: randomly initialised models of REAL shapes with an acceptance oracle.

Why: benchmarking SEED at Llama-2-7B scale needs the real compute of a 7B target and a 160M
draft, but not their weights (no Hub access, no disk). The models here are built from the real
configs with random weights, run their full forward (so every FLOP and byte moved is real), and
then `OracleLM` replaces the logits with a deterministic oracle so the draft agrees with the
target at a chosen rate `alpha`:

    target's next token after (token t at position n) = h(t, n) mod V           (a fixed hash)
    draft's candidates at (t, n): rank r (r < RANKS) is the target's token with probability
        alpha given that ranks < r missed (decided by another hash of (t, n)), else a wrong token

So a chain draft is accepted token by token with probability alpha, and a k-wide tree level
catches the target's token with probability 1 - (1 - alpha)^k. Everything is a function of the
input ids and position ids, computed with tensor ops on the model's device.

Text workloads still run: `SyntheticTokenizer` maps words to ids by hash and decodes each id to
a placeholder word, so prompts have realistic lengths and outputs are obviously meaningless.
"""
from __future__ import annotations

import logging
import re
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from seed_tot.engine.cache_argument import cache_kwargs, either_cache
from seed_tot.engine.engine import Engine

if TYPE_CHECKING:
    from seed_tot.replay import ReplayTable

log = logging.getLogger(__name__)

RANKS = 4  # draft candidates with an oracle decision; deeper ranks tie at logit 0
TOP_LOGIT = 40.0  # softmax of 40 vs 0 over 152k tokens is one-hot to ~1e-12: sampling ~ greedy
RANK_GAP = 8.0  # rank r gets TOP_LOGIT - r * RANK_GAP, so ties never decide a top-k
_P = 2_147_483_647  # 2^31 - 1: keeps every product of the hash below 2^63 in int64
TARGET_SALT, DRAFT_SALT = 1, 101

# name -> (target config, draft config): the architectures' published numbers.
_LLAMA2_7B = dict(arch="llama", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                  num_key_value_heads=32, intermediate_size=11008, vocab_size=32000,
                  max_position_embeddings=4096, rms_norm_eps=1e-5)
_LLAMA_160M = dict(arch="llama", hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                   num_key_value_heads=12, intermediate_size=3072, vocab_size=32000,
                   max_position_embeddings=2048, rms_norm_eps=1e-6)
_QWEN2_COMMON = dict(arch="qwen2", num_key_value_heads=2, vocab_size=151936, max_position_embeddings=131072,
                     rms_norm_eps=1e-6, rope_theta=1_000_000.0, tie_word_embeddings=True,
                     use_sliding_window=False)
_QWEN2_1_5B = dict(_QWEN2_COMMON, hidden_size=1536, num_hidden_layers=28, num_attention_heads=12,
                   intermediate_size=8960)
_QWEN2_0_5B = dict(_QWEN2_COMMON, hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                   intermediate_size=4864)
_TINY_TARGET = dict(arch="llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, intermediate_size=128, vocab_size=8192, max_position_embeddings=4096)
_TINY_DRAFT = dict(_TINY_TARGET, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                   intermediate_size=64)

PRESETS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "llama2-7b+llama-160m": (_LLAMA2_7B, _LLAMA_160M),
    "qwen2-1.5b+qwen2-0.5b": (_QWEN2_1_5B, _QWEN2_0_5B),
    "tiny": (_TINY_TARGET, _TINY_DRAFT),
}
# the same shapes with the vocabulary of the recorded run, the target replaying its text (replay.py)
REPLAY_PREFIX = "replay-"
PRESETS.update({REPLAY_PREFIX + name: specs for name, specs in list(PRESETS.items())})


def _hash(tokens: torch.Tensor, positions: torch.Tensor, salt: int) -> torch.Tensor:
    """A deterministic pseudo-random int64 in [0, 2^31 - 1) per (token, position), elementwise."""
    x = (tokens.long() % _P * 1_000_003 + positions.long() % _P * 7_919 + salt) % _P
    for mult in (48_271, 16_807, 69_621):  # Park-Miller steps with xor-shifts between them
        x = (x * mult + salt) % _P
        x = x ^ (x >> 11)
    return x


def target_token(tokens: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """The oracle target's next token after `tokens` at `positions`."""
    return _hash(tokens, positions, TARGET_SALT) % vocab


def draft_candidates(tokens: torch.Tensor, positions: torch.Tensor, vocab: int, alpha: float,
                     truth: torch.Tensor | None = None) -> torch.Tensor:
    """[..., RANKS] candidate tokens, best first: rank r holds the target's token (`truth`, default
    the hash oracle's) iff it is the first rank whose coin (a hash, uniform in [0, 1)) falls below
    alpha; other ranks are wrong."""
    truth = target_token(tokens, positions, vocab) if truth is None else truth
    coins = torch.stack([_hash(tokens, positions, DRAFT_SALT + r) % (1 << 20) for r in range(RANKS)], -1)
    hit = coins.double() / (1 << 20) < alpha
    ranks = torch.arange(RANKS, device=tokens.device)
    first_hit = torch.where(hit.any(-1), hit.int().argmax(-1), RANKS)
    wrong = (truth[..., None] + 1 + ranks) % vocab  # distinct, and never the target's token
    return torch.where(ranks == first_hit[..., None], truth[..., None], wrong)


@dataclass
class OracleOutput:
    logits: torch.Tensor


class OracleLM(nn.Module):
    """A causal LM whose forward is real but whose logits come from the oracle (see module doc)."""

    def __init__(self, model: nn.Module, role: str, alpha: float = 1.0, replay: "ReplayTable | None" = None):
        super().__init__()
        if role not in ("target", "draft"):
            raise ValueError(f"role must be 'target' or 'draft', got {role!r}")
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {alpha}")
        self.model, self.role, self.alpha = model, role, alpha
        self.vocab = model.config.vocab_size
        # replay-* presets: the target's token follows recorded text where the recording has it
        # (seed_tot/replay.py); the draft's alpha coins are drawn against that same token
        self.replay = replay

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    @property
    def config(self):
        return self.model.config

    @property
    def generation_config(self):
        return self.model.generation_config

    def get_input_embeddings(self) -> nn.Module:
        return self.model.get_input_embeddings()

    def get_output_embeddings(self) -> nn.Module:
        return self.model.get_output_embeddings()

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, cache=None, use_cache: bool = True,
                past_key_values=None, **kwargs: Any) -> OracleOutput:
        cache = either_cache(cache, past_key_values)  # transformers' new name and its old one
        if position_ids is None:  # the engine always passes them; this keeps the module usable alone
            past = cache.get_seq_length() if cache is not None else 0
            position_ids = torch.arange(past, past + input_ids.shape[1], device=input_ids.device)[None]
        out = self.model(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask,
                         use_cache=use_cache, **cache_kwargs(self.model, cache), **kwargs)
        # overwrite in place: the real logits were computed (their cost is paid), their values are not used
        logits = out.logits.zero_()
        positions = position_ids.expand_as(input_ids)
        kept = logits.shape[1]  # logits_to_keep: the model scored only the last positions
        input_ids, positions = input_ids[:, -kept:], positions[:, -kept:]
        truth = target_token(input_ids, positions, self.vocab)
        if self.replay is not None:
            truth = self.replay.lookup(input_ids, positions, truth)
        if self.role == "target":
            picks = truth[..., None]
            values = torch.full(picks.shape, TOP_LOGIT, dtype=logits.dtype, device=logits.device)
        else:
            picks = draft_candidates(input_ids, positions, self.vocab, self.alpha, truth)
            values = (TOP_LOGIT - RANK_GAP * torch.arange(RANKS, device=logits.device)).to(logits.dtype)
            values = values.expand(picks.shape)
        return OracleOutput(logits.scatter_(-1, picks, values))


class SyntheticTokenizer:
    """The slice of the tokenizer API the engine uses. Encoding: one id per word or punctuation
    mark (by crc32), so prompt lengths are close to a BPE tokenizer's; decoding: " w<id>"."""

    chat_template = None
    eos_token_id = None
    _PIECES = re.compile(r"\s?\w+|\s?[^\w\s]|\s+")

    def __init__(self, vocab: int):
        self.vocab = vocab

    def __len__(self) -> int:
        return self.vocab

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": [zlib.crc32(p.encode("utf-8")) % self.vocab for p in self._PIECES.findall(text)]}

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(f" w{int(i)}" for i in ids)

    def get_vocab(self) -> dict[str, int]:
        return {f" w{i}": i for i in range(self.vocab)}


def build_model(spec: dict[str, Any], device: torch.device, dtype: torch.dtype, seed: int = 0) -> nn.Module:
    """A randomly initialised causal LM of `spec`'s shape, created directly on `device` in `dtype`
    (a 7B model initialised on the CPU and then moved would take minutes)."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    spec = dict(spec)
    config_cls = {"llama": LlamaConfig, "qwen2": Qwen2Config}[spec.pop("arch")]
    config = config_cls(**spec, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config.eos_token_id = None  # nothing stops early: every mode decodes the full budget
    model.generation_config.pad_token_id = None
    return model.eval()


def build_synthetic_engine(preset: str, alpha: float, device: str | torch.device = "auto",
                           dtype: torch.dtype | str | None = None, seed: int = 0,
                           recording: str | None = None, attention: str = "gather",
                           compile: "CompileSettings | bool | None" = None) -> Engine:
    """An Engine over random models of the preset's real shapes, with oracle acceptance `alpha`.
    A replay-* preset's target replays `recording` (default: the one shipped, replay.py) with its
    tokenizer and vocabulary. attention, compile: as Engine's, checked before any model is built."""
    from seed_tot.engine.compiled_forward import CompileSettings
    from seed_tot.engine.model_runtime import check_attention_path
    from seed_tot.engine.forward_thread import ForwardThread
    from seed_tot.engine.models import resolve_device

    attention, compile = check_attention_path(attention), CompileSettings.of(compile)
    if preset not in PRESETS:
        raise ValueError(f"unknown synthetic preset {preset!r}; expected one of {', '.join(PRESETS)}")
    dev = resolve_device(device) if isinstance(device, str) else device
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    dtype = dtype or (torch.bfloat16 if dev.type == "cuda" else torch.float32)
    target_spec, draft_spec = PRESETS[preset]
    if target_spec["vocab_size"] != draft_spec["vocab_size"]:
        raise ValueError(f"preset {preset}: target and draft vocabularies differ")
    replay, tokenizer, eos, oracle = None, SyntheticTokenizer(target_spec["vocab_size"]), None, "oracle"
    if preset.startswith(REPLAY_PREFIX):
        from seed_tot.replay import DEFAULT_RECORDING, ReplayTable, load_recording, load_tokenizer

        record = load_recording(recording or DEFAULT_RECORDING)
        tokenizer, eos = load_tokenizer(record), record.header.get("eos_token_ids") or None
        target_spec = dict(target_spec, vocab_size=record.vocab_size)
        draft_spec = dict(draft_spec, vocab_size=record.vocab_size)
        replay = ReplayTable(record, dev)
        oracle = f"replaying {record.header.get('target', 'a recorded run')}'s text"
    log.info("building synthetic %s on %s (%s), alpha %.2f", preset, dev, dtype, alpha)
    # on a CPU the models are built on the engine's forward thread (forward_thread.py says why)
    thread = ForwardThread() if dev.type == "cpu" else None
    build = thread.call if thread is not None else (lambda fn, *args: fn(*args))
    target_model = build(build_model, target_spec, dev, dtype, seed)
    target_model.generation_config.eos_token_id = eos  # replay: the recorded run stopped at its eos
    target = OracleLM(target_model, "target", replay=replay)
    draft = OracleLM(build(build_model, draft_spec, dev, dtype, seed + 1), "draft", alpha, replay=replay)
    name = preset.removeprefix(REPLAY_PREFIX)
    return Engine(target, draft, tokenizer, vocab_size=target_spec["vocab_size"],
                  target_name=f"synthetic {name.split('+')[0]} (random weights, {oracle})",
                  draft_name=f"synthetic {name.split('+')[-1]} (random weights, oracle alpha={alpha:g})",
                  forward_thread=thread, attention=attention, compile=compile)


def expected_acceptance(alpha: float, k_config: tuple[int, ...]) -> float:
    """The engine's acceptance rate (accepted / tree depth) the oracle should give under greedy:
    level d is reached when every level before it caught the target's token."""
    p_reach, accepted = 1.0, 0.0
    for width in k_config:
        p_reach *= 1.0 - (1.0 - alpha) ** min(width, RANKS)
        accepted += p_reach
    return accepted / len(k_config)
