"""``fanout models``: the model ids the endpoint offers, from its ``GET /models``.

One id a line on stdout, sorted, with ``owned_by`` beside it when the endpoint
says; a count on stderr.  With the embedded upstream (the default config), its
models.  Exit status: 0 with a list (even an empty one), 1 when the endpoint
could not give one (the reason on stderr, one line: no key was sent, nothing
listening, no ``/models`` route, ...), 2 for a bad config, 130 after Ctrl-C.
Server text is made inert before it is printed; the key never is.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any, TextIO

import attrs
import httpx
import trio

from .._exceptions import ConfigError
from ..config import load_config
from ..core.chat import error_from_response
from ..net.stream import base_url_hint, connect_failure, key_refused, public_url
from ..net.transport import make_client
from ..request import Endpoint
from .common import environment_note, open_endpoint
from .common import only as _only
from .render import inert

__all__ = ["ModelsOptions", "list_models", "run_models"]

#: The most of a model list read (a relay's list of thousands is ~1 MB).
MAX_LIST_BYTES = 16 * 1024 * 1024
#: Seconds the whole request may take once connected.
LIST_TIMEOUT = 60.0
EXIT_INTERRUPTED = 130


@attrs.frozen
class ModelsOptions:
    config: str | None = None


class ListError(Exception):
    """The endpoint gave no model list; the message is one line saying why."""


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
        print(f"fanout models: {exc}", file=err)
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
        return resolved.base_url, await list_models(resolved, connect_timeout=connect)


async def list_models(endpoint: Endpoint, *, connect_timeout: float = 10.0,
                      client: httpx.AsyncClient | None = None) -> list[tuple[str, str | None]]:
    """``(id, owned_by)`` of every model ``GET {base_url}/models`` lists, sorted by id,
    made inert; ``ListError`` (one line, never the key) when it gives no list."""
    url = endpoint.base_url.rstrip("/") + "/models"
    headers = {**endpoint.headers, **endpoint.auth_headers(), "accept": "application/json",
               "accept-encoding": "identity"}
    own = client is None
    if client is None:
        client = make_client(1, connect_timeout=connect_timeout)
    body = bytearray()
    status = 0
    too_large = False
    try:
        with trio.move_on_after(LIST_TIMEOUT) as scope:
            try:
                async with client.stream("GET", url, headers=headers) as response:
                    status = response.status_code
                    async for piece in response.aiter_raw():
                        if too_large:
                            continue  # stopped by cancelling, never by leaving the loop
                        body += piece
                        if len(body) > MAX_LIST_BYTES:
                            too_large = True
                            scope.cancel()
            except httpx.ConnectTimeout:
                raise ListError(f"cannot connect to {public_url(endpoint.base_url)}: no "
                                f"connection within {connect_timeout:g} s") from None
            except httpx.TransportError as exc:
                raise ListError(endpoint.redact(connect_failure(exc, endpoint.base_url))
                                ) from None
    finally:
        if own:
            await client.aclose()
    if too_large:
        raise ListError(f"{public_url(url)}: the model list is over "
                        f"{MAX_LIST_BYTES // (1024 * 1024)} MB")
    if scope.cancelled_caught:
        raise ListError(f"{public_url(url)}: no model list within {LIST_TIMEOUT:g} s")
    text = endpoint.redact(bytes(body).decode("utf-8", "replace"))
    if not 200 <= status < 300:
        raise ListError(_refusal(endpoint, url, status, text))
    models = _parse(text)
    if models is None:
        excerpt = " ".join(text.split())[:120]
        raise ListError(f"{public_url(url)}: not a model list: {inert(excerpt)!r}")
    return models


def _refusal(endpoint: Endpoint, url: str, status: int, text: str) -> str:
    message = " ".join(error_from_response(status, text.encode()).message.split())
    said = "" if message.startswith(f"HTTP {status}") else \
        f" (the server said: {inert(message[:160])})"
    if status in (401, 403) and not endpoint.api_key:
        return f"HTTP {status}: no API key was sent: set OPENAI_API_KEY or [endpoint] " \
               f"api_key_env{said}"
    if status == 401:
        return f"HTTP 401: {key_refused(endpoint)}{said}"
    if status == 404:
        advice = base_url_hint(endpoint.base_url)
        hint = f"; {advice}" if advice else ""
        return (f"{public_url(url)} answered 404: the endpoint has no /models route, so it "
                f"cannot list its models (-m still takes any id it serves){hint}")
    return f"HTTP {status}{said or ' from ' + public_url(url)}"


def _parse(text: str) -> list[tuple[str, str | None]] | None:
    """OpenAI's ``{"data": [{"id": ..., "owned_by": ...}]}`` (or a bare list);
    ``None`` when it is no such list."""
    try:
        payload: Any = json.loads(text)
    except ValueError:
        return None
    items = payload.get("data") if isinstance(payload, dict) else payload
    if not isinstance(items, list):
        return None
    found: dict[str, str | None] = {}
    for item in items:
        model_id = item.get("id") if isinstance(item, dict) else item
        if not isinstance(model_id, str) or not model_id.strip():
            continue
        owner = item.get("owned_by") if isinstance(item, dict) else None
        found[inert(model_id)] = inert(owner) if isinstance(owner, str) and owner else None
    return sorted(found.items())
