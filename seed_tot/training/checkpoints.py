"""Resumable training checkpoints shared by the trainers (SpecDec++ head, drafters): DIR/checkpoint.pt
holds the trained module's state, the optimizer's and the step, so rerunning a command resumes."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

log = logging.getLogger(__name__)
CHECKPOINT = "checkpoint.pt"
SETTINGS = "train_settings.json"  # what check_same_training compares a resumed run's settings with


def check_same_data(out: Path, meta_path: Path, meta: dict) -> None:
    """Before new training data replaces the cached data in `out`: a checkpoint there was trained on the
    old data, and resuming it would save weights trained on other settings under this run's (a rerun
    with another --draft, --max-new-tokens, ... into the same --out). Refused, naming what differs."""
    if not (out / CHECKPOINT).is_file():
        return
    try:
        old = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        old = {}
    raise ValueError(f"{out / CHECKPOINT}: trained on data made with other settings ({_differences(old, meta)}); "
                     f"use another --out or delete it to start over")


def check_same_training(out: Path, settings: dict) -> None:
    """Before training resumes `out`'s checkpoint: the settings that shape its weights besides the data and
    the step count (learning rate, batch, labels, ...) must be the ones it was trained with. A rerun with
    another --lr or --distill-temperature went on from the checkpoint (at its last step: trained nothing)
    and wrote a model card naming the new settings, so the card's command did not reproduce the weights.
    Refused, naming what differs; the settings are recorded in out/train_settings.json."""
    path = out / SETTINGS
    if (out / CHECKPOINT).is_file():
        try:
            old = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):  # a checkpoint from before the settings were recorded: trust the rerun
            log.warning("%s: no record of the settings it was trained with; resuming it with this run's", out)
            old = settings
        if old != settings:
            raise ValueError(f"{out / CHECKPOINT}: trained with other settings ({_differences(old, settings)}); "
                             f"use another --out or delete it to start over")
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")


def _differences(old, new: dict) -> str:
    if not isinstance(old, dict) or not old:
        return "unknown settings"
    return "; ".join(f"{key} {old.get(key)!r} -> {new.get(key)!r}" for key in sorted(set(old) | set(new))
                     if old.get(key) != new.get(key))


def resume(out: Path, key: str, module: torch.nn.Module, optim: torch.optim.Optimizer, extra: dict | None = None) -> int:
    """Load out/checkpoint.pt into `module` (stored under `key`) and `optim`; the step to go on from (0: fresh).
    `extra` gets the trainer's own entries that `save` stored beside them."""
    ckpt = out / CHECKPOINT
    if not ckpt.is_file():
        return 0
    state = torch.load(ckpt, weights_only=True)
    try:
        module.load_state_dict(state[key])
    except (KeyError, RuntimeError) as err:  # another method, k or layer count in the same --out
        # load_state_dict's first line is only "Error(s) in loading state_dict for X:"; the next says what differs
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        detail = " ".join(lines[:2]) if len(lines) > 1 and lines[0].endswith(":") else lines[0]
        raise ValueError(f"{ckpt}: a checkpoint of another model ({detail}); "
                         f"use another --out or delete it to start over") from None
    optim.load_state_dict(state["optim"])
    if extra is not None:
        extra.update({name: value for name, value in state.items() if name not in (key, "optim", "step")})
    log.info("resuming %s at step %d", ckpt, int(state["step"]))
    return int(state["step"])


def save(out: Path, key: str, module: torch.nn.Module, optim: torch.optim.Optimizer, step: int,
         extra: dict | None = None) -> None:
    torch.save({**(extra or {}), key: module.state_dict(), "optim": optim.state_dict(), "step": step}, out / CHECKPOINT)


def interrupted(out: Path, data_file: str = "data.safetensors") -> str:
    """What a trainer stopped by Ctrl-C kept in `out`, and how the same command goes on from it."""
    if (out / CHECKPOINT).is_file():
        return f"training's last checkpoint is {out / CHECKPOINT}: the same command goes on from it"
    if (out / data_file).is_file():
        return f"the generated data is in {out / data_file}: the same command reuses it"
    return "no data or checkpoint was saved yet (the generated data is saved once all of it is generated)"
