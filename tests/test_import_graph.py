"""The layers of the project, checked from the source: every import (a function's lazy ones too)
between the project's modules, with no cycles and nothing pointing up.

    app.py  ->  racer_app  ->  visuals  ->  racer        (racer.cpu: the CPU backend, inside racer)

A package's own __init__ importing its submodules (re-exports) is not an edge of the graph: it
runs when any of them is imported, so counting it would make every package a cycle.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("racer", "visuals", "racer_app")
#: What each layer may import from the project (itself always).
ALLOWED = {"racer": {"racer"}, "visuals": {"visuals", "racer"}, "racer_app": {"racer_app", "visuals", "racer"},
           "app": {"app", "racer_app", "visuals", "racer"}}


def module_files() -> dict[str, Path]:
    mods = {"app": ROOT / "app.py"}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = path
    return mods


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Project modules that `name` imports anywhere in its source."""
    is_pkg = path.name == "__init__.py"
    here = name if is_pkg else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            # `from pkg import sub` imports the submodule; `from mod import name` the module.
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod for a in node.names]
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name and not (is_pkg and t.startswith(name + ".")):
                out.add(t)
    return out


def graph() -> dict[str, set[str]]:
    files = module_files()
    known = set(files)
    return {name: imports_of(name, path, known) for name, path in files.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return found


def test_the_checker_sees_imports_of_every_form(tmp_path):
    src = tmp_path / "racer"
    (src / "cpu").mkdir(parents=True)
    (src / "__init__.py").write_text("from .loop import run\n")
    (src / "loop.py").write_text("def run():\n    from . import cpu\n    from .cpu.linear import k\n    import visuals\n")
    (src / "cpu" / "__init__.py").write_text("from . import linear\n")
    (src / "cpu" / "linear.py").write_text("from ..loop import run\n")
    files = {"racer": src / "__init__.py", "racer.loop": src / "loop.py", "racer.cpu": src / "cpu" / "__init__.py",
             "racer.cpu.linear": src / "cpu" / "linear.py", "visuals": src / "loop.py"}
    known = set(files)
    g = {n: imports_of(n, p, known) for n, p in files.items() if n != "visuals"}
    assert g["racer.loop"] == {"racer.cpu", "racer.cpu.linear", "visuals"}
    assert g["racer.cpu"] == set()                      # its own submodule: a re-export, not an edge
    assert g["racer.cpu.linear"] == {"racer.loop"}
    assert cycles(g) == [["racer.cpu.linear", "racer.loop"]]


def test_no_import_cycles():
    assert cycles(graph()) == []


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_imports_only_point_down(layer):
    bad = sorted((m, t) for m, ts in graph().items() if m.split(".")[0] == layer
                 for t in ts if t.split(".")[0] not in ALLOWED[layer])
    assert bad == [], f"{layer} imports a layer above it: {bad}"


def test_nothing_imports_the_tests():
    files = module_files()
    bad = [name for name, path in files.items()
           for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
           if isinstance(node, ast.Import) or (isinstance(node, ast.ImportFrom) and node.level == 0)
           if any((n or "").split(".")[0] in ("tests", "tiny", "conftest")
                  for n in ([a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]))]
    assert bad == []
