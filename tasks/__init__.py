"""Built-in ToT tasks, written only against the public `seed_tot.search.protocol.Task` protocol."""
from __future__ import annotations

from seed_tot.search.protocol import Task

TASK_NAMES = ("gsm8k", "creative_writing", "blocksworld")


def get_task(name: str) -> Task:
    """A built-in task by name ("creative-writing" and "creative_writing" are the same)."""
    key = name.strip().lower().replace("-", "_")
    if key == "gsm8k":
        from .gsm8k import GSM8K
        return GSM8K()
    if key == "creative_writing":
        from .creative_writing import CreativeWriting
        return CreativeWriting()
    if key == "blocksworld":
        from .blocksworld import Blocksworld
        return Blocksworld()
    raise ValueError(f"unknown task {name!r}; expected one of {', '.join(TASK_NAMES)}")
