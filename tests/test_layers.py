"""The package's layers, over its real import graph.

Every module under ``fanout/`` is parsed (never imported) and every import it
holds becomes an edge: top-level ones, those inside functions, and those under
``if TYPE_CHECKING:`` (a type-only import still ties two modules together: it
is how a cycle hides until someone needs the name at run time).  Relative
imports are resolved against the module's package; ``from package import name``
is an edge to ``package.name`` when that is a module, else to the package.

Layers point down only: the command line is on top and nothing imports it;
``batch`` runs over ``eval``, which reads and writes through ``store``; the
service and the batch never import each other; the sans-I/O core never imports
trio or httpx; and there are no cycles.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import fanout

PACKAGE = Path(fanout.__file__).parent
ROOT = "fanout"


def _modules() -> dict[str, Path]:
    """Module name -> source file, for every module of the package."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join([ROOT, *parts])] = path
    return found


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _imports(name: str) -> Iterator[str]:
    """Every absolute module name ``name`` imports, wherever in the file."""
    path = MODULES[name]
    package = name if _is_package(name) else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                if node.level > 1:
                    base = base[:-(node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                yield f"{target}.{alias.name}"  # a submodule, if it is one
            yield target


def _graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (third-party ones aside)."""
    graph: dict[str, set[str]] = {}
    for name in MODULES:
        graph[name] = {target for target in _imports(name) if target in MODULES} - {name}
    return graph


GRAPH = _graph()


def _third_party(name: str) -> set[str]:
    return {target.split(".")[0] for target in _imports(name)}


def _in(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _cycle() -> list[str] | None:
    """One import cycle of the package, as the modules around it; ``None`` if none."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(GRAPH[node]):
            if state.get(target) == 1:
                return [*path[path.index(target):], target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(GRAPH):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_graph_sees_every_kind_of_import() -> None:
    # The walker itself: a function-level import, a TYPE_CHECKING one, a relative one.
    assert "fanout.core.sse" in GRAPH["fanout.core.chat"]
    assert "fanout.upstream.catalog" in GRAPH["fanout.config"]  # inside a function
    assert "fanout.fanout" in GRAPH["fanout"]


def test_no_import_cycles() -> None:
    cycle = _cycle()
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_nothing_outside_the_command_line_imports_it() -> None:
    offenders = sorted(f"{name} imports {target}" for name, targets in GRAPH.items()
                       if not _in(name, "fanout.cli") and name != "fanout.__main__"
                       for target in targets if _in(target, "fanout.cli"))
    assert not offenders, offenders


def test_the_core_imports_neither_trio_nor_httpx() -> None:
    for name in MODULES:
        if _in(name, "fanout.core"):
            assert not _third_party(name) & {"trio", "httpx", "httpcore", "anyio"}, name
            assert all(_in(target, "fanout.core") or target == "fanout._exceptions"
                       for target in GRAPH[name]), (name, GRAPH[name])


#: Package -> the packages it must never import.
FORBIDDEN = {
    "fanout.store": ("fanout.eval", "fanout.batch", "fanout.serve", "fanout.cli"),
    "fanout.eval": ("fanout.batch", "fanout.serve", "fanout.cli"),
    "fanout.batch": ("fanout.serve", "fanout.cli"),
    "fanout.serve": ("fanout.batch", "fanout.cli"),
    "fanout.net": ("fanout.eval", "fanout.batch", "fanout.serve", "fanout.cli",
                   "fanout.store"),
}


def test_layers_point_down() -> None:
    offenders = sorted(
        f"{name} imports {target}" for package, banned in FORBIDDEN.items()
        for name, targets in GRAPH.items() if _in(name, package)
        for target in targets if any(_in(target, b) for b in banned))
    assert not offenders, offenders


def test_the_layers_exist() -> None:
    # So the rules above are not vacuous: the packages they speak of are there.
    for package in ("fanout.store", "fanout.batch", "fanout.eval", "fanout.serve"):
        assert package in MODULES, package
    assert _is_package("fanout.batch") and _is_package("fanout.store")
