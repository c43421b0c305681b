"""The JSON decoder of the hot path.

orjson when it is installed (about 4x faster on chat chunks, see bench/parse.py),
with the standard library as the fallback *and* as the referee: whatever
orjson rejects is handed to ``json.loads``, so lone surrogate escapes, NaN or
huge integers parse exactly as the standard library parses them.  Set
``FANOUT_JSON=stdlib`` to use the standard library alone.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

__all__ = ["BACKEND", "loads", "loads_stdlib"]

loads_stdlib: Callable[[str], Any] = json.loads

_orjson_loads: Callable[[str], Any] | None
try:
    from orjson import loads as _orjson_loads
except ImportError:  # pragma: no cover - the stdlib-backend tests cover this path
    _orjson_loads = None


def _loads_orjson(text: str) -> Any:
    try:
        return _orjson_loads(text)  # type: ignore[misc]  # None only when unused
    except ValueError:  # orjson.JSONDecodeError is a ValueError
        return json.loads(text)


if _orjson_loads is not None and os.environ.get("FANOUT_JSON", "").lower() != "stdlib":
    loads: Callable[[str], Any] = _loads_orjson
    BACKEND = "orjson"
else:
    loads = json.loads
    BACKEND = "stdlib"
