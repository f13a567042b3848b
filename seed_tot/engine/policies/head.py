"""SpecDec++'s acceptance-prediction head: a small residual MLP on the draft's final hidden state.

Saved as DIR/head.safetensors + DIR/head.json; the JSON names the target and draft models and the
sampling settings the head was trained for, and loading it for other models is an error, because
its predictions only mean something for the pair (and the sampling) whose acceptances it learned.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

WEIGHTS, CONFIG = "head.safetensors", "head.json"


class AcceptanceHead(nn.Module):
    """logit of P(draft token accepted | earlier tokens accepted), from the hidden state at the token."""

    def __init__(self, hidden_size: int, layers: int = 2, width: int | None = None):
        super().__init__()
        width = width or hidden_size
        # the draft's final hidden states are raw (pre-norm) activations with a few huge channels:
        # normalising them first keeps a small head from fitting those channels' noise
        self.norm = nn.LayerNorm(hidden_size)
        self.inp = nn.Linear(hidden_size, width)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.SiLU())
                                    for _ in range(layers))
        self.out = nn.Linear(width, 1)
        self.config = {"hidden_size": hidden_size, "layers": layers, "width": width}

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        x = self.inp(self.norm(hidden.float()))
        for block in self.blocks:
            x = x + block(x)  # residual: depth never hurts the starting point
        return self.out(x).squeeze(-1)


def accept_probability(head: nn.Module, hidden: torch.Tensor) -> float:
    """The head's P̂ for the token whose draft entry produced `hidden` (one vector)."""
    with torch.no_grad():
        return float(torch.sigmoid(head(hidden[None].to(next(head.parameters()).device))[0]))


def save_head(head: AcceptanceHead, directory: str | Path, trained_for: dict) -> None:
    from safetensors.torch import save_file

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous() for k, v in head.state_dict().items()}, str(out / WEIGHTS))
    (out / CONFIG).write_text(json.dumps({"architecture": head.config, "trained_for": trained_for}, indent=2) + "\n",
                              encoding="utf-8")


def load_head(directory: str | Path, target_name: str | None = None, draft_name: str | None = None) -> tuple[AcceptanceHead, dict]:
    """The head in `directory`; with model names given, refuses a head trained for other models."""
    from safetensors.torch import load_file

    root = Path(directory)
    config_path = root / CONFIG
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
        arch, trained_for = config["architecture"], config["trained_for"]
    except FileNotFoundError:
        raise ValueError(f"{config_path}: no head here (train one with `seed-tot train-head`)") from None
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{config_path}: not a head config ({err!r})") from None
    for role, name in (("target", target_name), ("draft", draft_name)):
        if name is not None and trained_for.get(role) != name:
            raise ValueError(f"{config_path}: this head was trained for {role} {trained_for.get(role)!r}, "
                             f"not {name!r}; train one for this pair with `seed-tot train-head`")
    head = AcceptanceHead(arch["hidden_size"], arch["layers"], arch["width"])
    head.load_state_dict(load_file(str(root / WEIGHTS)))
    return head.eval(), trained_for
