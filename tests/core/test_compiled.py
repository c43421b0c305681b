"""Which core runs: compiled with mypyc (``make test``'s first run) or pure Python (its
second run, and any machine without a C compiler), told by ``fanout.core.COMPILED``,
``fanout --version`` and each module's file; subprocesses get the same core."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

import fanout.core
from fanout.core import COMPILED, MODULES

CORE = Path(fanout.core.__file__).parent
ROOT = Path(__file__).resolve().parent.parent.parent
# Set by `make test`: "compiled" for the first run, "pure" for the second.
EXPECTED = os.environ.get("FANOUT_TEST_CORE")


def _is_extension(path: str | None) -> bool:
    return path is not None and path.endswith(tuple(EXTENSION_SUFFIXES))


def test_the_module_list_is_the_folder() -> None:
    sources = sorted(p.stem for p in CORE.glob("*.py") if p.stem != "__init__")
    assert list(MODULES) == sources
    sys.path.insert(0, str(ROOT))
    try:
        import build_core
    finally:
        sys.path.remove(str(ROOT))
    assert build_core.modules() == sources


def test_every_module_is_what_compiled_says() -> None:
    files = {name: importlib.import_module(f"fanout.core.{name}").__file__ for name in MODULES}
    wrong = [name for name, path in files.items() if _is_extension(path) is not COMPILED]
    assert not wrong, f"COMPILED={COMPILED}, yet these are not: {wrong} (a partial build?)"


@pytest.mark.skipif(EXPECTED is None, reason="FANOUT_TEST_CORE is set by make test")
def test_the_run_has_the_core_make_test_built() -> None:
    assert EXPECTED in ("compiled", "pure"), EXPECTED
    assert COMPILED is (EXPECTED == "compiled")
    if COMPILED:  # the compiled run really imports the extension modules
        import fanout.core.chat
        import fanout.core.sse

        assert _is_extension(fanout.core.sse.__file__)
        assert _is_extension(fanout.core.chat.__file__)
        assert type(fanout.core.sse.SSEDecoder.feed).__name__ != "function"


def test_compiled_modules_are_not_older_than_their_sources() -> None:
    built = sorted(p for p in CORE.iterdir() if _is_extension(p.name))
    if not built:
        pytest.skip("the pure-Python core: nothing compiled")
    oldest = min(p.stat().st_mtime for p in built)
    stale = [p.name for p in CORE.glob("*.py")
             if p.stem != "__init__" and p.stat().st_mtime > oldest]
    assert not stale, (f"{stale} changed after the core was compiled: what runs is not "
                       "the source (make test rebuilds; python build_core.py, or --clean)")


def test_subprocesses_run_the_same_core() -> None:
    core = "compiled with mypyc" if COMPILED else "pure Python"
    commands = [[sys.executable, "-m", "fanout", "--version"]]
    script = Path(sys.executable).parent / "fanout"
    if script.exists():  # the console script pip wrote, as `make demo` runs it
        commands.append([str(script), "--version"])
    for command in commands:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True)
        assert done.stdout.endswith(f"(core: {core})\n"), (command, done.stdout)
