"""The connection's faults, on the wire: keep-alive connections closed unannounced at the
next request (cleanly or with a reset), seeded at random, and an error body that is an
event stream."""

from __future__ import annotations

import json

import pytest
import trio

from fanout.upstream import RunningUpstream, open_upstream

from .wire import raw_chat, request_bytes

END_OF_BODY = b"\r\n0\r\n\r\n"  # the last chunk of a chunked body


async def read_response(stream: trio.SocketStream) -> bytes:
    """One whole chunked response from a kept-alive connection."""
    data = b""
    while END_OF_BODY not in data:
        piece = await stream.receive_some(65536)
        assert piece, f"the connection closed mid-response: {data[-80:]!r}"
        data += piece
    return data


async def second_request(upstream: RunningUpstream, model: str,
                         prompt: str = "Tell me something about rivers.") -> bytes | None:
    """Send a request, read its response, send another on the same connection.

    Returns what came back for the second one (``b""``: closed with no byte), or
    ``None`` when the connection was reset.
    """
    messages = [{"role": "user", "content": prompt}]
    stream = await trio.open_tcp_stream("127.0.0.1", upstream.port)
    try:
        await stream.send_all(request_bytes(model, messages=messages))
        first = await read_response(stream)
        assert first.startswith(b"HTTP/1.1 200") and b"[DONE]" in first
        assert b"connection: close" not in first.lower()  # nothing warns the client
        await stream.send_all(request_bytes("mock/fast"))
        data = b""
        try:
            while END_OF_BODY not in data:
                piece = await stream.receive_some(65536)
                if not piece:
                    break
                data += piece
        except trio.BrokenResourceError:
            return None
        return data
    finally:
        await stream.aclose()


async def test_close_after_response_closes_at_the_next_request_unanswered(
        upstream: RunningUpstream) -> None:
    with trio.fail_after(10):
        assert await second_request(upstream, "fault/close-after-response") == b""
    assert (upstream.stats.unanswered, upstream.stats.reset) == (1, 0)
    assert upstream.stats.requests == {"fault/close-after-response": 1}  # never planned


async def test_close_after_response_reset_resets_the_connection(
        upstream: RunningUpstream) -> None:
    with trio.fail_after(10):
        assert await second_request(upstream, "fault/close-after-response:reset") is None
    assert (upstream.stats.unanswered, upstream.stats.reset) == (1, 1)


async def test_close_after_response_closes_an_idle_connection_after_its_window(
        upstream: RunningUpstream) -> None:
    stream = await trio.open_tcp_stream("127.0.0.1", upstream.port)
    with trio.fail_after(10):
        await stream.send_all(request_bytes("fault/close-after-response:0.05"))
        await read_response(stream)
        assert await stream.receive_some(65536) == b""  # closed while idle, nothing sent
    await stream.aclose()
    assert upstream.stats.unanswered == 0


async def test_a_plain_model_keeps_the_connection_for_the_next_request(
        upstream: RunningUpstream) -> None:
    with trio.fail_after(10):
        answer = await second_request(upstream, "mock/fast")
    assert answer is not None and answer.startswith(b"HTTP/1.1 200")
    assert upstream.stats.unanswered == 0


async def close_idle_pattern(model: str, prompts: list[str]) -> list[bool]:
    async with open_upstream() as upstream:
        closed = [await second_request(upstream, model, prompt) == b"" for prompt in prompts]
        assert upstream.stats.unanswered == sum(closed)
        return closed


@pytest.mark.parametrize("seed", [0, 7, 12345])
async def test_close_idle_closes_some_connections_the_same_way_each_run(
        seed: int, watchdog: None) -> None:
    prompts = [f"Question {i} about rivers." for i in range(24)]
    model = f"fault/close-idle:0.5:{seed}"
    with trio.fail_after(15):
        one = await close_idle_pattern(model, prompts)
        two = await close_idle_pattern(model, list(reversed(prompts)))
    assert one == list(reversed(two))  # decided by seed and conversation, not by order
    assert 0 < sum(one) < len(one)
    with trio.fail_after(15):
        assert not any(await close_idle_pattern("fault/close-idle:0", prompts[:4]))
        assert all(await close_idle_pattern("fault/close-idle:1", prompts[:4]))


@pytest.mark.parametrize("route", ["chat", "anthropic"])
async def test_sse_500_sends_its_error_as_an_event(upstream: RunningUpstream,
                                                   route: str) -> None:
    if route == "chat":
        reply = await raw_chat(upstream, "fault/sse-500")
    else:
        stream = await trio.open_tcp_stream("127.0.0.1", upstream.port)
        body = json.dumps({"model": "fault/sse-500", "max_tokens": 5, "stream": True,
                           "messages": [{"role": "user", "content": "hi"}]}).encode()
        await stream.send_all(
            b"POST /v1/messages HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
            b"anthropic-version: 2023-06-01\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
        data = b""
        with trio.fail_after(5):
            while b"\r\n\r\n" not in data or b"}\n\n" not in data:
                data += await stream.receive_some(65536)
        await stream.aclose()
        head, _, rest = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 500")
        assert rest.startswith(b"event: error\ndata: {")
        return
    assert reply.status == 500
    assert reply.header("content-type")[0].startswith("text/event-stream")
    assert reply.data.partition(b"\r\n\r\n")[2].startswith(b"data: {\"error\":")
