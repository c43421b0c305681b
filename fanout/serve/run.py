"""Serving the app with Hypercorn's trio worker.

``serve_app`` binds, reports the bound URL through ``task_status`` (the port
is the real one when 0 was asked for) and serves until ``shutdown_trigger``
returns; then running responses get ``GRACEFUL_SECONDS`` to end (a fan-out
cancelled by ``Service.shutdown`` ends in well under that, every stream with
its result).
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Awaitable, Callable
from typing import Any, cast

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve

from .app import create_app
from .service import Service

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


def hypercorn_config(host: str, port: int) -> HypercornConfig:
    """Hypercorn's settings: no access log (requests are nobody's business), errors to
    ``fanout.serve``'s logger, a bounded graceful shutdown, room for clients that connect
    at the same moment."""
    config = HypercornConfig()
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


async def serve_app(service: Service, host: str, port: int, *,
                    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
                    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve ``service`` on ``host:port`` until ``shutdown_trigger`` returns (or a cancel).

    ``task_status.started`` gets the base URL, ``http://HOST:PORT``.
    """
    app: Any = create_app(service)

    async def started(*, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED
                      ) -> None:
        await serve(app, hypercorn_config(host, port), shutdown_trigger=shutdown_trigger,
                    task_status=task_status)

    async with trio.open_nursery() as nursery:
        binds = cast(list[str], await nursery.start(started))
        task_status.started(binds[0])
