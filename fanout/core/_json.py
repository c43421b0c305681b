"""The JSON decoder of the hot path.

``loads`` is orjson's when it is installed (about 3x faster than the standard
library on chat chunks, see bench/parse.py), else ``json.loads``.  The
standard library stays the referee: a caller that gets ``ValueError`` from
``loads`` must try ``loads_stdlib`` before calling the text malformed, so
lone surrogate escapes, NaN or huge integers parse exactly as the standard
library parses them.  ``FANOUT_JSON=stdlib`` forces the standard library.
Both give the same value for every input: integers outside the 64-bit range
become floats in both (orjson's rule), infinite past the double range.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

__all__ = ["BACKEND", "for_bytes", "loads", "loads_stdlib"]

_INT64_MIN = -(2**63)
_UINT64_END = 2**64


def _parse_int(text: str) -> int | float:
    # orjson reads integers in [-2**63, 2**64) exactly and any other as a
    # float; the standard library would keep them exact (or, past 4,300
    # digits, refuse them).  One behaviour for both: orjson's, and an
    # integer past the double range is infinite, as 1e999 is.
    if len(text) < 19:
        return int(text)
    if len(text) <= 21:
        value = int(text)
        if _INT64_MIN <= value < _UINT64_END:
            return value
    return float(text)


loads_stdlib: Callable[[str], Any] = json.JSONDecoder(parse_int=_parse_int).decode
loads: Callable[[str], Any] = loads_stdlib
BACKEND = "stdlib"

_orjson_loads: Callable[[bytes | str], Any] | None = None

if os.environ.get("FANOUT_JSON", "").lower() != "stdlib":
    try:
        from orjson import loads as _orjson_loads
    except ImportError:  # pragma: no cover - the stdlib-backend tests cover this path
        pass
    else:
        loads = _orjson_loads  # type: ignore[assignment]
        BACKEND = "orjson"


def for_bytes(text_loads: Callable[[str], Any]) -> Callable[[bytes], Any]:
    """``text_loads`` for a payload not yet decoded: orjson reads UTF-8 bytes as
    they are (and rejects invalid UTF-8, as the strict decoding does for any
    other), so both give what ``text_loads`` gives on the decoded text, or a
    ``ValueError``."""
    if text_loads is _orjson_loads:
        return text_loads
    return lambda data: text_loads(data.decode())
