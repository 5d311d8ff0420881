"""The package and the benchmarks import without cycles: each module only from modules that do not import it back.

Every ``import`` statement counts, wherever it stands (module level, inside a function, under ``TYPE_CHECKING``),
because a loop that only shows at type-checking or call time still ties two modules into one. ``from pkg import
name`` counts as an import of ``pkg.name`` where that is a module, else of ``pkg``; importing ``a.b.c`` does not
count as importing the packages ``a`` and ``a.b`` (every submodule does that; their ``__init__`` files would
otherwise close a loop with every re-exported module).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOP_LEVEL = ("lightning_zerocopy", "benchmarks")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for top in TOP_LEVEL for p in sorted((ROOT / top).rglob("*.py"))}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The known modules that ``path`` (module ``name``) imports, anywhere in its body."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `import a.b.c` where only a.b is ours, e.g. a class path
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), each as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_the_cycle_finder_finds_a_loop_and_passes_a_chain() -> None:
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_a_function_level_or_type_checking_import_is_an_edge(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .plan import BatchPlan\n"
        "def f():\n    from lightning_zerocopy import ops\n    import lightning_zerocopy.data.hooks.x\n"
    )
    known = {"lightning_zerocopy.data.plan", "lightning_zerocopy.ops", "lightning_zerocopy.data.hooks"}
    assert _imports("lightning_zerocopy.data.m", module, known) == known


@pytest.mark.parametrize("top", TOP_LEVEL)
def test_no_import_cycles(top: str) -> None:
    modules = _modules()
    known = set(modules)
    graph = {name: _imports(name, path, known) for name, path in modules.items()}
    cycles = [group for group in import_cycles(graph) if any(m.split(".")[0] == top for m in group)]
    assert not cycles, "import loops (move what both sides need into a module both can import): " + "; ".join(
        " <-> ".join(group) for group in cycles
    )


def _package(module: str) -> str:
    """The room of ``module``: ``lightning_zerocopy.<package or top-level module>``, or ``lightning_zerocopy`` for
    the root ``__init__`` (which re-exports lazily, by name, so it imports no package)."""
    return ".".join(module.split(".")[:2])


def test_the_package_rooms_import_each_other_without_a_loop() -> None:
    """The layers of docs/ARCHITECTURE.md: a package (``cache/``, ``data/``, ...) or top-level module imports only
    rooms below it, so no two of them reach each other, even through modules that do not form a loop themselves."""
    modules = {name: path for name, path in _modules().items() if name.split(".")[0] == "lightning_zerocopy"}
    known = set(modules)
    rooms: dict[str, set[str]] = {}
    why: dict[tuple[str, str], str] = {}
    for name, path in modules.items():
        for target in _imports(name, path, known):
            a, b = _package(name), _package(target)
            if a != b:
                rooms.setdefault(a, set()).add(b)
                why.setdefault((a, b), f"{name} -> {target}")
    loops = import_cycles(rooms)
    assert not loops, "packages that import each other (move what both need below both): " + "; ".join(
        " <-> ".join(group) + " (" + ", ".join(why[(a, b)] for a in group for b in group if (a, b) in why) + ")"
        for group in loops
    )
