"""The package's shape: no import circle among its modules (module-level imports, the ones that
run when a module loads), no import of a deprecated module from the package or the benchmarks,
no module longer than `MAX_MODULE_LINES`, and no test module importing another."""

from __future__ import annotations

import ast
import importlib
import pathlib
import sys

import pytest

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


# Modules kept for one release as re-exports of names that moved; they warn when imported, and
# nothing in the package or the benchmarks may import them.
DEPRECATED_MODULES = {  # old module -> the home of its names
    "keras_thermo.grads": "keras_thermo.per_example",
    "keras_thermo.dense_gradients": "keras_thermo.per_example.dense_layers",
    "keras_thermo.models": "keras_thermo.networks",
    "keras_thermo._histograms": "keras_thermo.tact_histograms",
}
BENCHMARKS = PACKAGE.parent / "benchmarks"
# The one import of a deprecated module allowed: the package's `__getattr__` keeping `kt.models`.
ALLOWED_DEPRECATED_IMPORTS = {("keras_thermo/__init__.py", "keras_thermo.models")}


def imported_modules(path: pathlib.Path) -> set[str]:
    """Every module `path` imports anywhere (module level or inside functions), as dotted names:
    `import a.b` gives `a.b`; `from a import b` gives `a` and `a.b`."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def deprecated_imports(roots=(PACKAGE, BENCHMARKS)) -> list[str]:
    """`"<file> imports <module>"` for each import of a deprecated module under `roots` (the
    deprecated modules themselves left out), files named relative to their root's parent."""
    bad = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            if root == PACKAGE and _module_name(path) in DEPRECATED_MODULES:
                continue
            where = path.relative_to(root.parent).as_posix()
            for name in sorted(imported_modules(path) & set(DEPRECATED_MODULES)):
                if (where, name) not in ALLOWED_DEPRECATED_IMPORTS:
                    bad.append(f"{where} imports {name}")
    return bad


def test_nothing_in_the_package_or_benchmarks_imports_a_deprecated_module():
    assert deprecated_imports() == []


def test_the_deprecated_import_finder_finds_them(tmp_path):
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "a.py").write_text("def f():\n    from keras_thermo import grads\n")
    (root / "b.py").write_text("import keras_thermo.dense_gradients as d\n")
    (root / "c.py").write_text("from keras_thermo.per_example import dense_layers\n")
    assert deprecated_imports([root]) == [
        "pkg/a.py imports keras_thermo.grads",
        "pkg/b.py imports keras_thermo.dense_gradients",
    ]


@pytest.mark.parametrize("old", sorted(DEPRECATED_MODULES))
def test_a_deprecated_module_warns_on_import_and_re_exports_the_same_names(old):
    new = importlib.import_module(DEPRECATED_MODULES[old])
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} is deprecated.*{DEPRECATED_MODULES[old]}") as caught:
        __import__(old)  # an import statement's call, with no importlib frame of its own
    assert [w.filename for w in caught] == [__file__]  # points at the importing line
    module = sys.modules[old]
    assert module.__all__
    for name in module.__all__:
        assert getattr(module, name) is getattr(new, name), name


def test_the_old_attribute_kt_models_warns_where_it_is_used():
    import keras_thermo  # noqa: PLC0415

    sys.modules.pop("keras_thermo.models", None)
    vars(keras_thermo).pop("models", None)
    with pytest.warns(DeprecationWarning, match="keras_thermo.models is deprecated") as caught:
        builder = keras_thermo.models.digits_mlp
    assert [w.filename for w in caught] == [__file__]
    assert builder is keras_thermo.networks.digits_mlp


MAX_MODULE_LINES = 600
# Modules still over the limit, each with its planned split; remove an entry once it is split.
LONG_MODULES: set[str] = set()


def long_modules(root: pathlib.Path = PACKAGE, limit: int = MAX_MODULE_LINES) -> dict[str, int]:
    """`{path relative to root's parent: line count}` of the modules under `root` over `limit`."""
    lengths = {p.relative_to(root.parent).as_posix(): len(p.read_text().splitlines()) for p in root.rglob("*.py")}
    return {path: count for path, count in sorted(lengths.items()) if count > limit}


def test_no_package_module_is_longer_than_the_limit():
    assert {p: n for p, n in long_modules().items() if p not in LONG_MODULES} == {}


def test_every_listed_long_module_is_still_long():  # a stale entry would let a split module grow back
    assert LONG_MODULES <= set(long_modules())


def test_the_long_module_finder_counts_lines(tmp_path):
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "short.py").write_text("x = 1\n" * 3)
    (root / "long.py").write_text("x = 1\n" * 4)
    assert long_modules(root, limit=3) == {"pkg/long.py": 4}


TESTS = PACKAGE.parent / "tests"


def cross_test_imports(root: pathlib.Path = TESTS) -> list[str]:
    """`"<test file> imports <test module>"` for each import, anywhere in a `test_*.py` under `root`,
    of another of them (shared pieces belong in a helpers module)."""
    names = {path.stem for path in root.glob("test_*.py")}
    return [
        f"{path.name} imports {module}"
        for path in sorted(root.glob("test_*.py"))
        for module in sorted({name.split(".")[0] for name in imported_modules(path)} & (names - {path.stem}))
    ]


def test_no_test_module_imports_another():
    assert cross_test_imports() == []


def test_the_test_import_finder_finds_them(tmp_path):
    (tmp_path / "test_a.py").write_text("def f():\n    import test_b\n")
    (tmp_path / "test_b.py").write_text("from test_a import helper\nimport test_b\n")
    (tmp_path / "test_c.py").write_text("from helpers import regression_model\nimport tests_data\n")
    assert cross_test_imports(tmp_path) == ["test_a.py imports test_b", "test_b.py imports test_a"]
