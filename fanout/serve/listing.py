"""The endpoint's own model list, for ``GET /v1/models`` and the page.

On a real endpoint (any but the embedded upstream) the service asks its
``GET /models`` (``fanout.net.model_list``, as ``fanout models`` does: the key
sent, the key redacted from what comes back) **lazily**: when ``/v1/models`` is
first asked (the page asks as it loads), never at startup, so a slow or absent
endpoint delays no start and no health check.  One ask at a time: requests that
arrive meanwhile wait for its answer.  A list is kept ``KEEP_SECONDS`` (a failure
``RETRY_SECONDS``, then asked again); a failed ask keeps the last list it had, with
the reason beside it.  An ask is bounded: ``ASK_SECONDS`` in all, ``MAX_BYTES`` of
list.  Every replica asks for itself.

With the embedded upstream nothing is asked: its models are the config's (and
any embedded id can still be typed).
"""

from __future__ import annotations

import math
from typing import final

import attrs
import httpx
import trio

from ..net.model_list import ListError, list_models
from ..request import Endpoint

__all__ = ["ASK_SECONDS", "KEEP_SECONDS", "MAX_BYTES", "RETRY_SECONDS", "EndpointModels",
           "Listing"]

#: Seconds a list the endpoint gave is kept before it is asked again.
KEEP_SECONDS = 300.0
#: Seconds after a failed ask before the next one.
RETRY_SECONDS = 30.0
#: Seconds one ask may take, connecting included.
ASK_SECONDS = 10.0
#: The most of a list read (a relay's list of thousands of models is about 1 MB).
MAX_BYTES = 4 * 1024 * 1024
#: What a client can still do when the endpoint lists nothing.
UNLISTED = "any model id it serves can still be typed"


@attrs.frozen
class Listing:
    """What the endpoint listed: ``(id, owned_by)`` sorted by id; ``error``: one line
    saying why the last ask gave no list (``None``: it did); ``asked``: whether the
    endpoint is asked at all (not the embedded upstream)."""

    models: tuple[tuple[str, str | None], ...] = ()
    error: str | None = None
    asked: bool = False


@final
class EndpointModels:
    """The endpoint's model list, asked when needed and kept (see the module docstring)."""

    def __init__(self, endpoint: Endpoint, client: httpx.AsyncClient, *, ask: bool,
                 connect_timeout: float = ASK_SECONDS) -> None:
        self.endpoint = endpoint
        self.client = client
        self.ask = ask
        self.connect_timeout = min(connect_timeout, ASK_SECONDS)
        self.asks = 0
        self._lock = trio.Lock()
        self._listing = Listing(asked=ask)
        self._until = -math.inf

    async def get(self) -> Listing:
        """The list, asked for first when there is none or it is too old."""
        if not self.ask:
            return self._listing
        async with self._lock:
            if trio.current_time() < self._until:
                return self._listing
            self.asks += 1
            try:
                models = await list_models(self.endpoint, connect_timeout=self.connect_timeout,
                                           timeout=ASK_SECONDS, max_bytes=MAX_BYTES,
                                           client=self.client, unlisted=UNLISTED)
            except ListError as exc:
                reason = " ".join(self.endpoint.redact(str(exc)).split())
                self._listing = Listing(self._listing.models, reason, True)
                self._until = trio.current_time() + RETRY_SECONDS
            else:
                self._listing = Listing(tuple(models), None, True)
                self._until = trio.current_time() + KEEP_SECONDS
            return self._listing
