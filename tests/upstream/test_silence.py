"""Servers that never answer, never end, or answer in gzip: exactly what goes on the wire."""

from __future__ import annotations

import zlib

import httpx
import pytest
import trio
from trio.testing import MockClock

from fanout import Deadlines, Endpoint, Outcome, StreamRequest, open_fanout, parse_stream
from fanout.upstream import RunningUpstream
from fanout.upstream.bomb import EVENT, MIB, gzip_bomb_size
from fanout.upstream.catalog import plan_chat
from fanout.upstream.models import DRIP_BODY, Context
from fanout.upstream.plans import Pause, Send, parse_chat_request
from tests.upstream.virtual import virtual_upstream
from tests.upstream.wire import TIMEOUT, RawConnection, chat, dechunk, payloads, raw_chat


async def test_no_response_sends_nothing_and_keeps_the_socket(upstream: RunningUpstream) -> None:
    with trio.fail_after(3):
        raw = await raw_chat(upstream, "fault/no-response", wait=0.5)
        assert (raw.data, raw.closed) == (b"", False)  # half a second of silence
        await upstream.stats.wait_for(lambda s: s.connections_closed == 1)  # we left: it did too
    assert upstream.stats.requests == {"fault/no-response": 1}


async def test_no_response_is_silent_for_ever_and_notices_the_client_leave(
        autojump_clock: MockClock) -> None:
    async with virtual_upstream() as upstream:
        client = upstream.connect("fault/no-response")
        await trio.sleep(3600)
        assert (client.writes, client.closed_at) == ([], None)  # an hour of silence, open
        client.leave()
        await client.wait_for(lambda c: c.closed_at is not None)
        assert client.closed_at == 3600  # at once: the hang watches the socket


async def test_no_response_through_httpx_is_a_read_timeout(upstream: RunningUpstream) -> None:
    timeout = httpx.Timeout(connect=5, read=0.3, write=5, pool=5)
    async with httpx.AsyncClient(base_url=upstream.base_url, timeout=timeout) as http:
        with trio.fail_after(3), pytest.raises(httpx.ReadTimeout):
            await chat(http, "fault/no-response")


async def test_drip_headers_never_ends_the_head(upstream: RunningUpstream) -> None:
    # Over loopback: the status line, then the header byte by byte, and never its end.
    # (When each byte is sent is checked on the virtual clock, below.)
    connection = await RawConnection.start(upstream, "fault/drip-headers:0.01")
    try:
        with trio.fail_after(10):
            await connection.read_until(b"x-fanout-drip: aaaaa")
    finally:
        await connection.aclose()
    assert not connection.closed
    status, _, dripped = connection.data.partition(b"\r\n")
    assert status == b"HTTP/1.1 200 OK" and b"\r\n" not in dripped  # no end to the header
    assert dripped.startswith(b"x-fanout-drip: aaaaa") and set(dripped[15:]) == {ord("a")}


async def test_drip_headers_sends_one_byte_per_pause_for_ever(autojump_clock: MockClock) -> None:
    async with virtual_upstream() as upstream:
        client = upstream.connect("fault/drip-headers:0.05")
        await trio.sleep(60 + 0.025)  # 1,200 pauses of virtual time
        (status_at, status), *drips = client.writes
        assert client.closed_at is None
    assert (status_at, status) == (0, b"HTTP/1.1 200 OK\r\n")
    assert [round(at, 6) for at, _ in drips] == [round(0.05 * k, 6) for k in range(1, 1201)]
    assert all(len(data) == 1 for _, data in drips)  # one write per byte
    assert b"".join(d for _, d in drips) == b"x-fanout-drip: " + b"a" * (1200 - 15)


async def test_drip_body_is_one_byte_at_a_time_of_an_endless_event(
        upstream: RunningUpstream) -> None:
    # @event: a server that fell behind (a loaded machine) still writes each byte on its
    # own; by default it would coalesce what is due, as a socket buffer would.
    connection = await RawConnection.start(upstream, "fault/drip-body:0.01@event")
    try:
        with trio.fail_after(10):
            await connection.read_until_holds(lambda c: len(c.body.chunks) >= 10)
    finally:
        await connection.aclose()
    head, _, _ = connection.data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and b"text/event-stream" in head
    body = connection.body
    assert not body.complete and all(len(c) == 1 for c in body.chunks)
    assert not connection.closed
    sent = body.body
    assert sent == (DRIP_BODY + b"x" * 1000)[: len(sent)]


async def test_drip_body_sends_one_chunk_per_pause_for_ever(autojump_clock: MockClock) -> None:
    async with virtual_upstream() as upstream:
        client = upstream.connect("fault/drip-body:0.02")
        await trio.sleep(60 + 0.01)  # 3,000 pauses of virtual time
        (head_at, head), *drips = client.writes
        assert client.closed_at is None
    assert head_at == 0 and head.endswith(b"\r\n\r\n") and b"text/event-stream" in head
    assert [round(at, 6) for at, _ in drips] == [round(0.02 * k, 6) for k in range(3001)]
    chunks = [dechunk(data) for _, data in drips]
    assert all(len(c.chunks) == 1 and len(c.chunks[0]) == 1 and not c.rest for c in chunks)
    assert b"".join(c.chunks[0] for c in chunks) == (DRIP_BODY + b"x" * 3001)[:3001]


def test_drip_paces_every_byte() -> None:
    request = parse_chat_request(b'{"model": "fault/drip-body:0.25", "stream": true, '
                                 b'"messages": [{"role": "user"}]}', {})
    steps = plan_chat(request, Context()).steps
    assert steps is not None
    first = [s for s, _ in zip(steps, range(200), strict=False)]
    assert {s.seconds for s in first if isinstance(s, Pause)} == {0.25}
    assert all(len(s.data) == 1 for s in first if isinstance(s, Send))


async def test_gzip_ignores_identity_and_inflates_write_by_write(
        upstream: RunningUpstream) -> None:
    with trio.fail_after(3):
        connection = await RawConnection.start(
            upstream, "fault/gzip@event", headers={"accept-encoding": "identity"}, max_tokens=5)
        await connection.read_until(b"\r\n0\r\n\r\n")
    head = connection.data.partition(b"\r\n\r\n")[0].lower()
    assert b"\r\ncontent-encoding: gzip\r\n" in head
    body = connection.body
    assert body.complete and body.body.startswith(b"\x1f\x8b")
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
    pieces = [inflate.decompress(chunk) for chunk in body.chunks]
    assert inflate.eof and inflate.unused_data == b""
    # one write, one event: each chunk inflates to whole events at once (sync flushes)
    assert all(p.endswith(b"\n\n") and p.count(b"\n\n") == 1 for p in pieces[:-1])
    result = parse_stream(pieces)
    assert result.outcome is Outcome.COMPLETED and len(result.text) > 5
    await connection.aclose()


async def test_gzip_through_httpx(client: httpx.AsyncClient) -> None:
    reply = await chat(client, "fault/gzip", decoded=True, seed=2,
                       headers={"accept-encoding": "identity"})
    assert reply.headers["content-encoding"] == "gzip"
    assert parse_stream(reply.reads).outcome is Outcome.COMPLETED
    plain = await client.post("/chat/completions", json={
        "model": "fault/gzip", "messages": [{"role": "user", "content": "hi"}]},
        headers={"accept-encoding": "identity"})
    assert plain.headers["content-encoding"] == "gzip"
    assert plain.json()["object"] == "chat.completion"  # httpx inflated it


async def test_gzip_bomb_is_small_on_the_wire_and_huge_inflated(
        upstream: RunningUpstream) -> None:
    mib = 64
    async with httpx.AsyncClient(base_url=upstream.base_url, timeout=TIMEOUT) as http:
        with trio.fail_after(10):
            reply = await chat(http, f"fault/gzip-bomb:{mib}")
    assert reply.headers["content-encoding"] == "gzip" and reply.error is None
    wire = reply.body
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
    inflated = 0
    head = b""
    for start in range(0, len(wire), 4096):  # inflated a bounded piece at a time
        piece = inflate.decompress(wire[start:start + 4096], 4 * MIB)
        while piece:
            inflated += len(piece)
            head = head or piece[: len(EVENT) * 2]
            piece = inflate.decompress(inflate.unconsumed_tail, 4 * MIB)
    assert inflate.eof and inflate.unused_data == b""  # one member; CRC and length right
    assert inflated == mib * MIB == int(reply.headers["x-fanout-inflated-bytes"])
    assert len(wire) == gzip_bomb_size(mib) and len(wire) * 500 < inflated
    first, second = payloads(head)
    assert first == second and first["choices"][0]["delta"]["content"].startswith("xxxx")
    assert gzip_bomb_size(1024) < 3_000_000  # the default: a GiB from under 3 MB


def test_gzip_bomb_default_size() -> None:
    request = parse_chat_request(b'{"model": "fault/gzip-bomb", "stream": true, '
                                 b'"messages": [{"role": "user"}]}', {})
    plan = plan_chat(request, Context())
    assert dict(plan.headers)["x-fanout-inflated-bytes"] == str(1024 * MIB)
    assert plan.steps is not None
    sent = sum(len(s.data) for s in plan.steps if isinstance(s, Send))
    assert sent == gzip_bomb_size(1024) < 3_000_000


async def test_endless_never_ends(upstream: RunningUpstream) -> None:
    with trio.fail_after(3):
        connection = await RawConnection.start(upstream, "fault/endless")
        await connection.read_until(b"data: ", count=5_000)  # at cadence 0: quickly
        assert not connection.closed
        await connection.aclose()
        await upstream.stats.wait_for(lambda s: s.connections_open == 0)
    body = connection.body.body
    assert b"[DONE]" not in body and b'"finish_reason":"' not in body
    chunks = payloads(body)
    assert all(len(c["choices"][0]["delta"]["content"]) <= 8 for c in chunks[1:])


async def test_endless_at_a_cadence(upstream: RunningUpstream) -> None:
    connection = await RawConnection.start(upstream, "fault/endless:0.01")
    try:
        with trio.fail_after(10):
            await connection.read_until(b"\n\n", count=5)
    finally:
        await connection.aclose()
    assert not connection.closed
    first, *deltas = payloads(connection.body.body)
    assert first["choices"][0]["delta"]["role"] == "assistant"
    assert len(deltas) >= 4 and all(d["choices"][0]["delta"]["content"] for d in deltas)


async def test_endless_sends_one_delta_per_pause_for_ever(autojump_clock: MockClock) -> None:
    async with virtual_upstream() as upstream:
        client = upstream.connect("fault/endless:0.02")
        await trio.sleep(60 + 0.01)
        (head_at, _), *writes = client.writes
        assert client.closed_at is None
    assert head_at == 0 and [round(at, 6) for at, _ in writes] == [
        round(0.02 * k, 6) for k in range(3001)]
    for k, (_, data) in enumerate(writes):
        [chunk] = payloads(dechunk(data).body)  # one event a write
        delta = chunk["choices"][0]["delta"]
        assert delta == {"role": "assistant", "content": ""} if k == 0 else delta["content"]
        assert chunk["choices"][0]["finish_reason"] is None


def test_dechunk_helper() -> None:
    assert dechunk(b"3\r\nabc\r\n0\r\n\r\n").complete
    broken = dechunk(b"3\r\nabc\r\n8\r\nabcd")
    assert (broken.chunks, broken.complete, broken.rest) == ((b"abc",), False, b"8\r\nabcd")


async def test_ping_then_answer_sends_only_keepalives_then_the_answer(
        autojump_clock: MockClock) -> None:
    # llama.cpp on a long prompt: the headers, a `: ping` each interval, then the answer.
    async with virtual_upstream() as upstream:
        client = upstream.connect("fault/ping-then-answer:1:0.1")
        await client.wait_for(lambda c: c.body.complete)
    _, *writes = client.writes  # the headers first, at once
    bodies = [dechunk(data).body for _, data in writes]
    assert [round(at, 6) for at, _ in writes[:9]] == [round(0.1 * k, 6) for k in range(1, 10)]
    assert set(bodies[:9]) == {b": ping - fanout keep-alive\n\n"}
    assert writes[9][0] == pytest.approx(1.0)  # then the whole answer, at cadence 0
    answer = parse_stream(bodies[9:])
    assert answer.outcome is Outcome.COMPLETED and answer.text and answer.comments == 0


async def test_ping_then_answer_interval_zero_is_silence(autojump_clock: MockClock) -> None:
    async with virtual_upstream() as upstream:
        client = upstream.connect("fault/ping-then-answer:2:0")
        await client.wait_for(lambda c: c.body.complete)
    (_, head), (at, _), *_ = client.writes
    assert head.startswith(b"HTTP/1.1 200") and at == pytest.approx(2.0)
    assert b": ping" not in client.data


@pytest.mark.parametrize("api", ["chat", "responses", "anthropic"])
async def test_a_27_s_prompt_with_keepalives_is_no_idle_stream(autojump_clock: MockClock,
                                                                api: str) -> None:
    # #27: `idle = 5`, a 27 s prompt, a keep-alive a second (Anthropic: ping events).  On
    # virtual time through fanout's own client: the times are exact.
    requests = [StreamRequest(f"{model}/{api}", model, [{"role": "user", "content": "hi"}],
                              api=api)
                for model in ("fault/ping-then-answer:27:1", "fault/ping-then-answer:27:0")]
    async with virtual_upstream() as upstream:
        endpoint = Endpoint("http://upstream.test/v1", "sk-virtual")
        async with (upstream.http_client(timeout=httpx.Timeout(10, read=None)) as client,
                    open_fanout(endpoint, requests, client=client,
                                deadlines=Deadlines(idle=5)) as fan):
            async for _ in fan.events:
                pass
    pinged = fan.results[f"fault/ping-then-answer:27:1/{api}"]
    assert pinged.outcome is Outcome.COMPLETED, pinged.reason
    assert pinged.timings is not None and pinged.timings.ttft == pytest.approx(27.0)
    silent = fan.results[f"fault/ping-then-answer:27:0/{api}"]  # no keep-alive: idle
    assert (silent.outcome, silent.timed_out) == (Outcome.TIMED_OUT, "idle")
    assert silent.reason == "no event within 5 s"
    assert silent.timings is not None and silent.timings.end == pytest.approx(5.0)
