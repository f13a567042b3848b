"""Load task data through `datasets`: a Hub dataset, or a local JSONL / text file.

Local files are checked line by line first, so a malformed line is reported with its file and
line number instead of as an Arrow traceback, and then loaded with `datasets` like a Hub split.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class DataError(ValueError):
    """Bad task data: the message names the file, the line and what was expected."""


def load_records(path: str | None, *, hub: tuple[str, str | None, str] | None = None,
                 required: tuple[str, ...] = (), text_field: str | None = None,
                 limit: int | None = None, offset: int = 0) -> list[dict[str, Any]]:
    """Records with an `id` (the 0-based line index as a string when the record has none).

    path: a `.jsonl`/`.json` file (one object per line) or, with `text_field`, a text file whose
    every non-empty line becomes `{text_field: line}`. path None: the Hub dataset
    `hub = (name, config, split)`, which needs network access.
    """
    import datasets

    if path is None:
        if hub is None:
            raise DataError("this task has no Hub dataset: pass --data PATH")
        name, config, split = hub
        try:
            ds = datasets.load_dataset(name, config, split=split)
        except Exception as err:  # the Hub is unreachable or the name is wrong: say which and how to go on
            raise DataError(f"could not load the Hub dataset {name} ({config}, {split}): {err}; "
                            f"pass a local file with --data PATH") from err
        records = [dict(r) for r in ds]
    else:
        file = Path(path)
        if not file.is_file():
            raise DataError(f"data file {path} does not exist")
        if text_field is not None:
            _check_text(file)
            ds = datasets.load_dataset("text", data_files=str(file), split="train")
            records = [{text_field: r["text"].strip()} for r in ds if r["text"].strip()]
        else:
            read_jsonl(file, required)
            ds = datasets.load_dataset("json", data_files=str(file), split="train")
            records = [dict(r) for r in ds]
    for i, record in enumerate(records):
        if record.get("id") is None:
            record["id"] = str(i)
        else:
            record["id"] = str(record["id"])
    end = None if limit is None else offset + limit
    return records[offset:end]


def _check_text(file: Path) -> None:
    try:
        file.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"{file}: not UTF-8 text ({err})") from err


def read_jsonl(file: str | Path, required: tuple[str, ...] = ()) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line; a bad line is a DataError naming file and line."""
    out = []
    with Path(file).open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{file}:{lineno}: expected one JSON object per line ({err.msg})") from None
            if not isinstance(record, dict):
                raise DataError(f"{file}:{lineno}: expected a JSON object, got {type(record).__name__}")
            missing = [k for k in required if k not in record]
            if missing:
                raise DataError(f"{file}:{lineno}: missing field(s) {', '.join(missing)}; "
                                f"expected {', '.join(required)}")
            out.append((lineno, record))
    return out
