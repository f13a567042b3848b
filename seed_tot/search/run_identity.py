"""OUTPUT/run.json: what a results directory's records were made with, so that --resume cannot mix
records of two runs.

A record (results.jsonl) carries its problem's outcome and figures but not the settings that made
it; summary.json has them, but only once a run ends. So the first run writes run.json before its
first record (task, the settings as summary.json writes them, the model pair when known), and a
resumed run must match it: a resume with another mode, k_config, search shape or model would
otherwise append its records beside the old ones and write a summary that labels all of them with
the new settings. A directory without run.json (written before it existed) is checked against
summary.json's settings when there is one.

The data the records were made from is part of the identity too ("data", data_source.py): a resume
that reads another source is refused, naming both. A run.json written before "data" was recorded
is accepted and gets the resumed run's source added (the records' ids must still be among the
requested problems: `ResultsRecorder` refuses a resume that would only add other problems).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from seed_tot.engine.decode_spec import DRAFTING_MODES

from .data_source import describe_source, same_source
from .algorithms import unread_options
from .results_file import ResultsFileError

RUN_FILE = "run.json"
# where the settings came from, not what they are: the same settings from another file resume fine
_PROVENANCE = ("source", "task")


def run_identity(task_name: str, settings: dict[str, Any], algorithm: str,
                 models: dict[str, str] | None = None, data: dict[str, Any] | None = None,
                 endpoint: dict[str, Any] | None = None) -> dict[str, Any]:
    """The identity a run's records share (`settings`: RunSettings.to_dict(); `algorithm`: the one
    the run resolved; `models`: role -> model name, None when the caller does not know them;
    `data`: data_source.data_source(), None when the caller does not know it; `endpoint`: where the
    calls went when a server ran them (search/endpoint.py), recorded but not compared: the same model
    served at another address resumes)."""
    kept = {k: v for k, v in settings.items() if k not in _PROVENANCE}
    kept["algorithm"] = algorithm
    identity: dict[str, Any] = {"task": task_name, "settings": kept}
    if models:
        identity["models"] = dict(models)
    if data:
        identity["data"] = dict(data)
    if endpoint:
        identity["endpoint"] = dict(endpoint)
    return identity


def check_resumed_run(output_dir: str | Path, identity: dict[str, Any]) -> bool:
    """Raise ResultsFileError, naming every setting that differs and the file it was read from, when
    `identity` is not the one the directory's records were made with (`_comparable` says what counts),
    or naming both data sources when they differ. True when the directory records no data source
    (written before it was recorded) and `identity` names one: the caller records it."""
    out = Path(output_dir)
    recorded, source = _recorded(out)
    if recorded is None:
        return False
    old_data, new_data = recorded.get("data"), identity.get("data")
    if isinstance(old_data, dict) and isinstance(new_data, dict) and not same_source(old_data, new_data):
        raise ResultsFileError(f"{source}: the records in {out} were made from {describe_source(old_data)}; "
                               f"this run reads {describe_source(new_data)}: resume with the data they were "
                               f"made from, or pass another --output")
    differences = _differences(_comparable(recorded), _comparable(identity))
    if differences:
        listed = "; ".join(f"{key}: {old!r} there, {new!r} now" for key, old, new in differences)
        raise ResultsFileError(f"{source}: the records in {out} were made with other settings ({listed}); "
                               f"resume with the same settings, or pass another --output")
    return old_data is None and isinstance(new_data, dict)


def recorded_models(output_dir: str | Path) -> dict[str, str] | None:
    """The model names the directory's records were made with, when it names them."""
    recorded, _ = _recorded(Path(output_dir))
    return None if recorded is None else recorded.get("models")


def recorded_policy(output_dir: str | Path) -> str | None:
    """The draft policy run.json says ran (the engine's resolved name), when it names one."""
    recorded, _ = _recorded(Path(output_dir))
    policy = None if recorded is None else recorded.get("policy")
    return policy if isinstance(policy, str) else None


def write_run_identity(output_dir: str | Path, identity: dict[str, Any]) -> None:
    path = Path(output_dir) / RUN_FILE
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        fh.write(json.dumps(identity, indent=2, default=str) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    tmp.replace(path)  # whole or absent: a half-written run.json would refuse every resume


def _recorded(out: Path) -> tuple[dict[str, Any] | None, Path]:
    """The identity on disk (run.json, else the one summary.json implies) and the file it came from."""
    run_file, summary_file = out / RUN_FILE, out / "summary.json"
    if run_file.is_file():
        return _read(run_file), run_file
    if summary_file.is_file():
        summary = _read(summary_file)
        if isinstance(summary.get("settings"), dict):
            settings = {**summary["settings"], "algorithm": summary.get("algorithm", summary["settings"].get("algorithm"))}
            models = {role: summary[role] for role in ("target", "draft") if isinstance(summary.get(role), str)}
            return run_identity(summary.get("task"), settings, settings["algorithm"], models or None), summary_file
    return None, run_file


def _read(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ResultsFileError(f"{path}: cannot read what this run was made with ({err}); "
                               f"restore or remove the file, then resume") from None
    if not isinstance(value, dict):
        raise ResultsFileError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


# how rows share forwards and how forwards run: they change a run's speed, not what its records say
_SCHEDULING = ("n_workers", "verify_batch", "draft_batch", "attention", "compile")
_DRAFTING = ("k_config", "draft_policy", "policy_options")  # read only by modes that draft


def _comparable(identity: dict[str, Any]) -> dict[str, Any]:
    """What a record's content depends on, flat: the task, the settings but how rows are scheduled
    (and those the run's mode or algorithm never reads), and the models by file or repository name
    (the same model installed elsewhere resumes; the draft only where the mode drafts; a caller
    that does not know them names none)."""
    settings = {k: v for k, v in identity.get("settings", {}).items() if k not in _SCHEDULING}
    drafts = settings.get("mode") in DRAFTING_MODES
    if not drafts:
        settings = {k: v for k, v in settings.items() if k not in _DRAFTING}
    for name in unread_options(settings.get("algorithm", "bfs")):  # e.g. max_expansions outside DFS
        settings.pop(name, None)
    flat = _flat({"task": identity.get("task"), **settings})
    for role, name in (identity.get("models") or {}).items():
        if role == "target" or drafts:
            flat[f"models.{role}"] = Path(str(name)).name
    return flat


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"search": {"depth": 4}} -> {"search.depth": 4}; lists and tuples compare as lists (JSON's)."""
    flat: dict[str, Any] = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(_flat(value, name + "."))
        else:
            flat[name] = list(value) if isinstance(value, tuple) else value
    return flat


def _differences(old: dict[str, Any], new: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """Keys both sides have whose values differ. One side only: a setting its mode does not read
    (the mode itself then differs), a model it does not name, or a summary.json older than the setting."""
    return [(key, old[key], new[key]) for key in sorted(set(old) & set(new)) if _normal(old[key]) != _normal(new[key])]


def _normal(value: Any) -> str:
    """One spelling per value: 1, 1.0 and "1" (the CLI keeps policy options as text) are one number."""
    if isinstance(value, list):
        return "[" + ",".join(_normal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_normal(v)}" for k, v in sorted(value.items())) + "}"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return repr(float(value))
    if isinstance(value, str):
        try:
            return repr(float(value))
        except ValueError:
            return value
    return json.dumps(value, default=str)
