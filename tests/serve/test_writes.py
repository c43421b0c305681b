"""How the service writes a stream: what is ready goes in one write, nothing waits for
more, keep-alives fill silences, the body's writes skip the middlewares, and a write the
socket takes at once costs no schedule point of its own."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import pytest
import trio
from trio.testing import MockClock, assert_no_checkpoints

from fanout._channel import EventChannel
from fanout.config import ServeConfig
from fanout.core.events import Event, TextDelta
from fanout.serve import run
from fanout.serve.reading import (
    ASGIApp,
    Message,
    Readers,
    ReadingStream,
    Receive,
    Scope,
    Send,
)
from fanout.serve.relay import drain
from fanout.serve.sse import KEEPALIVE, SSEOut
from fanout.upstream import RunningUpstream

from .helpers import ask, make_config, post_sse, serving


class RecordingOut:
    """An ``Out`` that keeps each write with its (virtual) time."""

    def __init__(self, keepalive: float | None) -> None:
        self.keepalive = keepalive
        self.quiet_since = trio.current_time()
        self.parts: list[str] = []
        self.writes: list[tuple[float, str]] = []

    def add_event(self, name: str, payload: Mapping[str, Any]) -> None:
        self.parts.append(payload["text"])

    def add_data(self, payload: Mapping[str, Any]) -> None:  # pragma: no cover
        self.parts.append(payload["text"])

    def add_done(self) -> None:  # pragma: no cover
        self.parts.append("[DONE]")

    async def flush(self) -> None:
        if self.parts:
            data = "".join(self.parts)
            self.parts.clear()
            await self._write(data)

    async def idle(self) -> None:
        await self.flush()
        await self._write(KEEPALIVE.decode())

    async def _write(self, data: str) -> None:
        self.writes.append((trio.current_time(), data))
        await trio.lowlevel.checkpoint()
        self.quiet_since = trio.current_time()


@pytest.mark.parametrize("seed", range(8))
async def test_drain_writes_what_is_ready_at_once_and_keeps_alive_after_each_silence(
        autojump_clock: MockClock, seed: int) -> None:
    """Events sent together are one write, at the moment they were sent (no window);
    each silence of the keep-alive period after a write gets a keep-alive, counted from
    that write.  Random gaps and burst sizes."""
    rng = random.Random(seed)
    keepalive = 1.0
    send, receive = trio.open_memory_channel[Event](1000)
    out = RecordingOut(keepalive)
    start = trio.current_time()
    expected: list[tuple[float, str]] = []
    plan: list[tuple[float, list[str]]] = []
    at, last_write, number = 0.0, 0.0, 0
    for _ in range(12):
        at += rng.choice([0.01, 0.3, 0.9, 1.7, 3.4]) + rng.random() / 10
        burst = [f"e{number + i}." for i in range(rng.randint(1, 4))]
        number += len(burst)
        plan.append((at, burst))
        silence = last_write + keepalive
        while silence < at:
            expected.append((silence, KEEPALIVE.decode()))
            last_write, silence = silence, silence + keepalive
        expected.append((at, "".join(burst)))
        last_write = at

    async def produce() -> None:
        async with send:
            for when, burst in plan:
                await trio.sleep_until(start + when)
                for text in burst:
                    send.send_nowait(TextDelta(0, text, stream="a"))

    def handle(event: Event) -> None:
        out.add_event("text", {"text": event.text})  # type: ignore[attr-defined]

    async with trio.open_nursery() as nursery:
        nursery.start_soon(produce)
        await drain(EventChannel(receive), handle, out)
    got = [(round(when - start, 6), data) for when, data in out.writes]
    assert got == [(round(when, 6), data) for when, data in expected]


async def test_drain_without_keepalive_only_relays(autojump_clock: MockClock) -> None:
    send, receive = trio.open_memory_channel[Event](10)
    out = RecordingOut(None)

    async def produce() -> None:
        async with send:
            await trio.sleep(50)
            send.send_nowait(TextDelta(0, "late", stream="a"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(produce)
        await drain(EventChannel(receive), lambda e: out.add_event("text", {"text": "late"}),
                    out)
    assert [data for _, data in out.writes] == ["late"]


async def test_a_keep_alive_never_queues_behind_a_write_under_way(
        autojump_clock: MockClock) -> None:
    """A write that waits 4.5 s for a slow client is no silence: the next keep-alive
    comes a period after it ended, none is queued behind it."""
    start = trio.current_time()
    writes: list[tuple[float, bytes]] = []

    async def send(message: Message) -> None:
        if not writes and message["body"] != KEEPALIVE:
            await trio.sleep(4.5)
        writes.append((trio.current_time() - start, message["body"]))

    out = SSEOut(send, keepalive=1.0)
    sender, receive = trio.open_memory_channel[Event](10)

    async def produce() -> None:
        async with sender:
            sender.send_nowait(TextDelta(0, "slow", stream="a"))
            await trio.sleep(7)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(produce)
        await drain(EventChannel(receive), lambda e: out.add_event("text", {"n": 1}), out)
    assert writes == [(4.5, b'event: text\ndata: {"n":1}\n\n'), (5.5, KEEPALIVE),
                      (6.5, KEEPALIVE)]


class Watching:
    """Wraps the app as a middleware would: counts the messages sent through it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.seen: list[Message] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def watched(message: Message) -> None:
            self.seen.append(message)
            await send(message)

        await self.app(scope, receive, watched)


@pytest.mark.parametrize("path", ["/v1/fanout", "/v1/chat/completions"])
async def test_a_streamed_body_goes_to_the_server_past_every_middleware(
        upstream: RunningUpstream, monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    """The head passes the middlewares (their headers are on it); the body's writes go
    to the server's own send, not through a wrapper a write."""
    watching: list[Watching] = []
    create_app = run.create_app

    def watched_app(service: Any) -> Any:
        watching.append(Watching(create_app(service)))
        return watching[-1]

    monkeypatch.setattr(run, "create_app", watched_app)
    config = make_config('cors_origins = ["https://app.example"]')
    body = ask("fast", "tools") if path == "/v1/fanout" else {
        "model": "fast", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    async with serving(upstream, config, replica="eu-1") as served, \
            served.client(origin="https://app.example") as client:
        got = await post_sse(client, path, body)
    assert got.status == 200
    assert got.headers["x-fanout-replica"] == "eu-1"
    assert got.headers["access-control-allow-origin"] == "https://app.example"
    assert got.raw.endswith(b"data: [DONE]\n\n")
    assert len(got.events) > 5
    (app,) = watching
    kinds = [message["type"] for message in app.seen]
    assert kinds == ["http.response.start"]
    headers = dict(app.seen[0]["headers"])
    assert headers[b"x-fanout-replica"] == b"eu-1"


async def socket_pair() -> tuple[ReadingStream, trio.SocketStream]:
    """A ``ReadingStream`` as the server wraps an accepted connection, and its peer."""
    ours, theirs = trio.socket.socketpair()
    connection = Readers(ServeConfig()).open()
    return ReadingStream(trio.SocketStream(ours), connection), trio.SocketStream(theirs)


async def test_a_write_the_socket_takes_at_once_makes_no_schedule_point() -> None:
    """Hypercorn takes its send lock (a schedule point) before each write: the write
    itself makes none when the socket takes it whole."""
    writer, reader = await socket_pair()
    async with writer, reader:
        for size in (1, 100, 4000):
            with assert_no_checkpoints():
                await writer.send_all(b"x" * size)
            with trio.fail_after(5):
                got = b""
                while len(got) < size:
                    got += await reader.receive_some()
            assert got == b"x" * size
        assert writer.connection.sent


@pytest.mark.parametrize("seed", range(4))
async def test_what_the_socket_cannot_take_at_once_waits_and_arrives_whole(seed: int) -> None:
    rng = random.Random(seed)
    writer, reader = await socket_pair()
    data = rng.randbytes(rng.randint(1, 4) * 1_000_000)
    got = bytearray()

    async def read() -> None:
        while len(got) < len(data):
            got.extend(await reader.receive_some(rng.choice([1000, 65536])))
            if rng.random() < 0.3:
                await trio.sleep(0)

    async with writer, reader:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read)
                offset = 0
                while offset < len(data):
                    size = rng.choice([10, 5000, 300_000, 2_000_000])
                    await writer.send_all(data[offset:offset + size])
                    offset += size
    assert bytes(got) == data


async def test_a_write_to_a_gone_peer_or_a_closed_stream_raises_trio_errors() -> None:
    writer, reader = await socket_pair()
    await reader.aclose()
    with trio.fail_after(5), pytest.raises(trio.BrokenResourceError):
        while True:
            await writer.send_all(b"x" * 1000)
    await writer.aclose()
    with pytest.raises(trio.ClosedResourceError):
        await writer.send_all(b"x")
