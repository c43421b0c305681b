"""A wheel with the sans-I/O core compiled with mypyc, when asked for.

    HATCH_BUILD_HOOK_ENABLE_CUSTOM=1 pip wheel .

builds a platform wheel holding fanout/core's extension modules beside the sources
(build_core.py compiles them; the hook's dependencies, mypy and setuptools, are then
installed in the build environment).  Without the variable, or without a C compiler
(a warning says so), the wheel is the pure-Python one.  Editable installs never compile.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class CompiledCoreHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel" or version == "editable":
            return
        spec = importlib.util.spec_from_file_location(
            "build_core", Path(self.root) / "build_core.py")
        assert spec is not None and spec.loader is not None
        build_core = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(build_core)
        why = build_core.missing_compiler()
        if why:
            self.app.display_warning(f"building the pure-Python wheel: {why}")
            return
        build_core.build()
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        for path in build_core.products():
            build_data["force_include"][str(path)] = str(path.relative_to(self.root))
