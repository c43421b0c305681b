"""``fanout models``: the model ids the endpoint offers, from its ``GET /models``.

One id a line on stdout, sorted, with ``owned_by`` beside it when the endpoint
says; a count on stderr.  With the embedded upstream (the default config), its
models.  Exit status: 0 with a list (even an empty one), 1 when the endpoint
could not give one (the reason on stderr, one line: no key was sent, nothing
listening, no ``/models`` route, ...), 2 for a bad config, 130 after Ctrl-C.
Server text is made inert before it is printed; the key never is.  The list
itself is ``fanout.net.model_list``'s (``fanout serve`` offers the same one).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TextIO

import attrs
import trio

from .._exceptions import ConfigError
from ..config import load_config
from ..net.model_list import ListError, list_models
from ..net.stream import public_url
from ..request import Endpoint
from .common import environment_note, open_endpoint
from .common import only as _only
from .render import inert

__all__ = ["ModelsOptions", "run_models"]

EXIT_INTERRUPTED = 130


@attrs.frozen
class ModelsOptions:
    config: str | None = None


def run_models(options: ModelsOptions, *, stdout: TextIO | None = None,
               stderr: TextIO | None = None, environ: Mapping[str, str] | None = None) -> int:
    """List the endpoint's models; returns the exit status (see the module docstring)."""
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    note = environment_note(options.config, environ)
    if note is not None:
        print(f"fanout models: {inert(note)}", file=err)
    try:
        config = load_config(options.config, environ=environ)
        endpoint = config.endpoint(environ)
    except ConfigError as exc:
        for line in str(exc).splitlines() or [""]:
            print(f"fanout models: {inert(line)}", file=err)
        return 2
    connect = config.deadlines.connect or 10.0
    try:
        base_url, models = trio.run(_list, endpoint, connect)
    except ListError as exc:
        print(f"fanout models: {inert(str(exc))}", file=err)
        return 1
    except BaseException as exc:
        if _only(exc, KeyboardInterrupt):
            return EXIT_INTERRUPTED
        raise
    width = min(60, max((len(model_id) for model_id, _ in models), default=0))
    for model_id, owner in models:
        print(f"{model_id:<{width}}  {owner}" if owner else model_id, file=out)
    where = "the embedded upstream" if endpoint is None else public_url(base_url)
    count = f"{len(models)} model{'s' if len(models) != 1 else ''}" if models else "no models"
    print(f"fanout models: {count} at {where}", file=err)
    return 0


async def _list(endpoint: Endpoint | None, connect: float
                ) -> tuple[str, list[tuple[str, str | None]]]:
    async with open_endpoint(endpoint) as resolved:
        listed = await list_models(resolved, connect_timeout=connect,
                                   unlisted="-m still takes any id it serves")
    # The server's text, made inert for the terminal (two ids that differ only in what
    # inert removes are one line).
    found = {inert(model_id): inert(owner) if owner else None for model_id, owner in listed}
    return resolved.base_url, sorted(found.items())
