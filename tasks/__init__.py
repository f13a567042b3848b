"""Built-in ToT tasks, written only against the public `seed_tot.search.protocol.Task` protocol,
and the lookup that also finds a user's own tasks (the way lm-eval's --include_path and plugins do):

- a built-in name: gsm8k, creative_writing, blocksworld;
- `path/to/file.py:ClassName`: a class in a Python file;
- `package.module:ClassName`: a class in an importable module;
- a name that an installed package registers in the `seed_tot.tasks` entry-point group, e.g. in
  its pyproject.toml: `[project.entry-points."seed_tot.tasks"]  game24 = "mypkg.game24:Game24"`.

A class (or any callable) is called without arguments to build the task.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import inspect
import sys
import traceback
import zlib
from pathlib import Path
from typing import Any

from seed_tot.search.protocol import SearchConfig, Task

TASK_NAMES = ("gsm8k", "creative_writing", "blocksworld")
ENTRY_POINT_GROUP = "seed_tot.tasks"


class TaskNotFound(ValueError):
    """A task spec that names no task; the message says what was tried."""


def get_task(name: str) -> Task:
    """A task from a spec (see the module docstring); "creative-writing" == "creative_writing"."""
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
    if ":" in name:
        where, _, attr = name.rpartition(":")
        return _build(_load_attr(where, attr), name)
    plugins = {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    if name in plugins:
        return _build(plugins[name].load(), f"{name} (entry point {plugins[name].value})")
    registered = f"; registered by installed packages: {', '.join(sorted(plugins))}" if plugins else ""
    raise TaskNotFound(f"unknown task {name!r}; expected one of {', '.join(TASK_NAMES)}, "
                       f"path/to/file.py:ClassName, package.module:ClassName{registered}")


def _load_attr(where: str, attr: str) -> Any:
    if not attr:
        raise TaskNotFound(f"task {where}:{attr!r}: expected FILE.py:ClassName or module:ClassName")
    if where.endswith(".py"):
        module = _import_file(Path(where))
    else:
        try:
            module = importlib.import_module(where)
        except ModuleNotFoundError as err:
            raise TaskNotFound(f"task {where}:{attr}: no module named {err.name!r} "
                               f"(a file path must end in .py)") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise TaskNotFound(f"task {where}:{attr}: {where} defines no {attr!r}") from None


def _import_file(path: Path) -> Any:
    if not path.is_file():
        raise TaskNotFound(f"task file {path}: no such file")
    # A name of its own, so the user's file can never shadow or replace a real module.
    module_name = f"seed_tot_user_task_{zlib.crc32(str(path.resolve()).encode()):08x}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    # The file's own directory on sys.path, so it can import its sibling modules.
    sys.path.insert(0, str(path.resolve().parent))
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as err:  # the file's own mistake: one line naming where, not a traceback
        del sys.modules[module_name]
        where = err.filename if err.filename and Path(err.filename).resolve() != path.resolve() else path  # or an import
        raise TaskNotFound(f"task file {where}:{err.lineno}: not valid Python ({err.msg})") from None
    except ImportError as err:  # an import the file makes: the module is not installed
        del sys.modules[module_name]
        raise TaskNotFound(f"task file {path}:{_line_in(err, path)}: {err} (install it, or fix the import)") from None
    except BaseException:
        del sys.modules[module_name]
        raise
    finally:
        sys.path.remove(str(path.resolve().parent))
    return module


def _line_in(err: BaseException, path: Path) -> int | str:
    """The line of `path` that `err` was raised from (its innermost frame in that file)."""
    line: int | str = "?"
    for frame, lineno in traceback.walk_tb(err.__traceback__):
        if Path(frame.f_code.co_filename).resolve() == path.resolve():
            line = lineno
    return line


def _build(factory: Any, spec: str) -> Task:
    if not callable(factory):
        raise TaskNotFound(f"task {spec}: {factory!r} is not a class")
    try:
        inspect.signature(factory).bind()
    except TypeError as err:
        raise TaskNotFound(f"task {spec}: the class is called without arguments to build the task, but {err}; "
                           f"give its parameters defaults") from None
    except ValueError:  # no signature to read (a builtin): call it and see
        pass
    task = factory()
    missing = [m for m in ("name", "config", "load", "thought_prompt", "extend", "value_prompt", "parse_value",
                           "is_final", "answer_prompt", "prediction", "score") if not hasattr(task, m)]
    if missing:
        raise TaskNotFound(f"task {spec}: not a seed_tot Task, it lacks {', '.join(missing)} "
                           f"(see seed_tot/search/protocol.py)")
    if not isinstance(task.config, SearchConfig):  # a dict failed later as "no attribute 'extra'"
        raise TaskNotFound(f"task {spec}: its config is a {type(task.config).__name__} ({task.config!r}); "
                           f"expected a SearchConfig(depth=..., ...) from seed_tot.search.protocol")
    return task
