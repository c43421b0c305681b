"""Serving the app on loopback against the embedded upstream, and reading what it sends.

Policy as everywhere: loopback only, port 0, ``trio.fail_after`` around I/O.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import httpx
import trio

from fanout import Endpoint, SSEDecoder
from fanout.config import Config, parse_config
from fanout.serve import Service, ServiceKeys, open_service, serve_app
from fanout.upstream import RunningUpstream

MODELS = """
[endpoint]
base_url = "embedded"

[deadlines]
connect = 5
first_token = 10
idle = 5
total = 30

[compare]
models = ["fast", "echo"]

[[models]]
name = "fast"
id = "mock/fast"

[[models]]
name = "writer"
id = "mock/slow"
params = { max_tokens = 30 }

[[models]]
name = "long"
id = "mock/slow:0.1"

[[models]]
name = "long2"
id = "mock/reasoning:0.1"

[[models]]
name = "endless"
id = "fault/endless:0.02"

[[models]]
name = "echo"
id = "mock/echo"

[[models]]
name = "tools"
id = "mock/tools"

[[models]]
name = "short"
id = "mock/length"
params = { max_tokens = 12 }

[[models]]
name = "flaky"
id = "fault/truncate"

[[models]]
name = "broken"
id = "fault/error-event"

[[models]]
name = "stalled"
id = "fault/stall:3"
deadlines = { idle = 1 }

[[models]]
name = "late"
id = "fault/slow-first-token:3"

[[models]]
name = "gpt-4o"
id = "mock/fast"
"""


def make_config(serve: str = "", extra: str = "") -> Config:
    """The test models, with a ``[serve]`` table made of ``serve``."""
    return parse_config(f"{MODELS}\n{extra}\n[serve]\n{serve}\n", "test.toml")


@attrs.frozen
class Served:
    url: str
    service: Service
    upstream: RunningUpstream

    def client(self, **headers: str) -> httpx.AsyncClient:
        timeout = httpx.Timeout(connect=5, read=None, write=5, pool=None)
        return httpx.AsyncClient(base_url=self.url, timeout=timeout, headers=headers)


@asynccontextmanager
async def serving(upstream: RunningUpstream, config: Config | None = None, *,
                  keys: tuple[str, ...] = (), api_key: str | None = None,
                  replica: str | None = None) -> AsyncIterator[Served]:
    """The service on 127.0.0.1:0 against ``upstream``, for the length of the block
    (named ``replica``, else by the host name and the port it bound, as the command does)."""
    config = config or make_config()
    endpoint = Endpoint(upstream.base_url, api_key)
    async with open_service(config, endpoint, keys=ServiceKeys(keys),
                            replica=replica) as service, \
            trio.open_nursery() as nursery:
        url = await nursery.start(serve_app, service, "127.0.0.1", 0)
        service.bound(int(url.rsplit(":", 1)[1]))
        try:
            yield Served(url, service, upstream)
        finally:
            nursery.cancel_scope.cancel()


@attrs.frozen
class Received:
    """One SSE response, read to its end: events in order, comments counted, raw bytes."""

    status: int
    headers: httpx.Headers
    events: list[tuple[str, str]]  # (event name, data)
    comments: int
    raw: bytes

    @property
    def records(self) -> list[dict[str, Any]]:
        return [json.loads(data) for _, data in self.events if data != "[DONE]"]

    def of(self, stream: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r.get("stream") == stream and r["type"] != "summary"]

    def results(self) -> dict[str, dict[str, Any]]:
        return {r["stream"]: r for r in self.records if r["type"] == "result"}

    def summary(self) -> dict[str, Any]:
        (summary,) = [r for r in self.records if r["type"] == "summary"]
        return summary


class SSEReader:
    """Reads one SSE response as it comes: ``until`` a record matches, then ``rest``."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.decoder = SSEDecoder()
        self.events: list[tuple[str, str]] = []
        self.raw = bytearray()
        self._chunks = response.aiter_raw()
        self._returned: set[int] = set()  # events handed out by until()

    async def _more(self) -> bool:
        try:
            chunk = await self._chunks.__anext__()
        except StopAsyncIteration:
            self.events.extend((e.event, e.data) for e in self.decoder.close())
            return False
        self.raw += chunk
        self.events.extend((e.event, e.data) for e in self.decoder.feed(chunk))
        return True

    async def until(self, predicate: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """The first record not returned before for which ``predicate`` holds
        (AssertionError if the stream ends first)."""
        scanned = 0
        while True:
            for index in range(scanned, len(self.events)):
                _, data = self.events[index]
                if index not in self._returned and data != "[DONE]":
                    record: dict[str, Any] = json.loads(data)
                    if predicate(record):
                        self._returned.add(index)
                        return record
            scanned = len(self.events)
            if not await self._more():
                raise AssertionError("the stream ended before the record was seen")

    async def rest(self) -> Received:
        """Read to the end: everything received, from the start."""
        while await self._more():
            pass
        return Received(self.response.status_code, self.response.headers, self.events,
                        self.decoder.comments, bytes(self.raw))


async def read_sse(response: httpx.Response) -> Received:
    return await SSEReader(response).rest()


async def post_sse(client: httpx.AsyncClient, path: str, body: dict[str, Any],
                   seconds: float = 20) -> Received:
    with trio.fail_after(seconds):
        async with client.stream("POST", path, json=body) as response:
            return await read_sse(response)


def ask(*models: str, prompt: str = "hi", **fields: Any) -> dict[str, Any]:
    """A ``/v1/fanout`` body streaming ``models``."""
    return {"messages": [{"role": "user", "content": prompt}], "models": list(models),
            "stream": True, **fields}


async def raw_post(url: str, path: str, body: dict[str, Any], **headers: str
                   ) -> trio.SocketStream:
    """POST over a bare socket (a client that can vanish without closing any generator)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    payload = json.dumps(body).encode()
    head = "".join(f"{k.replace('_', '-')}: {v}\r\n" for k, v in headers.items())
    await stream.send_all(f"POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: "
                          f"application/json\r\ncontent-length: {len(payload)}\r\n{head}\r\n"
                          .encode() + payload)
    return stream


async def read_until(stream: trio.SocketStream, *needles: bytes) -> bytes:
    """Read until every needle has been seen; what was read."""
    seen = b""
    while not all(needle in seen for needle in needles):
        data = await stream.receive_some(65536)
        assert data, "the response ended first"
        seen += data
    return seen
