"""Serving the app with Hypercorn's trio connection handler.

``serve_app`` binds, reports the bound URL through ``task_status`` (the port
is the real one when 0 was asked for) and serves until ``shutdown_trigger``
returns; then running responses get ``GRACEFUL_SECONDS`` to end (a fan-out
cancelled by ``Service.shutdown`` ends in well under that, every stream with
its result).

The accept loop is fanout's (Hypercorn's ``serve`` takes no stream wrapper):
each accepted connection is wrapped in a ``reading.ReadingStream`` and served by
Hypercorn's ``TCPServer``, the app wrapped in ``reading.ReadDeadlines``: request
heads and bodies are read within deadlines, and no more connections are read at
once than ``[serve] max_reading_connections``.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, cast

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.utils import repr_socket_addr, wrap_app

from ..config import ServeConfig
from .app import create_app
from .reading import CURRENT, ASGIApp, ReadDeadlines, Readers, ReadingStream, Receive, Scope, Send
from .service import Service
from .sse import SERVER_SEND

__all__ = ["GRACEFUL_SECONDS", "is_loopback", "serve_app"]

GRACEFUL_SECONDS = 5.0
BACKLOG = 2048
LOG = logging.getLogger("fanout.serve")


def is_loopback(host: str) -> bool:
    """``localhost``, 127.0.0.0/8 or ::1: reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def hypercorn_config(host: str, port: int, limits: ServeConfig | None = None
                     ) -> HypercornConfig:
    """Hypercorn's settings: no access log (requests are nobody's business), errors to
    ``fanout.serve``'s logger, a bounded graceful shutdown, room for clients that connect
    at the same moment, its keep-alive timer a second behind ``head_timeout`` (which
    ``ReadingStream`` keeps, with a 408: Hypercorn's timer only closes)."""
    limits = limits or ServeConfig()
    config = HypercornConfig()
    config.keep_alive_timeout = limits.head_timeout + 1
    bracketed = f"[{host.strip('[]')}]" if ":" in host else host
    config.bind = [f"{bracketed}:{port}"]
    config.accesslog = None
    config.errorlog = LOG
    config.graceful_timeout = GRACEFUL_SECONDS
    # Hypercorn's default of 100 pending connections resets clients that arrive together
    # (measured: 500 at once got ~50 resets); the kernel caps it at net.core.somaxconn.
    config.backlog = BACKLOG
    config.include_server_header = False
    return config


def _server_send(app: ASGIApp) -> ASGIApp:
    """``app`` with the server's own ``send`` in every scope (``sse.SERVER_SEND``),
    for the streamed responses' bodies."""

    async def call(scope: Scope, receive: Receive, send: Send) -> None:
        scope[SERVER_SEND] = send
        await app(scope, receive, send)

    return call


async def serve_app(service: Service, host: str, port: int, *,
                    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
                    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve ``service`` on ``host:port`` until ``shutdown_trigger`` returns (or a cancel).

    ``task_status.started`` gets the base URL, ``http://HOST:PORT``.  ``service.readers``
    holds the connections being read (and counts those closed for being slow).
    """
    limits = service.limits
    config = hypercorn_config(host, port, limits)
    app = wrap_app(cast(Any, _server_send(ReadDeadlines(cast(Any, create_app(service))))),
                   config.wsgi_max_body_size, "asgi")
    readers = service.readers = Readers(limits)
    context = WorkerContext(None)
    sockets = config.create_sockets()
    listeners: list[trio.SocketListener] = []
    for sock in sockets.insecure_sockets:
        sock.listen(config.backlog)
        listeners.append(trio.SocketListener(trio.socket.from_stdlib_socket(sock)))

    async def connection(stream: trio.SocketStream) -> None:
        reading = readers.open()
        CURRENT.set(reading)  # this task's context, and so its app tasks'
        with reading.cancel_scope:
            await TCPServer(app, config, context, {}, cast(Any, ReadingStream(stream, reading)))

    async with trio.open_nursery() as connections:
        async with trio.open_nursery() as accepting:
            accepting.start_soon(partial(trio.serve_listeners, connection, listeners,
                                         handler_nursery=connections))
            task_status.started(
                "http://" + repr_socket_addr(listeners[0].socket.family,
                                             listeners[0].socket.getsockname()))
            if shutdown_trigger is not None:
                await shutdown_trigger()
            else:
                await trio.sleep_forever()
            accepting.cancel_scope.cancel()  # no new connection
        await context.terminated.set()  # no next request on a kept-alive one
        connections.cancel_scope.deadline = trio.current_time() + config.graceful_timeout
