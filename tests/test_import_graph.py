"""No import circle between the project's modules (issue 31), counting every import: top-level,
inside functions and under ``TYPE_CHECKING``. Read from the source with ``ast``, so a lazy
import that would close a circle at run time is caught before any code path reaches it."""

from __future__ import annotations

import ast
from pathlib import Path

from prefixcache.experiments.figures.common import REPO_ROOT

# folder in the repository -> the package it is installed as (pyproject's package-dir)
PACKAGES = {
    "prefixcache": "prefixcache",
    "backends": "prefixcache.backends",
    "kernels": "prefixcache.kernels",
    "experiments": "prefixcache.experiments",
}


def modules() -> dict[str, Path]:
    out = {}
    for folder, package in PACKAGES.items():
        for path in (REPO_ROOT / folder).rglob("*.py"):
            parts = [p for p in path.relative_to(REPO_ROOT / folder).with_suffix("").parts if p != "__init__"]
            out[".".join([package, *parts])] = path
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            continue
        found.update(t for t in targets if t in known and t != name)
    return found


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        while work:
            v, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in stack:
                    low[v] = min(low[v], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_no_module_imports_itself_through_others() -> None:
    known = modules()
    assert len(known) > 100 and "prefixcache.backends.radix.radix_cache" in known
    graph = {name: imports(name, path, known) for name, path in known.items()}
    assert "prefixcache.backends.radix.radix_cache" in graph["prefixcache.backends.radix.components.swa"]
    assert circles(graph) == []


def test_the_walk_finds_a_circle_through_a_lazy_import(tmp_path: Path) -> None:
    """The check itself: imports inside functions, under TYPE_CHECKING and relative ones count,
    and a circle through them is found."""
    lazy = tmp_path / "lazy.py"
    lazy.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n"
        "def f():\n    from . import c\n    import pkg.d\n"
    )
    known = {name: lazy for name in ("pkg.a", "pkg.b", "pkg.c", "pkg.d")}
    assert imports("pkg.a", lazy, known) == {"pkg.b", "pkg.c", "pkg.d"}
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
