"""The package's shape: no import circle among its modules (module-level imports, the ones that
run when a module loads)."""

from __future__ import annotations

import ast
import pathlib

import keras_thermo

PACKAGE = pathlib.Path(keras_thermo.__file__).parent


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: pathlib.Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the package's modules it imports at module level (`import a.b`, `from a import b`
    where `a.b` is a module, `from a.b import name`)."""
    modules = {_module_name(p): p for p in root.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        found = set()
        for node in ast.parse(path.read_text()).body:  # module level only
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
            else:
                continue
            for target in targets:
                if target in modules and target != name:
                    found.add(target)
        # A package's __init__ is imported with any of its submodules: not a circle by itself.
        graph[name] = {t for t in found if not name.startswith(t + ".")}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of `graph` (as a path that returns to its start), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_the_package_has_no_import_circle():
    assert find_cycle(import_graph()) is None, find_cycle(import_graph())


def test_the_circle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
