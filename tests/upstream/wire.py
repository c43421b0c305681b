"""Raw-socket and raw-httpx helpers for tests that check exactly what the upstream sends."""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import suppress
from typing import Any

import attrs
import httpx
import trio

from fanout.upstream import RunningUpstream

MESSAGES = [{"role": "user", "content": "Tell me something about rivers."}]
TIMEOUT = httpx.Timeout(connect=5, read=None, write=5, pool=None)


@attrs.frozen
class Raw:
    """Everything one connection received: the bytes, and how the reading ended."""

    data: bytes
    closed: bool  # the server closed the connection (EOF), rather than we gave up waiting
    reads: tuple[bytes, ...]  # as read; when is for tests/upstream/virtual.py to say

    @property
    def head(self) -> bytes:
        return self.data.partition(b"\r\n\r\n")[0]

    @property
    def status(self) -> int:
        return int(self.data.split(b" ", 2)[1])

    def header(self, name: str) -> list[str]:
        lines = self.head.decode("latin-1").split("\r\n")[1:]
        return [v.strip() for k, _, v in (line.partition(":") for line in lines)
                if k.strip().lower() == name.lower()]

    @property
    def chunked_body(self) -> bytes:
        return self.data.partition(b"\r\n\r\n")[2]


def request_bytes(model: str, *, headers: dict[str, str] | None = None, stream: bool = True,
                  **body: Any) -> bytes:
    payload = json.dumps({"model": model, "messages": MESSAGES, "stream": stream,
                          **body}).encode()
    lines = ["POST /v1/chat/completions HTTP/1.1", "Host: 127.0.0.1",
             "Content-Type: application/json", f"Content-Length: {len(payload)}",
             *(f"{k}: {v}" for k, v in (headers or {}).items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + payload


async def raw_chat(upstream: RunningUpstream, model: str, *, wait: float = 2.0,
                   until: bytes | None = None, headers: dict[str, str] | None = None,
                   **body: Any) -> Raw:
    """Send one request on a fresh socket; read until EOF, ``until`` is seen, or ``wait`` s."""
    stream = await trio.open_tcp_stream("127.0.0.1", upstream.port)
    reads: list[bytes] = []
    closed = False
    try:
        await stream.send_all(request_bytes(model, headers=headers, **body))
        with trio.move_on_after(wait):
            while True:
                data = await stream.receive_some(65536)
                if not data:
                    closed = True
                    break
                reads.append(data)
                if until is not None and until in b"".join(reads):
                    break
    finally:
        await stream.aclose()
    return Raw(b"".join(reads), closed, tuple(reads))


@attrs.frozen
class Chunks:
    """An HTTP/1.1 chunked body taken apart."""

    chunks: tuple[bytes, ...]
    complete: bool  # ended by the zero-length chunk
    rest: bytes  # what followed that could not be read as a whole chunk

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)


def dechunk(data: bytes) -> Chunks:
    chunks: list[bytes] = []
    position = 0
    while True:
        line_end = data.find(b"\r\n", position)
        if line_end < 0:
            return Chunks(tuple(chunks), False, data[position:])
        size = int(data[position:line_end].split(b";")[0], 16)
        start = line_end + 2
        if size == 0:
            return Chunks(tuple(chunks), data[start:start + 2] == b"\r\n", data[start + 2:])
        if len(data) < start + size + 2:
            return Chunks(tuple(chunks), False, data[position:])
        chunks.append(data[start:start + size])
        position = start + size + 2


def events(body: bytes) -> list[str]:
    """The SSE events of a body, as text blocks (``data: ...`` lines kept)."""
    return [e for e in body.decode("utf-8", "replace").replace("\r\n", "\n").split("\n\n") if e]


def payloads(body: bytes) -> list[Any]:
    """Every ``data:`` payload that parses as JSON ([DONE] and junk left out)."""
    out = []
    for event in events(body):
        for line in event.split("\n"):
            if line.startswith("data: "):
                with suppress(ValueError):
                    out.append(json.loads(line[6:]))
    return out


@attrs.frozen
class Reply:
    status: int
    headers: httpx.Headers
    reads: list[bytes]
    error: Exception | None

    @property
    def body(self) -> bytes:
        return b"".join(self.reads)


async def chat(client: httpx.AsyncClient, model: str, *, headers: dict[str, str] | None = None,
               until: Callable[[bytes], bool] | None = None, decoded: bool = False, **body: Any) -> Reply:
    """One streamed request through httpx: the raw body (``decoded``: inflated) as read,
    to its end or until ``until(body so far)`` holds."""
    payload = {"model": model, "messages": MESSAGES, "stream": True, **body}
    reads: list[bytes] = []
    error: Exception | None = None
    async with client.stream("POST", "/chat/completions", json=payload,
                             headers=headers or {}) as response:
        try:
            chunks = response.aiter_bytes() if decoded else response.aiter_raw()
            with trio.CancelScope() as enough:  # cancelled inside httpx's read: it unwinds
                async for data in chunks:
                    reads.append(data)
                    if until is not None and until(b"".join(reads)):
                        enough.cancel()  # the body need not end
        except httpx.TransportError as exc:
            error = exc
    return Reply(response.status_code, response.headers, reads, error)


class RawConnection:
    """One request on its own socket, read step by step: for tests of what arrives when."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.data = b""
        self.closed = False  # the server closed (EOF) or reset the connection

    @classmethod
    async def start(cls, upstream: RunningUpstream, model: str, *,
                    headers: dict[str, str] | None = None, **body: Any) -> RawConnection:
        stream = await trio.open_tcp_stream("127.0.0.1", upstream.port)
        await stream.send_all(request_bytes(model, headers=headers, **body))
        return cls(stream)

    async def read_until(self, done: bytes | None = None, *, count: int = 1) -> bytes:
        """Read until ``done`` has arrived ``count`` times, or EOF (``None``: until EOF)."""
        while not self.closed and (done is None or self.data.count(done) < count):
            await self.read_some()
        return self.data

    async def read_until_holds(self, predicate: Callable[[RawConnection], bool]) -> bytes:
        """Read until ``predicate(self)`` holds after a read, or EOF."""
        while not self.closed and not predicate(self):
            await self.read_some()
        return self.data

    async def read_some(self) -> bytes:
        """One read (EOF or a reset sets ``closed``)."""
        try:
            data = await self.stream.receive_some(65536)
        except trio.BrokenResourceError:
            data = b""
        if not data:
            self.closed = True
        self.data += data
        return data

    async def aclose(self) -> None:
        await self.stream.aclose()

    @property
    def body(self) -> Chunks:
        return dechunk(self.data.partition(b"\r\n\r\n")[2])
