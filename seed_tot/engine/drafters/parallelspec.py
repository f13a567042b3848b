"""A small drafter that reads the target's own token embeddings and LM head (ParallelSpec, seed 003).

    drafter = ParallelDrafter(target, n_masks=k, n_layers=L)

The drafter's body is the target's own base-model class (e.g. `LlamaModel`) built from the target's
config with L decoder layers: stock transformers code, initialised from the target's first L layers
and final norm. The target's input embedding and LM head are *shared* (read, never copied, never
trained): they are referenced outside the module's parameters, so `state_dict()` holds only what
the drafter learns (the L layers, the norm and the k mask embeddings), which keeps a one-layer
SmolLM2 drafter at about 14 MB.

ParallelSpec (Xiao et al. 2024): k trainable [MASK] embeddings are fed after the context. The
output at the last real token x_t is q_1 (the distribution of x_{t+1}) and the output at MASK_j is
q_{j+1} (of x_{t+j+1}), so ONE forward over [pending tokens, MASK_1..MASK_k] drafts k+1 tokens.
Mask j enters the model as the token id `mask_id(j)` = (embedding rows) + j - 1: ids the target's
vocabulary never uses, so the drafter goes through `KVCache.forward`/`forward_batch` like any
causal LM (its own small KV cache, its own 4D masks from engine/masks.py).

With n_masks=0 the same module is a plain one-layer autoregressive drafter of the same size (the
comparison the paper makes): it drafts one token per forward through the ordinary `fixed` policy.

With target_features=True (ParallelSpec over EAGLE, as the paper also builds it) each real token's
entry also reads the target's final hidden state f_{p-1} (engine/target_features.py): its input is
emb(x_p) + W norm(f_{p-1}), W a linear map (no bias) initialised to zero, so training starts from
the plain drafter; it adds 0.33M parameters (1.3 MB) to a SmolLM2 drafter. norm() scales f to the
RMS of the token embeddings: raw, f is an order of magnitude larger than an embedding, W f drowns
the token's identity, and the masks, which read the real entries through attention, stop learning.
MASK_j reads its anchor's f_{t-1}, the newest f there is, which trains better than zeros there
(docs/benchmarks.md, "Figures behind the code's design choices", has both comparisons). Only the
`parallelspec` policy drafts with it: every entry it feeds is a real token whose f the target has
computed, or a mask.

The forward takes and returns what a transformers causal LM does (input_ids, position_ids,
attention_mask, cache -> .logits), so the engine needs no special path for it.
"""
from __future__ import annotations

import copy

import torch
from torch import nn
from transformers import AutoModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from ..cache_argument import cache_kwargs, either_cache, output_field, returned_cache

PARALLELSPEC, AUTOREGRESSIVE = "parallelspec", "autoregressive"
METHODS = (PARALLELSPEC, AUTOREGRESSIVE)


def _body_config(target_config, n_layers: int):
    config = copy.deepcopy(target_config)
    config.num_hidden_layers = n_layers
    if getattr(config, "layer_types", None):
        config.layer_types = list(config.layer_types)[:n_layers]
    return config


class ParallelDrafter(nn.Module):
    """L stock decoder layers + k mask embeddings over the target's frozen, shared embeddings and head."""

    def __init__(self, target, n_masks: int, n_layers: int = 1, init_from_target: bool = True,
                 target_features: bool = False):
        super().__init__()
        if n_masks < 0 or n_layers < 1:
            raise ValueError(f"a drafter needs n_masks >= 0 and n_layers >= 1, got n_masks={n_masks}, n_layers={n_layers}")
        if target_features and not n_masks:
            raise ValueError("a drafter that reads the target's hidden states needs [MASK] tokens (method "
                             "parallelspec): an autoregressive one would feed its own drafts, which have none")
        embed, head = target.get_input_embeddings(), target.get_output_embeddings()
        if embed is None or head is None:
            raise ValueError(f"{type(target).__name__} exposes no input embedding or LM head to share with a drafter")
        self.config = _body_config(target.config, n_layers)
        self.model = AutoModel.from_config(self.config)  # the target's own base-model class
        # the body's own embedding table would be a copy of the target's: drop it, embeddings come in as inputs_embeds
        self.model.set_input_embeddings(None)
        self.model.to(device=head.weight.device, dtype=head.weight.dtype)
        if init_from_target:
            own = self.model.state_dict()
            base = target.base_model.state_dict()
            self.model.load_state_dict({k: v for k, v in base.items() if k in own and own[k].shape == v.shape},
                                       strict=False)
        self.n_masks, self.n_layers = n_masks, n_layers
        self.method = PARALLELSPEC if n_masks else AUTOREGRESSIVE
        self.default_depth: int | None = None  # the parallelspec policy's depth when none is asked for (None: k+1)
        self.default_cut: str | None = None  # the parallelspec policy's cut when none is asked for (None: none)
        self.default_lookup: int | None = None  # the parallelspec policy's prompt-lookup n-gram (None: 0, off)
        self.mask_base = embed.weight.shape[0]
        with torch.no_grad():  # masks start near the average token, slightly apart so that they can specialise
            mean, std = embed.weight.float().mean(0), embed.weight.float().std()
            gen = torch.Generator().manual_seed(0)
            init = mean + 0.02 * std * torch.randn(n_masks, mean.shape[0], generator=gen).to(mean.device)
        self.mask_embeddings = nn.Parameter(init.to(embed.weight.dtype))
        self.fuse, self.feature_size = None, 0
        if target_features:
            self.feature_size = int(target.config.hidden_size)  # what the target's base model outputs
            self.fuse = nn.Linear(self.feature_size, embed.weight.shape[1], bias=False, device=embed.weight.device,
                                  dtype=embed.weight.dtype)
            nn.init.zeros_(self.fuse.weight)  # starts as the plain drafter, learns how to use f
            # f arrives at this RMS (a property of the target's table, so a loaded drafter computes the same)
            self.feature_rms = float(embed.weight.detach().float().pow(2).mean().sqrt())
        # shared with the target, deliberately not registered as submodules (not saved, not trained, no copy)
        self.__dict__["shared"] = (embed, head)
        self.__dict__["trimmed_head"] = None  # set_draft_vocab: score only a frequent subset (draft_vocab.py)

    # ---------------------------------------------------------------- what the engine reads
    @property
    def device(self) -> torch.device:
        return self.mask_embeddings.device

    @property
    def dtype(self) -> torch.dtype:
        return self.mask_embeddings.dtype

    @property
    def uses_target_features(self) -> bool:
        return self.fuse is not None

    @property
    def default_policy(self) -> str:
        """The draft policy an engine uses with this drafter when the caller names none: `choose`, which
        drafts each round with this drafter (parallelspec rounds), the search's own text, both or
        neither, whichever is expected to pay most (docs/benchmarks.md has the runs behind it)."""
        return "choose" if self.n_masks else "fixed"

    def get_input_embeddings(self) -> nn.Module:
        return self.shared[0]

    def get_output_embeddings(self) -> nn.Module:
        """The head the forward runs: the target's, or its rows for the draft vocabulary."""
        return self.trimmed_head if self.trimmed_head is not None else self.shared[1]

    @property
    def full_head(self) -> nn.Module:
        """The target's whole LM head (what training scores against, whatever the draft vocabulary)."""
        return self.shared[1]

    @property
    def draft_vocab_size(self) -> int | None:
        return None if self.trimmed_head is None else int(self.trimmed_head.token_ids.numel())

    def set_draft_vocab(self, token_ids: torch.Tensor | None) -> None:
        """Draft only `token_ids` (None: the whole vocabulary). Set it before the engine first drafts:
        a HiddenCapture hooks the head that is current when it is made."""
        from .draft_vocab import TrimmedHead

        self.__dict__["trimmed_head"] = None if token_ids is None else TrimmedHead(self.shared[1], token_ids)

    def mask_id(self, j: int) -> int:
        """The input id of MASK_j (1 <= j <= n_masks)."""
        if not 1 <= j <= self.n_masks:
            raise ValueError(f"this drafter has masks 1..{self.n_masks}, not {j}")
        return self.mask_base + j - 1

    # ---------------------------------------------------------------- forward
    def embed(self, input_ids: torch.Tensor, target_features: torch.Tensor | None = None) -> torch.Tensor:
        """Token embeddings from the shared table; mask ids take the drafter's mask embeddings; with
        `fuse`, plus fuse(the target's hidden states [rows, entries, hidden]) (None: all zeros)."""
        embed = self.shared[0]
        is_mask = input_ids >= self.mask_base
        out = embed(input_ids.clamp(max=self.mask_base - 1))
        if self.n_masks and bool(is_mask.any()):
            masks = self.mask_embeddings[(input_ids - self.mask_base).clamp(0, self.n_masks - 1)]
            out = torch.where(is_mask[..., None], masks.to(out.dtype), out)
        if self.fuse is not None:
            if target_features is not None:  # none (zeros): the entry is its token's (or mask's) embedding
                f = target_features.to(out.dtype)
                f = f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + 1e-6) * self.feature_rms  # zeros stay zeros
                out = out + self.fuse(f)
        return out

    def hidden(self, input_ids, position_ids=None, attention_mask=None, cache=None, use_cache=False,
               target_features=None):
        out = self.model(inputs_embeds=self.embed(input_ids, target_features), position_ids=position_ids,
                         attention_mask=attention_mask, use_cache=use_cache, **cache_kwargs(self.model, cache))
        return out.last_hidden_state, returned_cache(out)

    def forward(self, input_ids, position_ids=None, attention_mask=None, cache=None, use_cache=False,
                logits_to_keep: int = 0, target_features=None, past_key_values=None,
                **_ignored) -> CausalLMOutputWithPast:
        cache = either_cache(cache, past_key_values)  # transformers' new name and its old one
        hidden, cache = self.hidden(input_ids, position_ids, attention_mask, cache, use_cache, target_features)
        if logits_to_keep:  # as transformers' causal LMs: the head runs on the last positions only
            hidden = hidden[:, -logits_to_keep:]
        logits = self.get_output_embeddings()(hidden)
        return CausalLMOutputWithPast(logits=logits, **{output_field(CausalLMOutputWithPast): cache})
