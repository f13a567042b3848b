"""Where a run's problems came from, as run.json records it: part of the run's identity, so that a
`--resume` given other data (another file, an edited file, or no --data where the first run read a
file) is refused before any model loads instead of appending other problems' records to these.

A data file is named by its path and the SHA-256 of its bytes; two sources are the same when their
digests agree (the same file copied elsewhere resumes; the same path edited since does not). A
task's own data (no --data) is whatever the task says it is (`Task.default_data_source()`: its
generator and seed, or its Hub dataset), else the task's name.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

__all__ = ["data_source", "describe_source", "same_source"]


def data_source(task: Any, path: str | Path | None) -> dict[str, Any]:
    """The source `task.load(path)` reads: {"file", "sha256"} for a file, else the task's default."""
    if path is not None:
        digest = hashlib.sha256()
        with Path(path).open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
        return {"file": str(Path(path).resolve()), "sha256": digest.hexdigest()}
    default = getattr(task, "default_data_source", None)
    described = default() if callable(default) else None
    return dict(described) if isinstance(described, dict) else {"default": getattr(task, "name", "task")}


def same_source(old: dict[str, Any], new: dict[str, Any]) -> bool:
    if "sha256" in old or "sha256" in new:
        return old.get("sha256") == new.get("sha256")
    return _plain(old) == _plain(new)


def describe_source(source: dict[str, Any]) -> str:
    """A source in words, for an error message."""
    if "sha256" in source:
        return f"the file {source.get('file')} (sha256 {str(source['sha256'])[:12]})"
    if "default" in source and len(source) == 1:
        return f"the default data of {source['default']}"
    return ", ".join(f"{key} {value}" for key, value in source.items())


def _plain(source: dict[str, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in source.items()}  # JSON's and Python's spellings of one value agree
