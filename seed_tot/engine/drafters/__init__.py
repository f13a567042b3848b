"""Draft models that are not plain causal LMs of their own (DESIGN.md: engine/drafters/).

    parallelspec.py  ParallelDrafter: L stock decoder layers + k [MASK] embeddings over the target's
                     shared embeddings and LM head; k=0 is the autoregressive drafter of the same size
    storage.py       DIR/drafter.safetensors + DIR/drafter.json, checked against the target at load
    shipped/         drafters that ship in the wheel (the embedded default's), each with a model card
The policy that drafts with masks is engine/policies/parallelspec.py; training is
seed_tot/training/drafter_*.py (`seed-tot train-drafter`).
"""
from .parallelspec import AUTOREGRESSIVE, METHODS, PARALLELSPEC, ParallelDrafter
from .storage import SHIPPED_DIR, is_drafter_dir, load_drafter, read_config, save_drafter, shipped_drafter_for

__all__ = ["AUTOREGRESSIVE", "METHODS", "PARALLELSPEC", "ParallelDrafter", "is_drafter_dir", "load_drafter",
           "read_config", "save_drafter", "SHIPPED_DIR", "shipped_drafter_for"]
