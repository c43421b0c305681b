"""Slow clients: a request's head and body are read within deadlines (then a 408 and the
connection closed), and no more connections are read at once than the cap (one more
closes the one read the longest).  Real sockets on 127.0.0.1 with small limits; what is
asserted is what the client receives and in which order, and the service's counts."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from fanout.upstream import RunningUpstream

from .helpers import Served, make_config, serving

BODY = json.dumps({"models": ["fast"], "messages": [{"role": "user", "content": "hi"}]}
                  ).encode()


def head(length: int | None = None, path: str = "/v1/fanout") -> bytes:
    method = "POST" if length is not None else "GET"
    lines = [f"{method} {path} HTTP/1.1", "host: 127.0.0.1"]
    if length is not None:
        lines += ["content-type: application/json", f"content-length: {length}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


@asynccontextmanager
async def served_with(upstream: RunningUpstream, serve: str) -> AsyncIterator[Served]:
    async with serving(upstream, make_config(serve)) as running:
        yield running


OPEN: list[trio.SocketStream] = []


async def connect(served: Served) -> trio.SocketStream:
    """A connection to the service (closed at the end of the test)."""
    port = int(served.url.rsplit(":", 1)[1])
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    OPEN.append(stream)
    return stream


@pytest.fixture(autouse=True)
async def close_connections() -> AsyncIterator[None]:
    yield
    while OPEN:
        await OPEN.pop().aclose()


async def read_to_end(stream: trio.SocketStream) -> bytes:
    data = bytearray()
    try:
        while chunk := await stream.receive_some(65536):
            data += chunk
    except trio.BrokenResourceError:  # a reset after the server closed: the end too
        pass
    return bytes(data)


async def drip(stream: trio.SocketStream, data: bytes, gap: float,
               closed: trio.Event) -> int:
    """Send ``data`` a byte at a time, ``gap`` seconds apart, until the server closes
    (``closed``); how many bytes went."""
    for index in range(len(data)):
        with trio.move_on_after(gap):
            await closed.wait()
        if closed.is_set():
            return index
        try:
            await stream.send_all(data[index:index + 1])
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return index
    return len(data)


async def dripped(stream: trio.SocketStream, data: bytes, gap: float) -> tuple[int, bytes]:
    """Drip ``data`` while reading what the server sends to its end: (bytes sent before
    the server closed, what it sent)."""
    closed = trio.Event()
    got: list[bytes] = []

    async def reader() -> None:
        got.append(await read_to_end(stream))
        closed.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        sent = await drip(stream, data, gap, closed)
        await closed.wait()
    return sent, got[0]


async def read_response(stream: trio.SocketStream) -> bytes:
    """One whole response with a content-length, the connection left open."""
    raw = b""
    while b"\r\n\r\n" not in raw or len(raw.partition(b"\r\n\r\n")[2]) < int(
            raw.lower().partition(b"content-length: ")[2].split(b"\r")[0] or b"0"):
        chunk = await stream.receive_some(65536)
        assert chunk, raw
        raw += chunk
    return raw


def response(raw: bytes) -> tuple[int, dict[str, Any] | None]:
    """The status of the one response in ``raw`` and its JSON body (None if empty)."""
    head_part, _, body = raw.partition(b"\r\n\r\n")
    status = int(head_part.split(b" ", 2)[1])
    assert raw.count(b"HTTP/1.1 ") == 1, raw
    return status, json.loads(body) if body else None


async def wait_reading(served: Served, count: int) -> None:
    """Until the service reads ``count`` connections (accepted ones are registered at once)."""
    assert served.service.readers is not None
    while len(served.service.readers) != count:
        await trio.sleep(0.01)


# ------------------------------------------------------------------ the head

async def test_a_head_dripped_a_byte_at_a_time_gets_a_408_and_is_closed(
        upstream: RunningUpstream) -> None:
    async with served_with(upstream, "head_timeout = 0.5") as served:
        stream = await connect(served)
        # A head that would take 400 drips to finish: the deadline comes long before.
        data = head(len(BODY))[:-4] + b"\r\nx-pad: " + b"a" * 400 + b"\r\n\r\n"
        with trio.fail_after(30):
            sent, raw = await dripped(stream, data, random.uniform(0.005, 0.02))
        assert 0 < sent < len(data)
        status, body = response(raw)
        assert status == 408 and body is not None
        assert body["error"]["code"] == "request_timeout"
        assert body["error"]["message"] == ("the request head was not whole within 0.5 s "
                                            "(this service's head_timeout)")
        assert served.service.status()["reading"]["closed"] == {
            "head_timeout": 1, "body_timeout": 0, "too_many": 0}


async def test_a_connection_that_sends_nothing_is_closed_without_a_response(
        upstream: RunningUpstream) -> None:
    async with served_with(upstream, "head_timeout = 0.3") as served:
        stream = await connect(served)
        with trio.fail_after(30):
            assert await read_to_end(stream) == b""
        assert served.service.status()["reading"]["closed"]["head_timeout"] == 1


async def test_a_kept_alive_connection_gets_the_head_deadline_again(
        upstream: RunningUpstream) -> None:
    async with served_with(upstream, "head_timeout = 0.5") as served:
        stream = await connect(served)
        with trio.fail_after(30):
            for _ in range(2):  # two whole requests on one connection: both answered
                await stream.send_all(head(path="/healthz"))
                assert (await read_response(stream)).startswith(b"HTTP/1.1 200 ")
            third = b"GET /healthz HTTP/1.1\r\nx-pad: " + b"a" * 300 + b"\r\n\r\n"
            sent, raw = await dripped(stream, third, 0.01)
        assert sent < len(third)
        assert response(raw)[0] == 408


# ------------------------------------------------------------------ the body

async def test_a_body_dripped_a_byte_at_a_time_gets_a_408_and_is_closed(
        upstream: RunningUpstream) -> None:
    async with served_with(upstream, "body_timeout = 0.5\nbody_min_rate = 1000") as served:
        stream = await connect(served)
        body = BODY + b" " * 1000
        await stream.send_all(head(len(body)))
        with trio.fail_after(30):
            sent, raw = await dripped(stream, body, random.uniform(0.005, 0.02))
        assert 0 < sent < len(body)
        status, error = response(raw)
        assert status == 408 and error is not None
        assert error["error"]["code"] == "request_timeout"
        assert error["error"]["message"].startswith("the request body came too slowly: ")
        assert error["error"]["message"].endswith(
            "(this service allows body_timeout 0.5 s plus 1 s per body_min_rate 1000 bytes)")
        assert served.service.status()["reading"]["closed"] == {
            "head_timeout": 0, "body_timeout": 1, "too_many": 0}


@pytest.mark.parametrize("seed", range(3))
async def test_a_body_at_the_minimum_rate_is_read_whole(upstream: RunningUpstream,
                                                        seed: int) -> None:
    # Each 100 bytes buy a second; they come well within it.
    async with served_with(upstream, "body_timeout = 1\nbody_min_rate = 100") as served:
        stream = await connect(served)
        body = BODY + b" " * 300
        await stream.send_all(head(len(body)))
        pace = random.Random(seed)
        with trio.fail_after(30):
            for start in range(0, len(body), 50):
                await trio.sleep(pace.uniform(0, 0.05))
                await stream.send_all(body[start:start + 50])
            raw = await read_response(stream)
        assert raw.startswith(b"HTTP/1.1 200 "), raw[:200]
        assert json.loads(raw.partition(b"\r\n\r\n")[2])["object"] == "fanout"
        assert served.service.status()["reading"]["closed"]["body_timeout"] == 0


# ------------------------------------------------------------------ the cap

async def test_past_the_cap_the_connection_read_the_longest_is_closed(
        upstream: RunningUpstream) -> None:
    async with served_with(upstream, "max_reading_connections = 3\nhead_timeout = 60"
                           ) as served:
        with trio.fail_after(30):
            slow: list[trio.SocketStream] = []
            for count in range(1, 4):  # three slow heads, in order
                stream = await connect(served)
                await stream.send_all(b"GET /healthz HT")
                slow.append(stream)
                await wait_reading(served, count)
            fourth = await connect(served)
            raw = await read_to_end(slow[0])  # the oldest goes
            assert response(raw)[0] == 408
            assert b"max_reading_connections" in raw
            await wait_reading(served, 3)
            fifth = await connect(served)
            assert response(await read_to_end(slow[1]))[0] == 408  # then the next oldest
            await wait_reading(served, 3)
            assert served.service.status()["reading"] == {
                "connections": 3, "closed": {"head_timeout": 0, "body_timeout": 0,
                                             "too_many": 2}}
            # The ones still read are served when they finish their heads.
            for stream, rest in ((slow[2], b"TP/1.1\r\nhost: x\r\n\r\n"),
                                 (fourth, head(path="/healthz")),
                                 (fifth, head(path="/healthz"))):
                await stream.send_all(rest)
                assert (await read_response(stream)).startswith(b"HTTP/1.1 200 ")
        assert served.service.status()["reading"]["closed"]["too_many"] == 2
