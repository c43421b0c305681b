"""The sans-I/O core: bytes in, events and results out.  No trio, no httpx.

This package imports only the standard library, attrs and (optionally)
orjson and jsonschema; a test holds it to that.

Its modules may be compiled with mypyc (``make test`` does it, ``build_core.py``
by hand): the extension modules sit next to the sources and Python imports them
first.  :data:`COMPILED` says whether every module of the core is compiled;
``fanout --version`` says the same.
"""

from importlib.machinery import EXTENSION_SUFFIXES
from importlib.util import find_spec
from typing import Final

# Every module of the core but this one (a test holds the list to the folder).
MODULES: Final = (
    "_dialect", "_json", "_sse_event", "accumulate", "anthropic", "chat", "dialects",
    "events", "parser", "patterns", "redact", "responses", "result", "sse",
)


def _compiled(name: str) -> bool:
    spec = find_spec(f"{__name__}.{name}")
    origin = spec.origin if spec is not None else None
    return origin is not None and origin.endswith(tuple(EXTENSION_SUFFIXES))


#: True when every module of the core is a compiled (mypyc) extension module,
#: False when they are the pure-Python sources.
COMPILED: Final = all(_compiled(name) for name in MODULES)
