"""The JSON decoder of the hot path.

``loads`` is orjson's when it is installed (about 3x faster than the standard
library on chat chunks, see bench/parse.py), else ``json.loads``.  The
standard library stays the referee: a caller that gets ``ValueError`` from
``loads`` must try ``loads_stdlib`` before calling the text malformed, so
lone surrogate escapes, NaN or huge integers parse exactly as the standard
library parses them.  ``FANOUT_JSON=stdlib`` forces the standard library.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

__all__ = ["BACKEND", "loads", "loads_stdlib"]

loads_stdlib: Callable[[str], Any] = json.loads
loads: Callable[[str], Any] = json.loads
BACKEND = "stdlib"

if os.environ.get("FANOUT_JSON", "").lower() != "stdlib":
    try:
        from orjson import loads as _orjson_loads
    except ImportError:  # pragma: no cover - the stdlib-backend tests cover this path
        pass
    else:
        loads = _orjson_loads
        BACKEND = "orjson"
