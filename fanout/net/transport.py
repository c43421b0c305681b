"""The HTTP client fanout builds for many concurrent streams.

Measured on this stack (see DESIGN.md section 5): httpx's default
``Timeout(5.0)`` kills slow first tokens and has no total; its default
limits time out at 500 streams; keep-alive below the maximum closes
connections instead of reusing them; and one httpcore pool costs CPU
quadratic in its connections.  So: ``Timeout(connect, read=None, write,
pool=None)`` with trio scopes for the rest, limits sized to the
concurrency, and above ``SHARD_SIZE`` connections several small pools
behind a transport that spreads requests over them, sharing one SSL context.

That transport also has a route to a fresh connection: a request whose
extensions hold ``FRESH_CONNECTION`` goes out on a new connection, closed
after its response, never on a pooled one.  fanout sends a request again
that way when it met a pooled connection the server had closed (see
``StreamRunner``): another pooled connection may be just as stale.
"""

from __future__ import annotations

import itertools
import math
import ssl
from collections.abc import Sequence
from http.cookiejar import CookieJar, DefaultCookiePolicy

import httpx

__all__ = ["FRESH_CONNECTION", "SHARD_SIZE", "ShardedTransport", "make_client"]

#: Connections per pool.  httpcore walks every connection of a pool (a poll system call
#: each, to see whether an idle one was closed) whenever a request starts or ends: at
#: 100 a pool, that walk was ~20 % of a fan-out's client CPU (py-spy, 1,000 streams).
SHARD_SIZE = 25
#: A request extension: ``True`` sends the request on a new connection of its own.
FRESH_CONNECTION = "fanout.fresh_connection"


class ShardedTransport(httpx.AsyncBaseTransport):
    """Spreads requests round-robin over several transports (each its own pool).

    ``fresh``: the transport for requests marked ``FRESH_CONNECTION`` (one that
    keeps no connection alive, so each such request gets a new one); without
    it, they go round-robin like the others.
    """

    def __init__(self, transports: Sequence[httpx.AsyncBaseTransport],
                 fresh: httpx.AsyncBaseTransport | None = None) -> None:
        if not transports:
            raise ValueError("ShardedTransport needs at least one transport")
        self.transports = list(transports)
        self.fresh = fresh
        self._next = itertools.cycle(self.transports)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.fresh is not None and request.extensions.get(FRESH_CONNECTION):
            return await self.fresh.handle_async_request(request)
        return await next(self._next).handle_async_request(request)

    async def aclose(self) -> None:
        for transport in self.transports:
            await transport.aclose()
        if self.fresh is not None:
            await self.fresh.aclose()


def make_client(
    max_connections: int = 100,
    *,
    connect_timeout: float | None = 10.0,
    write_timeout: float | None = 30.0,
    http2: bool = False,
    verify: ssl.SSLContext | bool = True,
) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` for ``max_connections`` concurrent streams.

    No read or pool timeout (fanout's deadlines are trio cancel scopes), no
    redirects (the key must go only to the configured URL), no proxies or
    credentials from the environment, and a cookie jar that keeps nothing:
    one stream's server never sets a cookie another stream sends.  Its
    transport is a ``ShardedTransport`` (one shard per ``SHARD_SIZE``
    connections) with a ``fresh`` route that keeps no connection alive.
    """
    if max_connections < 1:
        raise ValueError(f"max_connections must be at least 1, not {max_connections}")
    context = (httpx.create_ssl_context(verify=verify) if not isinstance(verify, ssl.SSLContext)
               else verify)  # built once: loading the CA bundle costs ~25 ms a client
    shards = math.ceil(max_connections / SHARD_SIZE)
    per_shard = math.ceil(max_connections / shards)
    limits = httpx.Limits(max_connections=per_shard, max_keepalive_connections=per_shard)
    transports = [httpx.AsyncHTTPTransport(verify=context, http2=http2, limits=limits,
                                           trust_env=False) for _ in range(shards)]
    fresh = httpx.AsyncHTTPTransport(verify=context, http2=http2, trust_env=False,
                                     limits=httpx.Limits(max_connections=None,
                                                         max_keepalive_connections=0))
    transport = ShardedTransport(transports, fresh)
    return httpx.AsyncClient(
        transport=transport,
        timeout=httpx.Timeout(connect=connect_timeout, read=None, write=write_timeout,
                              pool=None),
        follow_redirects=False,
        trust_env=False,
        cookies=httpx.Cookies(CookieJar(policy=DefaultCookiePolicy(allowed_domains=[]))),
    )
