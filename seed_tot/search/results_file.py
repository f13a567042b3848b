"""results.jsonl on disk: reopening it safely for a resumed run, and summarising its records."""
from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any, Sequence

from seed_tot.engine.params import GenerationStats

from .accounting import summarize_costs

log = logging.getLogger(__name__)

_COUNTERS = tuple(f.name for f in fields(GenerationStats) if f.name != "events")
SUMMARY_PHASES = ("thought", "value", "answer", "judge")


class ResultsFileError(ValueError):
    """results.jsonl cannot be used as asked: it exists without --resume, or is corrupt."""


LOCK_FILE = ".lock"


def lock_output(out: Path):
    """Hold OUT/.lock for this run (an open file; closing it releases the lock), or raise
    ResultsFileError naming the process that holds it: two runs appending to one results.jsonl
    would both solve the problems neither had written yet and duplicate their records. The lock is
    the operating system's (flock), so a killed run leaves none behind. Not on Windows (no flock)."""
    if sys.platform == "win32":
        return None
    import fcntl

    path = out / LOCK_FILE
    fh = path.open("a+", encoding="utf-8")
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.seek(0)
        holder = fh.read().strip() or "another process"
        fh.close()
        raise ResultsFileError(f"{out}: another run is writing to this folder ({holder}, see {path}); "
                               f"wait for it to end or choose another --output") from None
    fh.seek(0)
    fh.truncate()
    fh.write(f"pid {os.getpid()}")
    fh.flush()
    return fh


def check_output_free(out: Path) -> None:
    """Raise as `lock_output` does when another run holds OUT (a check before loading models; the
    run itself holds the lock from when it opens results.jsonl)."""
    if out.is_dir():
        lock = lock_output(out)
        if lock is not None:
            lock.close()


def prepare_results_file(path: Path, resume: bool) -> dict[str, dict[str, Any]]:
    """The records already in `path`, by id, ready for appending.

    Only the last line can be incomplete (each record is written with its newline and fsynced),
    so a last line that does not parse is a killed write: it is dropped and the file rewritten
    without it (atomically). A bad line anywhere else is real corruption: an error.
    A record of a problem that failed (`"error"`: every Ray actor that ran it died) is dropped too,
    so a resume solves it again: a resume is how a run finishes, and what killed the actors (a
    node lost, memory taken by another job) may be gone.
    """
    if not path.exists() or path.stat().st_size == 0:
        return {}
    if not resume:
        raise ResultsFileError(f"{path} already holds results: pass --resume to continue that run, "
                               f"or --output DIR to start a new one elsewhere")
    lines = path.read_bytes().split(b"\n")
    needs_rewrite = bool(lines[-1].strip())  # bytes after the last newline: a write cut short
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    records: dict[str, dict[str, Any]] = {}
    kept_lines: list[bytes] = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            record_id = str(record["id"])
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as err:
            if i == last:
                log.warning("%s:%d: dropping the incomplete last line left by an interrupted run", path, i + 1)
                needs_rewrite = True
                continue
            raise ResultsFileError(f"{path}:{i + 1}: not a complete result record ({err}); "
                                   f"fix or remove that line, then resume") from None
        if record_id in records:
            log.warning("%s:%d: id %s is already on an earlier line; keeping the first", path, i + 1, record_id)
            needs_rewrite = True
            continue
        if isinstance(record, dict) and "error" in record:
            log.info("%s:%d: problem %s failed before (%s); solving it again", path, i + 1, record_id,
                     str(record["error"])[:200])
            needs_rewrite = True
            continue
        records[record_id] = record
        kept_lines.append(line)
    if needs_rewrite:
        _rewrite(path, kept_lines)
    return records


def check_same_problems(path: Path, done: dict[str, dict[str, Any]], examples: Sequence[Any]) -> None:
    """Raise ResultsFileError when a record in `path` holds, under a requested example's id, another
    problem's input. Most data files have no ids (an id is the line index), so a resume given
    another file (GSM8K train after test) would find "its" ids done, skip those problems and count
    the other problems' records as theirs."""
    differing = [ex for ex in examples if ex.id in done and isinstance(done[ex.id].get("input"), dict)
                 and _canonical(done[ex.id]["input"]) not in (_canonical(ex.data), _canonical(ex.data, str))]
    if not differing:
        return
    first = differing[0]
    recorded, requested = json.loads(_canonical(done[first.id]["input"])), json.loads(_canonical(first.data))
    fields = sorted(k for k in set(recorded) | set(requested) if _canonical(recorded.get(k)) != _canonical(requested.get(k)))
    raise ResultsFileError(
        f"{path}:{_line_of(path, first.id)}: the record of id {first.id!r} was made for another problem "
        f"(its {', '.join(fields)} differ{'s' * (len(fields) == 1)} from the data's); {len(differing)} of the "
        f"requested ids are in that state: resume with the data these records were made from, or pass another --output")


def json_default(value: Any) -> Any:
    """How a record spells what JSON has no type for: a set as a sorted list (str() of a set follows its
    hash order, which differs between processes, so a resume would not know its own problems), the rest
    as str()."""
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=_set_order)
    return str(value)


def _set_order(item: Any) -> tuple:
    """Numbers by value, then text, then anything else (sets of sets too) by its own canonical spelling."""
    if isinstance(item, (int, float)) and not isinstance(item, bool):
        return 0, item, ""
    if isinstance(item, str):
        return 1, 0, item
    return 2, 0, json.dumps(item, sort_keys=True, default=json_default)


def _canonical(value: Any, default=json_default) -> str:
    """One JSON spelling of a problem's input: as a record stores it (tuples as lists, keys as text).
    default=str: as records spelled sets before json_default, so that those runs still resume."""
    return json.dumps(json.loads(json.dumps(value, ensure_ascii=False, default=default)), sort_keys=True)


def _line_of(path: Path, record_id: str) -> int | None:
    """The 1-based line of `record_id`'s record (read again only to word an error)."""
    for lineno, line in enumerate(path.read_bytes().split(b"\n"), 1):
        try:
            if str(json.loads(line)["id"]) == record_id:
                return lineno
        except (ValueError, KeyError, TypeError):
            continue
    return None


def _rewrite(path: Path, lines: list[bytes]) -> None:
    """Replace the file atomically, so a crash here leaves either the old or the new file."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as fh:
        fh.write(b"".join(line + b"\n" for line in lines))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _stats_from_dict(d: dict[str, Any] | None) -> GenerationStats:
    d = d or {}
    return GenerationStats(**{name: d[name] for name in _COUNTERS if name in d})


def _rates(stats: GenerationStats) -> dict[str, Any]:
    return {"acceptance_rate": stats.acceptance_rate, "tokens_per_target_forward": stats.tokens_per_target_forward,
            "new_tokens": stats.new_tokens, "verifications": stats.verifications,
            "target_forwards": stats.target_forwards, "accepted": stats.accepted,
            "draft_depth": stats.draft_depth, "wall_s": stats.wall_s}


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def summarize_records(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """n, accuracy / mean score / mean judge score (whichever the records carry), mean wall time,
    and speculative-decoding rates overall and per phase (thought generation vs state evaluation)."""
    summary: dict[str, Any] = {"n": len(records)}
    correct = [float(bool(r["correct"])) for r in records if "correct" in r]
    if correct:
        summary["accuracy"] = _mean(correct)
    scores = [float(r["score"]) for r in records if isinstance(r.get("score"), (int, float))]
    if scores:
        summary["mean_score"] = _mean(scores)
    judged = [float(r["judge_score"]) for r in records if r.get("judge_score") is not None]
    if judged:
        summary["mean_judge_score"] = _mean(judged)
    summary["mean_wall_s"] = _mean([float(r.get("wall_s", 0.0)) for r in records])

    phases: dict[str, GenerationStats] = {}
    overall = GenerationStats()
    for record in records:
        for phase, d in (record.get("stats") or {}).items():
            s = _stats_from_dict(d)
            total = phases.setdefault(phase, GenerationStats())
            for target in (total, overall):
                target.add(s)
                target.wall_s += s.wall_s
    summary.update(_rates(overall))
    summary["tokens_per_s"] = overall.new_tokens / overall.wall_s if overall.wall_s else 0.0
    summary["phases"] = {phase: _rates(phases[phase]) for phase in SUMMARY_PHASES if phase in phases}
    applied: dict[str, int] = {}  # the token budgets the calls really got, beside the settings asked for
    for record in records:
        for phase, budget in (record.get("max_new_tokens") or {}).items():
            applied[phase] = max(int(budget), applied.get(phase, 0))
    summary["max_new_tokens_applied"] = applied
    summary.update(summarize_costs(records))  # new tokens, prompt tokens, calls per problem; problems/h
    return summary
