"""The service's state: the resolved endpoint, one shared HTTP client, the fan-outs
running now (for cancel, status and shutdown), totals since start, and admission.
All of it is one replica's: behind a load balancer each replica counts and limits
only what it runs, and says so (``replica``, ``status()``).

``open_service(config, endpoint)`` builds one; ``create_app(service)`` serves it.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any, Literal, final

import attrs
import httpx
import trio

from ..config import REPLICA_NAME, Config, ModelConfig
from ..core.result import Outcome, StreamResult
from ..fanout import Fanout, FanoutOptions
from ..net.transport import make_client
from ..request import Endpoint
from .errors import ApiError
from .keys import ServiceKeys
from .listing import ASK_SECONDS, EndpointModels
from .reading import Readers
from .replica import default_replica, new_fanout_id

__all__ = ["PER_REPLICA", "SHUTDOWN_REASON", "RunningFanout", "Service", "open_service"]

SHUTDOWN_REASON = "cancelled: the service is shutting down"
#: The parts of ``/v1/status`` that are one replica's alone.
PER_REPLICA = ("running", "totals", "rejected", "reading", "limits")

Kind = Literal["fanout", "chat"]


@final
@attrs.define(eq=False)
class RunningFanout:
    """One request's fan-out while it runs: ``id`` names it (``POST
    /v1/fanout/{id}/cancel``); ``fan`` is set once its ``open_fanout`` block is open.

    A cancel asked before then is applied as the fan-out opens, so no stream of
    a cancelled request ever runs unasked.
    """

    id: str
    kind: Kind
    streams: int
    _outcomes: Counter[str] = attrs.field(repr=False)
    fan: Fanout | None = None
    _pending_cancel: str | None = None
    _counted: set[str] = attrs.field(factory=set, repr=False)

    def attach(self, fan: Fanout) -> None:
        """The fan-out has opened: a cancel asked before now takes effect."""
        self.fan = fan
        if self._pending_cancel is not None:
            fan.cancel_all(self._pending_cancel)

    def cancel(self, reason: str) -> list[str]:
        """Cancel every stream not finished, each ``cancelled`` with ``reason``; their keys."""
        fan = self.fan
        if fan is None:
            if self._pending_cancel is None:
                self._pending_cancel = reason
            return []
        keys = sorted([*fan.running, *fan.queued])
        fan.cancel_all(reason)
        return keys

    def finished(self, result: StreamResult) -> None:
        """Count one stream's outcome in the service's totals (once per stream)."""
        if result.stream not in self._counted:
            self._counted.add(result.stream)
            self._outcomes[str(result.outcome)] += 1

    @property
    def active(self) -> tuple[int, int]:
        """(streams running, streams queued) now."""
        fan = self.fan
        if fan is None:
            return 0, self.streams
        return len(fan.running), len(fan.queued)


@final
class Service:
    """What every request of one ``fanout serve`` shares.

    ``config`` (its ``serve`` table holds the limits), ``endpoint`` (already
    resolved: the embedded upstream is started by whoever built the service),
    ``client`` (one ``httpx.AsyncClient`` for every fan-out), ``keys`` (the
    client tokens; empty: none needed).  ``fanouts`` are the running ones by id.
    ``endpoint_models``: the endpoint's own model list (``listing``).
    ``replica`` names this process among replicas (``replica``, else ``[serve]
    replica``, else the host name and ``[serve] port`` until ``bound`` says the
    real port).
    """

    def __init__(self, config: Config, endpoint: Endpoint, client: httpx.AsyncClient, *,
                 keys: ServiceKeys | None = None, replica: str | None = None) -> None:
        self.config = config
        self.limits = config.serve
        self.endpoint = endpoint
        self.client = client
        self.keys = keys or ServiceKeys()
        #: The endpoint's own ``GET /models``, asked when first needed (not the embedded
        #: upstream's: its models are the config's).
        self.endpoint_models = EndpointModels(
            endpoint, client, ask=not config.embedded,
            connect_timeout=config.deadlines.connect or ASK_SECONDS)
        if replica is not None and not REPLICA_NAME.match(replica):
            raise ValueError(f"replica: {replica!r} is not 1 to 63 letters, digits, _ or -")
        self._named = replica or config.serve.replica
        self.replica = self._named or default_replica(config.serve.port)
        self.fanouts: dict[str, RunningFanout] = {}
        self.outcomes: Counter[str] = Counter()
        self.rejected: Counter[str] = Counter()
        #: The connections being read, set by ``serve_app`` (``None`` until it runs).
        self.readers: Readers | None = None
        self.fanouts_total = 0
        self.streams_total = 0
        self.closing = False
        self._cancelled = False  # shutdown: the running fan-outs were cancelled
        self._changed = trio.Event()  # a fan-out ended, or shutdown
        self._started = time.monotonic()

    def bound(self, port: int) -> None:
        """The service listens on ``port``: an unnamed replica is named by it (call it
        before anyone can know the port, i.e. before printing the URL)."""
        if not self._named:
            self.replica = default_replica(port)

    def admit(self, kind: Kind, streams: int) -> RunningFanout:
        """A slot for one more fan-out, or an ``ApiError`` (429 past ``max_fanouts``,
        with ``Retry-After``; 503 while shutting down)."""
        if self.closing:
            raise ApiError(503, "the service is shutting down", type="service_unavailable",
                           code="shutting_down",
                           headers={"Retry-After": str(self.limits.retry_after)})
        limit = self.limits.max_fanouts
        if len(self.fanouts) >= limit:
            self.rejected["busy"] += 1
            wait = self.limits.retry_after
            raise ApiError(429, f"{len(self.fanouts)} fan-outs are running, the most this "
                           f"service runs at once (max_fanouts); retry after {wait} s",
                           type="rate_limit_error", code="rate_limit_exceeded",
                           headers={"Retry-After": str(wait)})
        running = RunningFanout(new_fanout_id(self.replica), kind, streams, self.outcomes)
        self.fanouts[running.id] = running
        self.fanouts_total += 1
        self.streams_total += streams
        return running

    def release(self, running: RunningFanout) -> None:
        """The fan-out has ended: its slot is free (idempotent)."""
        self.fanouts.pop(running.id, None)
        self._changed.set()

    def fanout_options(self, models: Iterable[ModelConfig]) -> FanoutOptions:
        """``open_fanout``'s options for these models: the config's caps and deadlines."""
        config = self.config
        return FanoutOptions(client=self.client, max_concurrency=config.max_concurrency,
                             per_model_concurrency=config.per_model_caps(list(models)),
                             deadlines=config.deadlines, strict=config.strict)

    def shutdown(self, reason: str = SHUTDOWN_REASON) -> int:
        """Refuse new fan-outs (503) and cancel the running ones; how many were running.

        Each cancelled stream still ends with its ``result`` record, and each
        response with its ``summary`` and ``[DONE]``.
        """
        self.closing = True
        self._cancelled = True
        self._changed.set()
        for running in list(self.fanouts.values()):
            running.cancel(reason)
        return len(self.fanouts)

    async def drain(self, grace: float) -> int:
        """Refuse new fan-outs (503, with ``Retry-After``; ``/healthz`` answers 503: a load
        balancer moves on) and let the running ones finish for up to ``grace`` seconds;
        then cancel those left (``shutdown``).  How many were cancelled by it (0 when all
        finished, or when ``shutdown`` was called meanwhile: they are cancelled)."""
        self.closing = True
        with trio.move_on_after(grace):
            while self.fanouts and not self._cancelled:
                self._changed = trio.Event()
                await self._changed.wait()
        if self.fanouts and not self._cancelled:
            return self.shutdown()
        return 0

    def status(self) -> dict[str, Any]:
        """``GET /v1/status``: which replica answers, what runs on it now, its totals since
        start and its limits (all of them this replica's alone: ``PER_REPLICA``), and the
        fingerprint of its key set (never a key)."""
        running = queued = 0
        for fanout in self.fanouts.values():
            now_running, now_queued = fanout.active
            running += now_running
            queued += now_queued
        limits = self.limits
        return {
            "object": "fanout.status",
            "replica": self.replica,
            "per_replica": list(PER_REPLICA),
            "note": f"{', '.join(PER_REPLICA[:-1])} and {PER_REPLICA[-1]} are replica "
                    f"{self.replica}'s alone: "
                    "behind a load balancer each replica counts and limits what it runs",
            "keys": {"required": bool(self.keys), "fingerprint": self.keys.fingerprint},
            "uptime": round(time.monotonic() - self._started, 3),
            "closing": self.closing,
            "running": {"fanouts": len(self.fanouts), "streams": running, "queued": queued},
            "totals": {"fanouts": self.fanouts_total, "streams": self.streams_total,
                       "outcomes": {str(o): self.outcomes.get(str(o), 0) for o in Outcome}},
            "rejected": {name: self.rejected.get(name, 0)
                         for name in ("unauthorized", "bad_request", "too_large", "busy",
                                      "misdirected")},
            "reading": self._reading(),
            "limits": {"max_fanouts": limits.max_fanouts, "max_streams": limits.max_streams,
                       "max_body_bytes": limits.max_body_bytes,
                       "retry_after": limits.retry_after, "keepalive": limits.keepalive,
                       "head_timeout": limits.head_timeout,
                       "body_timeout": limits.body_timeout,
                       "body_min_rate": limits.body_min_rate,
                       "max_reading_connections": limits.max_reading_connections},
        }

    def _reading(self) -> dict[str, Any]:
        if self.readers is None:
            return {"connections": 0, "closed": dict.fromkeys(Readers.CLOSED, 0)}
        return {"connections": len(self.readers), "closed": dict(self.readers.closed)}


@asynccontextmanager
async def open_service(config: Config, endpoint: Endpoint, *, keys: ServiceKeys | None = None,
                       client: httpx.AsyncClient | None = None,
                       replica: str | None = None) -> AsyncIterator[Service]:
    """A ``Service`` for the length of the block, with one HTTP client sized to its limits
    (``max_fanouts`` x ``max_streams`` connections; yours is left open).  ``replica``
    names it over ``[serve] replica``."""
    own = client is None
    if client is None:
        client = make_client(config.serve.max_fanouts * config.serve.max_streams)
    try:
        yield Service(config, endpoint, client, keys=keys, replica=replica)
    finally:
        if own:
            with trio.CancelScope(shield=True):
                await client.aclose()
