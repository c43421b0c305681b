"""The public namespace, and the sans-I/O promise of the core."""

from __future__ import annotations

import ast
import subprocess
import sys
import types
from pathlib import Path

import fanout
import fanout.core

PACKAGE = Path(fanout.__file__).parent


def test_all_is_exactly_the_public_namespace() -> None:
    public = {name for name, value in vars(fanout).items()
              if not name.startswith("_") and not isinstance(value, types.ModuleType)}
    assert public == set(fanout.__all__)
    assert len(fanout.__all__) == len(set(fanout.__all__))


def _source_docstring(obj: object) -> str | None:
    """The docstring of ``obj``'s definition in its module's source."""
    module = sys.modules[obj.__module__]  # type: ignore[attr-defined]
    source = Path(module.__file__ or "").with_name(module.__name__.rpartition(".")[2] + ".py")
    for node in ast.parse(source.read_text()).body:
        if (isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                and node.name == obj.__name__):  # type: ignore[attr-defined]
            return ast.get_docstring(node)
    return None


def test_every_public_name_has_a_docstring() -> None:
    # mypyc keeps a compiled class's or function's signature, not its docstring: on the
    # compiled core the text is in the source (and the documentation site) only.
    for name in fanout.__all__:
        obj = getattr(fanout, name)
        if callable(obj):
            assert obj.__doc__ or (fanout.core.COMPILED and _source_docstring(obj)), name


def _imported_modules(path: Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.add(node.module.split(".")[0])
    return modules


def test_core_sources_import_no_io_library() -> None:
    # regex: user patterns matched with a time limit (core.patterns); no I/O either.
    allowed_third_party = {"attrs", "orjson", "jsonschema", "regex"}
    for path in (PACKAGE / "core").glob("*.py"):
        third_party = _imported_modules(path) - set(sys.stdlib_module_names)
        assert third_party <= allowed_third_party, (path.name, third_party)


def test_only_the_command_line_imports_rich() -> None:
    # Embedding fanout in a trio app never drags in a terminal UI.
    for path in PACKAGE.rglob("*.py"):
        if "cli" not in path.relative_to(PACKAGE).parts:
            assert "rich" not in _imported_modules(path), path
    # httpx loads its own command line (click, rich) when click is installed (Ray's
    # extra brings it): blocked here, so what is checked is what fanout itself imports.
    script = ("import sys; sys.modules['click'] = None\n"
              "import fanout, fanout.upstream; assert 'rich' not in sys.modules")
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)


def test_core_runs_with_trio_and_httpx_unimportable() -> None:
    # A fresh interpreter where importing trio or httpx fails; the core must not care.
    script = f"""
import importlib.abc, sys, types

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('trio', 'httpx', 'httpcore', 'anyio'):
            raise ImportError('blocked: ' + name)
        return None

sys.meta_path.insert(0, Block())
package = types.ModuleType('fanout')
package.__path__ = [{str(PACKAGE)!r}]
sys.modules['fanout'] = package
from fanout.core.parser import parse_stream
result = parse_stream([b'data: {{"choices":[{{"index":0,"delta":{{"content":"ok"}},"finish_reason":"stop"}}]}}\\n\\n',
                       b'data: [DONE]\\n\\n'])
assert result.text == 'ok' and result.outcome == 'completed', result
loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('trio', 'httpx', 'httpcore'))
assert not loaded, loaded
print('core ok')
"""
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "core ok"
