"""Compile fanout's sans-I/O core (fanout/core/) with mypyc, in place.

    python build_core.py                    # compile: fanout/core/*.so next to the sources
    python build_core.py --clean            # remove them (and build/mypyc/)
    python build_core.py --check-compiler   # exit 1, saying why, when no C compiler is found

The extension modules (gitignored) sit next to the sources they were compiled from, and
Python imports an extension module before a ``.py`` of the same name: the compiled core
runs wherever they are, the pure-Python one wherever they are not (a copy of the tracked
files, a machine without a C compiler).  ``fanout.core.COMPILED`` and ``fanout
--version`` say which.  A source edited after the build is not what runs until the next
build (``make test`` rebuilds; tests/core/test_compiled.py fails on a stale module).
Needs mypy (its mypyc), setuptools and a C compiler.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent
CORE = ROOT / "fanout" / "core"
GROUP = "fanout.core._mypyc"  # the modules' shared library: fanout/core/_mypyc__mypyc.*.so
BUILD = ROOT / "build" / "mypyc"


def modules() -> list[str]:
    """Every module of the core but its ``__init__`` (which says whether they are compiled)."""
    return sorted(path.stem for path in CORE.glob("*.py") if path.stem != "__init__")


def products() -> list[Path]:
    """The build's products in the source tree."""
    return sorted(path for path in CORE.iterdir() if path.suffix in (".so", ".pyd"))


def clean() -> None:
    for path in products():
        path.unlink()
    shutil.rmtree(BUILD, ignore_errors=True)


def missing_compiler() -> str | None:
    """Why the core cannot be compiled here, or None when it can."""
    compiler = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        return f"no C compiler ({compiler} is not on PATH)"
    header = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not header.is_file():
        return f"no Python headers ({header} is missing)"
    return None


def build() -> None:
    from mypyc.build import mypycify
    from setuptools import setup

    os.chdir(ROOT)
    clean()
    extensions = mypycify([f"fanout/core/{name}.py" for name in modules()], opt_level="3",
                          debug_level="0", group_name=GROUP, target_dir=str(BUILD / "c"))
    setup(name="fanout-core", packages=[], py_modules=[], ext_modules=extensions,
          script_args=["--quiet", "build_ext", "--build-lib", str(BUILD / "lib"),
                       "--build-temp", str(BUILD / "temp"),
                       "--parallel", str(os.cpu_count() or 1)])
    # Moved into place, never written over: a process running the previous build keeps it.
    for path in sorted((BUILD / "lib" / "fanout" / "core").iterdir()):
        if path.suffix in (".so", ".pyd"):
            os.replace(path, CORE / path.name)


if __name__ == "__main__":
    if sys.argv[1:] == ["--clean"]:
        clean()
    elif sys.argv[1:] == ["--check-compiler"]:
        why = missing_compiler()
        if why:
            sys.exit(why)
    elif sys.argv[1:]:
        sys.exit(f"build_core.py: unknown arguments {' '.join(sys.argv[1:])!r} "
                 "(none, --clean or --check-compiler)")
    else:
        build()
