"""An endpoint's model list: its ``GET {base_url}/models``, read within bounds.

``list_models`` is what ``fanout models`` prints and what ``fanout serve`` offers
on its page and its ``/v1/models``.  The list is the server's text: the key is
redacted from it (and from every reason), but each front end makes it safe for
where it goes (the terminal's ``inert``, the page's ``textContent``).
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import trio

from ..core.chat import error_from_response
from ..request import Endpoint
from .stream import base_url_hint, connect_failure, key_refused, public_url
from .transport import make_client

__all__ = ["LIST_TIMEOUT", "MAX_LIST_BYTES", "ListError", "list_models"]

#: The most of a model list read (a relay's list of thousands is ~1 MB).
MAX_LIST_BYTES = 16 * 1024 * 1024
#: Seconds the whole request may take once connected.
LIST_TIMEOUT = 60.0


class ListError(Exception):
    """The endpoint gave no model list; the message is one line saying why (never the key)."""


async def list_models(endpoint: Endpoint, *, connect_timeout: float = 10.0,
                      timeout: float = LIST_TIMEOUT, max_bytes: int = MAX_LIST_BYTES,
                      client: httpx.AsyncClient | None = None,
                      unlisted: str = "any id it serves can still be asked for"
                      ) -> list[tuple[str, str | None]]:
    """``(id, owned_by)`` of every model ``GET {base_url}/models`` lists, sorted by id, the
    key redacted; ``ListError`` (one line, never the key) when it gives no list within
    ``timeout`` seconds and ``max_bytes``.  ``unlisted`` is the front end's advice when
    the endpoint has no such route (how to ask for a model it does not list)."""
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
        with trio.move_on_after(timeout) as scope:
            try:
                async with client.stream("GET", url, headers=headers) as response:
                    status = response.status_code
                    async for piece in response.aiter_raw():
                        if too_large:
                            continue  # stopped by cancelling, never by leaving the loop
                        body += piece
                        if len(body) > max_bytes:
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
            with trio.CancelScope(shield=True):
                await client.aclose()
    if too_large:
        size = f"{max_bytes // (1024 * 1024)} MB" if max_bytes >= 1024 * 1024 else \
            f"{max_bytes} bytes"
        raise ListError(f"{public_url(url)}: the model list is over {size}")
    if scope.cancelled_caught:
        raise ListError(f"{public_url(url)}: no model list within {timeout:g} s")
    text = endpoint.redact(bytes(body).decode("utf-8", "replace"))
    if not 200 <= status < 300:
        raise ListError(_refusal(endpoint, url, status, text, unlisted))
    models = _parse(text)
    if models is None:
        excerpt = " ".join(text.split())[:120]
        raise ListError(f"{public_url(url)}: not a model list: {excerpt!r}")
    return models


def _refusal(endpoint: Endpoint, url: str, status: int, text: str, unlisted: str) -> str:
    message = " ".join(error_from_response(status, text.encode()).message.split())
    said = "" if message.startswith(f"HTTP {status}") else \
        f" (the server said: {message[:160]})"
    if status in (401, 403) and not endpoint.api_key:
        return f"HTTP {status}: no API key was sent: set OPENAI_API_KEY or [endpoint] " \
               f"api_key_env{said}"
    if status == 401:
        return f"HTTP 401: {key_refused(endpoint)}{said}"
    if status == 404:
        advice = base_url_hint(endpoint.base_url)
        hint = f"; {advice}" if advice else ""
        return (f"{public_url(url)} answered 404: the endpoint has no /models route, so it "
                f"cannot list its models ({unlisted}){hint}")
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
        found[model_id] = owner if isinstance(owner, str) and owner else None
    return sorted(found.items())
