"""Run settings: a task's `SearchConfig`, overridden by a YAML file, overridden by the command line.

The YAML file is flat (see configs/*.yaml): search keys (depth, n_generate, breadth, temperature,
max_new_tokens, value_threshold, extra), decoding keys (mode, k_config, n_workers, verify_batch,
draft_batch, draft_policy, policy_options: one DecodeSpec, engine/decode_spec.py, which checks them),
seed and run keys (algorithm, max_expansions, task; samples for cot-sc; iterations, exploration,
parallel_leaves, mcts_answer for mcts) and engine keys (attention: gather or pool; compile: auto, on or
off; engine/engine_settings.py: how forwards run, never what they give). An unknown key is an error rather than
silently ignored, because a typo such as `bredth: 5` would otherwise run the default search.
"""
from __future__ import annotations

import copy
import dataclasses
import warnings
from importlib import resources
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Hashable, Mapping

import yaml

from seed_tot.engine.engine_settings import ATTENTION_PATHS, COMPILE_WORDS, DEFAULT_ATTENTION, DEFAULT_COMPILE
from seed_tot.engine.decode_spec import SETTINGS as DECODE_SETTINGS
from seed_tot.engine.decode_spec import DecodeSpec, DecodeSpecError

from .algorithms import ALGORITHMS
from .dfs import DEFAULT_MAX_EXPANSIONS
from .llm import DecodingSettings
from .mcts import ANSWER_CHOICES, MCTSConfig
from .protocol import SearchConfig

DEFAULT_SAMPLES = 5  # cot-sc's k


class ConfigError(ValueError):
    """A bad settings file or override; the message names the file (or the command line) and key."""


@dataclass(init=False)
class RunSettings:
    """Everything `solve_dataset` needs besides the engine, the task and the examples. `decode` is
    the run's DecodeSpec: every engine call of the run gets this object. Its settings read as
    attributes here too (settings.mode is settings.decode.mode)."""

    search: SearchConfig
    algorithm: str
    decode: DecodeSpec
    seed: int
    max_expansions: int  # DFS only
    samples: int  # cot-sc: chains voted on
    iterations: int  # mcts: select-expand-backprop rounds
    exploration: float  # mcts: UCT's c
    parallel_leaves: int  # mcts: leaves expanded per iteration (rows of m leaves per engine call)
    mcts_answer: str  # mcts: the answer path follows the most "visits" or the best mean "value"
    attention: str  # how batched forwards read the KV pool: gather or pool (engine_settings.py)
    compile: str  # whether fixed-shape forwards are compiled: auto (on CUDA), on or off
    task: str | None  # the task a config file was written for (informational)
    source: str | None  # the YAML file these settings came from

    def __init__(self, search: SearchConfig | None = None, algorithm: str = "bfs", decode: DecodeSpec | None = None,
                 seed: int = 0, max_expansions: int = DEFAULT_MAX_EXPANSIONS, task: str | None = None,
                 source: str | None = None, samples: int = DEFAULT_SAMPLES,
                 iterations: int = MCTSConfig.iterations, exploration: float = MCTSConfig.exploration,
                 parallel_leaves: int = MCTSConfig.parallel_leaves, mcts_answer: str = MCTSConfig.answer,
                 attention: str = DEFAULT_ATTENTION, compile: str = DEFAULT_COMPILE, **legacy: Any):
        if legacy:  # RunSettings(mode=..., k_config=..., ...): the fields it had before `decode`
            warnings.warn(f"RunSettings({', '.join(f'{k}=' for k in legacy)}...) is deprecated: pass "
                          f"decode=DecodeSpec(...)", DeprecationWarning, stacklevel=2)
            decode = (decode or DecodeSpec()).replace(**legacy)
        self.search = search if search is not None else SearchConfig()
        self.algorithm, self.decode, self.seed = algorithm, decode or DecodeSpec(), seed
        self.max_expansions, self.task, self.source = max_expansions, task, source
        self.samples, self.iterations, self.exploration = samples, iterations, exploration
        self.parallel_leaves, self.mcts_answer = parallel_leaves, mcts_answer
        self.attention, self.compile = attention, compile

    def decoding(self) -> DecodingSettings:
        return DecodingSettings(self.decode, temperature=self.search.temperature,
                                max_new_tokens=self.search.max_new_tokens, seed=self.seed,
                                draft_invariant=self.search.draft_invariant)

    def to_dict(self) -> dict[str, Any]:
        """JSON values, flat as a config file is (summary.json's "settings")."""
        d: dict[str, Any] = {"search": dataclasses.asdict(self.search), "algorithm": self.algorithm,
                             **self.decode.to_dict()}
        d.update((f.name, getattr(self, f.name)) for f in dataclasses.fields(self) if f.name not in (*d, "decode"))
        return d


for _name in DECODE_SETTINGS:  # read-only: a new spec comes from apply_overrides or dataclasses.replace
    setattr(RunSettings, _name, property(lambda self, name=_name: getattr(self.decode, name),
                                         doc=f"decode.{_name}"))


def _positive_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"expected a positive integer, got {value!r}")
    return value


def _integer(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer, got {value!r}")
    return value


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"expected a number, got {value!r}")
    return float(value)


def _temperature(value: Any) -> float:
    t = _number(value)
    if t < 0:
        raise ValueError(f"expected a number >= 0 (0 = greedy), got {value!r}")
    return t


def _non_negative(value: Any) -> float:
    number = _number(value)
    if number < 0:
        raise ValueError(f"expected a number >= 0, got {value!r}")
    return number


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {value!r}")
    return value


def _one_of(choices: tuple[str, ...]) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {value!r}")
        return value
    return check


def _compile_word(value: Any) -> str:
    # YAML 1.1 reads a bare on / off as true / false: they mean the words written
    if isinstance(value, bool):
        return "on" if value else "off"
    return _one_of(tuple(COMPILE_WORDS))(value)


def _mapping(value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"expected a mapping, got {value!r}")
    return dict(value)


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {value!r}")
    return value


# key -> (checker, whether it lives on SearchConfig); the decoding keys are DecodeSpec's to check
_KEYS: dict[str, tuple[Callable[[Any], Any], bool]] = {
    "depth": (_positive_int, True),
    "n_generate": (_positive_int, True),
    "breadth": (_positive_int, True),
    "temperature": (_temperature, True),
    "draft_invariant": (_flag, True),
    "max_new_tokens": (_positive_int, True),
    "value_threshold": (_number, True),
    "extra": (_mapping, True),
    "algorithm": (_one_of(ALGORITHMS), False),
    "seed": (_integer, False),
    "max_expansions": (_positive_int, False),
    "samples": (_positive_int, False),
    "iterations": (_positive_int, False),
    "exploration": (_non_negative, False),
    "parallel_leaves": (_positive_int, False),
    "mcts_answer": (_one_of(ANSWER_CHOICES), False),
    "task": (_text, False),
    "attention": (_one_of(ATTENTION_PATHS), False),
    "compile": (_compile_word, False),
}
SETTING_KEYS = (*_KEYS, *DECODE_SETTINGS)


def _copy(settings: RunSettings) -> RunSettings:
    search = dataclasses.replace(settings.search, extra=dict(settings.search.extra))
    return dataclasses.replace(settings, search=search)


def _apply(settings: RunSettings, values: Mapping[str, Any], source: str, skip_none: bool,
           known_extra: frozenset[str] | None = None, lines: Mapping[Any, int] | None = None) -> RunSettings:
    """`lines`: a file's key -> its 1-based line ("extra.KEY" for a task option), so that an error
    names the line as well as the file."""
    lines = lines or {}
    updated = _copy(settings)
    for key, raw in values.items():
        where = f"{source}:{lines[key]}" if key in lines else source
        if key not in SETTING_KEYS:
            raise ConfigError(f"{where}: unknown key {key!r}; known keys: {', '.join(SETTING_KEYS)}")
        if raw is None and skip_none:
            continue
        if key in DECODE_SETTINGS:
            try:
                updated.decode = updated.decode.replace(**{key: raw})
            except DecodeSpecError as err:
                raise ConfigError(f"{where}: key {key!r}: {err}") from None
            continue
        check, on_search = _KEYS[key]
        try:
            value = check(raw)
        except ValueError as err:
            raise ConfigError(f"{where}: key {key!r}: {err}") from None
        if key == "extra":  # merged, so a file can set one task option and keep the others
            unknown = sorted(set(value) - known_extra) if known_extra is not None else []
            if unknown:  # a task option the task never reads would be recorded but do nothing
                where = f"{source}:{lines[f'extra.{unknown[0]}']}" if f"extra.{unknown[0]}" in lines else where
                raise ConfigError(f"{where}: extra key(s) {', '.join(map(repr, unknown))} are not options of "
                                  f"this task; its options: {', '.join(sorted(known_extra)) or 'none'}")
            updated.search.extra.update(value)
        else:
            setattr(updated.search if on_search else updated, key, value)
    return updated


def shipped_config(task_name: str) -> Path | None:
    """The YAML file shipped for a built-in task (configs/TASK.yaml in the repository, installed as
    the `seed_tot.configs` package data), or None when there is none for this task."""
    try:
        root = resources.files("seed_tot.configs")
    except ModuleNotFoundError:  # a source tree on sys.path without any install
        root = Path(__file__).resolve().parents[2] / "configs"
    path = Path(str(root / f"{task_name}.yaml"))
    return path if path.is_file() else None


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.safe_load, except that a key given twice in one mapping is an error: PyYAML keeps the
    last value silently, so `depth: 2` above a forgotten `depth: 6` would run depth 6."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            if not isinstance(key, Hashable):
                continue  # SafeLoader's own construct_mapping refuses it with its mark
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    f"key {key!r} on line {seen[key]}", node.start_mark,
                    f"key {key!r} again; give each key once", key_node.start_mark)
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def _key_lines(text: str) -> dict[Any, int]:
    """The 1-based line of each top-level key of a parsed YAML mapping, and of each key of its
    `extra` mapping as "extra.KEY" (the values' checks come after parsing, where yaml's marks are gone)."""
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    lines: dict[Any, int] = {}
    if not isinstance(root, yaml.MappingNode):
        return lines
    for key_node, value_node in root.value:
        if isinstance(key_node, yaml.ScalarNode):
            lines[key_node.value] = key_node.start_mark.line + 1
            if key_node.value == "extra" and isinstance(value_node, yaml.MappingNode):
                for sub_key, _ in value_node.value:
                    if isinstance(sub_key, yaml.ScalarNode):
                        lines[f"extra.{sub_key.value}"] = sub_key.start_mark.line + 1
    return lines


def load_settings(path: str | Path | None, base: SearchConfig | None = None, task_name: str | None = None) -> RunSettings:
    """Settings from `base` (the task's own config; SearchConfig() when None) and the YAML file at
    `path` (None: no file). Raises ConfigError naming the file and key for any bad value, for an
    `extra` key that `base.extra` does not define (the task would never read it), and for a
    `task:` key naming another task than `task_name`."""
    settings = RunSettings(search=dataclasses.replace(base, extra=dict(base.extra)) if base else SearchConfig())
    if path is None:
        return settings
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"{file}: cannot read the config file ({err.strerror or err})") from None
    except UnicodeDecodeError as err:
        line = file.read_bytes().count(b"\n", 0, err.start) + 1
        raise ConfigError(f"{file}:{line}: not UTF-8 text; save the config file as UTF-8") from None
    try:
        values = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.MarkedYAMLError as err:
        # yaml's own text names "<unicode string>" for the file; say the file, line and column
        mark = err.problem_mark or err.context_mark
        where = f"{file}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(file)
        what = "; ".join(part for part in (err.context, err.problem) if part)
        raise ConfigError(f"{where}: not valid YAML ({what})") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{file}: not valid YAML: {err}") from None
    if values is None:
        values = {}
    if not isinstance(values, dict):
        raise ConfigError(f"{file}: expected a mapping of settings (key: value), got {type(values).__name__}")
    lines = _key_lines(text)
    settings = _apply(settings, values, str(file), skip_none=False,
                      known_extra=frozenset(base.extra) if base is not None else None, lines=lines)
    if task_name is not None and settings.task is not None and settings.task != task_name:
        where = f"{file}:{lines['task']}" if "task" in lines else str(file)
        raise ConfigError(f"{where}: written for task {settings.task!r}, not {task_name!r}; "
                          f"pass a config for {task_name} (or drop its 'task' key)")
    settings.source = str(file)
    return settings


def with_search_config(task: Any, search: SearchConfig) -> Any:
    """The task reading the run's `search` config: every prompt budget, depth check and task
    option then comes from the settings being run, not from the task's built-in defaults. The
    caller's task object is left alone (a shallow copy gets the config)."""
    if task.config is search:
        return task
    configured = copy.copy(task)
    configured.config = search
    return configured


def apply_overrides(settings: RunSettings, overrides: Mapping[str, Any] | None = None, **more: Any) -> RunSettings:
    """A copy of `settings` with command-line values on top; a None value is "not given" and
    leaves the setting alone. Unknown keys raise ConfigError."""
    values = {**(overrides or {}), **more}
    return _apply(settings, values, "command line", skip_none=True)
