"""Layers point one way (issue 43): no import cycles among seed_tot's modules, click only in the
command-line modules, and no module reaching into another's private names. Read from the source
with ast, so the check imports nothing and counts deferred (function-level) imports too: a cycle
that only a deferred import closes is still two modules that cannot be read apart."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KNOWN_CYCLES: list[set[str]] = []  # none may remain


def _modules() -> dict[str, tuple[ast.Module, bool]]:
    """Every module of the installed package seed_tot, by dotted name (tasks/ installs as seed_tot.tasks)."""
    trees = [("seed_tot", ROOT / "seed_tot"), ("seed_tot.tasks", ROOT / "tasks")]
    modules = {}
    for prefix, folder in trees:
        for path in folder.rglob("*.py"):
            parts = prefix.split(".") + list(path.relative_to(folder).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            modules[".".join(parts[:-1] if is_package else parts)] = (ast.parse(path.read_text(encoding="utf-8")), is_package)
    return modules


def _imported(name: str, tree: ast.Module, is_package: bool) -> set[str]:
    """The dotted names a module imports anywhere in its source, relative imports resolved."""
    package = name if is_package else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {}
    for name, (tree, is_package) in modules.items():
        edges = set()
        for target in _imported(name, tree, is_package):
            while target and target not in modules:  # `from pkg import name`: the module that holds it
                target = target.rpartition(".")[0]
            # a package re-exporting its own submodules is how a package works, not a cycle
            if target and target != name and not (is_package and target.startswith(name + ".")):
                edges.add(target)
        graph[name] = edges
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def test_no_import_cycles():
    cycles = [sorted(c) for c in _cycles(_graph()) if c not in KNOWN_CYCLES]
    assert cycles == []


def test_the_engine_does_not_import_click():
    offenders = sorted(name for name, (tree, is_package) in _modules().items()
                       if name.startswith("seed_tot.engine")
                       and any(i.split(".")[0] == "click" for i in _imported(name, tree, is_package)))
    assert offenders == [], f"click belongs in seed_tot/cli.py and cli_options.py, not {offenders}"


def test_no_module_imports_another_modules_private_names():
    offenders = []
    for name, (tree, _) in _modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("seed_tot")):
                offenders += [f"{name}: {node.module}.{a.name}" for a in node.names
                              if a.name.startswith("_") and not a.name.startswith("__")]
    assert offenders == []


def test_the_search_imports_neither_the_viewer_nor_the_server():
    """The search records what the page shows (a record's node_work) and the page reads it: nothing under
    seed_tot/search/ may import seed_tot.view or seed_tot.serve, deferred imports included."""
    banned = ("seed_tot.view", "seed_tot.serve")
    offenders = sorted(f"{name} imports {target}" for name, (tree, is_package) in _modules().items()
                       if name == "seed_tot.search" or name.startswith("seed_tot.search.")
                       for target in _imported(name, tree, is_package)
                       if any(target == b or target.startswith(b + ".") for b in banned))
    assert offenders == [], offenders
