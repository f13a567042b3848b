"""Load task data: a Hub dataset (through `datasets`), or a local JSONL / text file (read here).

Local files are read line by line, so a malformed line is reported with its file and line number,
and without `datasets`: an offline machine (a GPU image) may not have it installed. A JSONL file's
records all get the union of its fields, a missing one as None, as a `datasets` split gives them.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Callable

from seed_tot.hub import offline_mode, unreachable_hub
from seed_tot.search.protocol import DuplicateIdError, check_unique_ids

log = logging.getLogger(__name__)


class DataError(ValueError):
    """Bad task data: the message names the file, the line and what was expected."""


__all__ = ["DataError", "check_unique_ids", "check_window", "load_records", "read_jsonl", "type_name"]


def load_records(path: str | None, *, hub: tuple[str, str | None, str] | None = None,
                 required: tuple[str, ...] = (), text_field: str | None = None,
                 limit: int | None = None, offset: int = 0,
                 check: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Records with an `id` (the 0-based line index as a string when the record has none).

    path: a `.jsonl`/`.json` file (one object per line) or, with `text_field`, a text file whose
    every non-empty line becomes `{text_field: line}`. path None: the Hub dataset
    `hub = (name, config, split)`, which needs network access. Ids must be unique (checked over
    the whole source, before `offset`/`limit`): two records with one id are a DataError naming
    both lines, since a search would solve only one of them and a rescore would mix them up.
    check: the task's look at each record it will use (those in the window); the ValueError it
    raises becomes a DataError naming the file, line and id, so that a record the task cannot
    read is refused before any model loads rather than failing mid-search.
    """
    check_window(limit, offset)
    if path is None:
        if hub is None:
            raise DataError("this task has no Hub dataset: pass --data PATH")
        name, config, split = hub
        local = "pass a local file with --data PATH" + (
            f" (JSONL: one object per line with {', '.join(required)})" if required and text_field is None else "")
        try:  # imported here only: local files load without it
            import datasets
        except ImportError as err:
            raise DataError(f"loading the Hub dataset {name} needs the `datasets` package ({err}); {local}") from err
        # asked first: without the Hub, `datasets` retries for half a minute, warning each time, before
        # its error (with HF_HUB_OFFLINE=1 it reads its cache at once, so there is nothing to ask)
        why = None if offline_mode() else unreachable_hub()
        if why is not None:
            raise DataError(f"cannot load the Hub dataset {name} ({config}, {split}): {why}; {local}, or set "
                            f"HF_HUB_OFFLINE=1 to use a copy in the datasets cache")
        try:
            ds = datasets.load_dataset(name, config, split=split)
        except Exception as err:  # the name is wrong, or offline and not cached: say which and how to go on
            raise DataError(f"could not load the Hub dataset {name} ({config}, {split}): {err}; {local}") from err
        records = [dict(r) for r in ds]
        where = [f"{name} ({config}, {split}) row {i}" for i in range(len(records))]
    else:
        file = Path(path)
        if not file.is_file():
            raise DataError(f"data file {path} does not exist")
        if text_field is not None:
            lines = _check_text(file, text_field)
            text = file.read_text(encoding="utf-8-sig").splitlines()
            records = [{text_field: text[n - 1].strip()} for n in lines]
        else:
            rows = read_jsonl(file, required)
            if not rows:
                raise DataError(f"{file}: no records (the file is empty or blank); expected one JSON object "
                                f"per line" + (f" with {', '.join(required)}" if required else ""))
            lines = [lineno for lineno, _ in rows]
            fields = list(dict.fromkeys(key for _, record in rows for key in record))
            records = [{key: record.get(key) for key in fields} for _, record in rows]
        where = [f"{file}:{n}" for n in lines]
    for i, record in enumerate(records):
        if record.get("id") is None:
            record["id"] = str(i)
        else:
            record["id"] = str(record["id"])
    try:
        check_unique_ids([r["id"] for r in records], where)
    except DuplicateIdError as err:
        raise DataError(str(err)) from None
    if records and offset >= len(records):
        raise DataError(f"--offset {offset} is past the end: {path or hub[0]} has {len(records)} records")
    end = None if limit is None else offset + limit
    if check is not None:
        for place, record in zip(where[offset:end], records[offset:end]):
            try:
                check(record)
            except ValueError as err:
                raise DataError(f"{place} (id {record['id']}): {err}") from None
    return records[offset:end]


def type_name(value: Any) -> str:
    """A value's type as a data file spells it (JSON's null, not Python's NoneType)."""
    return "null" if value is None else type(value).__name__


def check_window(limit: int | None, offset: int) -> None:
    """--limit and --offset as a user means them: a count of at least 1 and a start of at least 0."""
    if limit is not None and limit < 1:
        raise DataError(f"--limit must be at least 1, got {limit} (leave it out to take every record)")
    if offset < 0:
        raise DataError(f"--offset must be at least 0, got {offset}")


def _text_lines(text_field: str) -> str:
    """What a plain-text data file holds, in words that read right whatever the field's name (a
    plural like "sentences" made "one sentences per line")."""
    return f"plain text with one record per line, each line read as its {text_field!r}"


def _check_text(file: Path, text_field: str) -> list[int]:
    """The 1-based numbers of the file's non-blank lines. Errors: not UTF-8, nothing but blank
    lines, or JSON records where this task reads plain text (a data file of another task)."""
    try:
        text = file.read_text(encoding="utf-8-sig")  # -sig: a byte-order mark is not part of the first line
    except UnicodeDecodeError as err:
        raise DataError(f"{file}: not UTF-8 text ({err})") from err
    lines = [n for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not lines:
        raise DataError(f"{file}: no records (the file is empty or blank); expected {_text_lines(text_field)}")
    first = text.splitlines()[lines[0] - 1].strip()
    if first.startswith("{"):
        try:
            is_object = isinstance(json.loads(first), dict)
        except json.JSONDecodeError:
            is_object = False
        if is_object:
            raise DataError(f"{file}:{lines[0]}: found a JSON object, expected {_text_lines(text_field)} "
                            f"(is this another task's data file?)")
    return lines


def read_jsonl(file: str | Path, required: tuple[str, ...] = ()) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line; a bad line is a DataError naming file and line."""
    out = []
    # read as bytes and decode line by line: a text-mode iterator raises UnicodeDecodeError with
    # neither the file nor the line, for a file saved in another encoding
    with Path(file).open("rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):  # a byte-order mark (as Windows editors save UTF-8)
                raw = raw[3:]
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise DataError(f"{file}:{lineno}: not UTF-8 text (byte {raw[err.start]:#04x} at column "
                                f"{err.start + 1}); expected one JSON object per line, saved as UTF-8") from None
            if not line.strip():
                continue
            array = (f"{file}:{lineno}: found a JSON array; expected JSONL, one JSON object per line "
                     f"(convert it with: jq -c '.[]' {file} > {Path(file).with_suffix('.jsonl')})")
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                if not out and line.strip() == "[":  # a pretty-printed .json array
                    raise DataError(array) from None
                raise DataError(f"{file}:{lineno}: expected one JSON object per line ({err.msg})") from None
            if not out and isinstance(record, list):
                raise DataError(array)
            if not isinstance(record, dict):
                raise DataError(f"{file}:{lineno}: expected a JSON object, got {type(record).__name__}")
            missing = [k for k in required if k not in record]
            if missing:
                raise DataError(f"{file}:{lineno}: missing field(s) {', '.join(missing)}; "
                                f"expected {', '.join(required)}")
            out.append((lineno, record))
    return out
