"""Replicas of ``fanout serve`` behind a load balancer: each one names itself.

A fan-out id names the replica that runs it, ``fo.<replica>.<random>``: the
replica is ``[serve] replica`` (letters, digits, ``_``, ``-``: ``REPLICA_NAME``)
and the random part is ``secrets.token_urlsafe`` (the same letters), so the id
has exactly two dots and a load balancer can route
``POST /v1/fanout/<id>/cancel`` by the id's second dot-separated field without
a script (``examples/haproxy.cfg``).  A replica that is sent another's cancel
answers 421 naming the owner, and every response carries ``X-Fanout-Replica``.
"""

from __future__ import annotations

import re
import secrets
import socket
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..config import REPLICA_NAME

__all__ = ["OWNER_HEADER", "REPLICA_HEADER", "ReplicaHeader", "default_replica", "id_replica",
           "new_fanout_id"]

#: On every response: the replica that sent it.
REPLICA_HEADER = "x-fanout-replica"
#: On a 421: the replica that runs the fan-out asked for.
OWNER_HEADER = "x-fanout-owner"
ID_PREFIX = "fo"
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


def default_replica(port: int, hostname: str | None = None) -> str:
    """The name of a replica without ``[serve] replica``: ``<host name>-<port>``.

    The host name (``socket.gethostname()`` unless given) keeps only letters,
    digits, ``_`` and ``-`` (a run of anything else is one ``-``), cut so the
    name fits ``REPLICA_NAME``.
    """
    host = _UNSAFE.sub("-", socket.gethostname() if hostname is None else hostname)
    suffix = f"-{port}"
    host = host.strip("-")[:63 - len(suffix)].strip("-") or "fanout"
    return f"{host}{suffix}"


def new_fanout_id(replica: str) -> str:
    """A fresh fan-out id naming ``replica``: ``fo.<replica>.<22 random characters>``."""
    return f"{ID_PREFIX}.{replica}.{secrets.token_urlsafe(16)}"


def id_replica(fanout_id: str) -> str | None:
    """The replica a fan-out id names; ``None`` for a string that is no such id."""
    parts = fanout_id.split(".")
    if len(parts) != 3 or parts[0] != ID_PREFIX or not parts[2]:
        return None
    return parts[1] if REPLICA_NAME.match(parts[1]) else None


class ReplicaHeader:
    """ASGI middleware: every HTTP response it passes names the replica (``name()``)."""

    def __init__(self, app: ASGIApp, name: Callable[[], str]) -> None:
        self.app = app
        self.name = name

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def named(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                if all(key.lower() != REPLICA_HEADER.encode() for key, _ in headers):
                    headers.append((REPLICA_HEADER.encode(), self.name().encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, named)
