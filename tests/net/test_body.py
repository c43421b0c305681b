"""The direct body reader (h11 over the pool's own socket stream) against httpx's
``aiter_raw``: the same results, the same errors, the connection left to the pool."""

from __future__ import annotations

import errno
import random
import socket
import struct
from functools import partial
from typing import Any

import attrs
import h11
import httpx
import pytest
import trio

import fanout.net.stream as stream_module
from fanout import Endpoint, Outcome, RetryPolicy, StreamRequest, StreamResult, run_fanout
from fanout.net import body
from fanout.upstream import RunningUpstream

MESSAGES = [{"role": "user", "content": "Say something about rivers."}]
MODELS = ["mock/fast", "mock/reasoning", "mock/tools", "fault/truncate:7",
          "fault/drop-chunked:6", "fault/no-done", "fault/garbage", "fault/bad-utf8",
          "fault/error-event", "fault/empty-200", "fault/gzip", "fault/empty-stop",
          "fault/negative-index", "fault/many-tools:300"]


def _comparable(result: StreamResult) -> dict[str, Any]:
    kept = attrs.asdict(result, recurse=False)
    for varying in ("timings", "attempts", "headers", "content_key", "others_running"):
        kept.pop(varying, None)
    return kept


async def _run(upstream: RunningUpstream, direct: bool, monkeypatch: pytest.MonkeyPatch,
               **options: Any) -> tuple[dict[str, StreamResult], list[bool]]:
    used: list[bool] = []

    def reader(response: Any) -> Any:
        found = body.body_reader(response) if direct else None
        used.append(found is not None)
        return found

    monkeypatch.setattr(stream_module, "body_reader", reader)
    requests = [StreamRequest(f"{model}#{i}", model, MESSAGES, {"seed": i})
                for model in MODELS for i in range(2)]
    results = await run_fanout(Endpoint(upstream.base_url, "sk-body-test"), requests,
                               retry=RetryPolicy(attempts=1), **options)
    return results, used


async def test_the_direct_reader_gives_what_aiter_raw_gives(upstream: RunningUpstream,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    direct, used = await _run(upstream, True, monkeypatch)
    assert used and all(used)  # fanout's own client: every 2xx body read directly
    plain, used = await _run(upstream, False, monkeypatch)
    assert not any(used)
    assert direct.keys() == plain.keys()
    for key in direct:
        assert _comparable(direct[key]) == _comparable(plain[key]), key
    outcomes = {r.outcome for r in direct.values()}
    assert {Outcome.COMPLETED, Outcome.TRUNCATED, Outcome.ERROR} <= outcomes
    cut = direct["fault/drop-chunked:6#0"]
    assert cut.error is not None and "RemoteProtocolError" in cut.error.message


async def test_a_body_read_to_its_end_leaves_its_connection_to_the_pool(
        upstream: RunningUpstream, monkeypatch: pytest.MonkeyPatch) -> None:
    results, used = await _run(upstream, True, monkeypatch, max_concurrency=1)
    assert all(used)
    # One stream at a time: every whole response hands its connection to the next
    # request; only the cut ones (closed by the server or by fanout) need new ones.
    broken = sum(r.outcome is not Outcome.COMPLETED or r.error is not None
                 for r in results.values())
    assert upstream.stats.connections_opened <= 1 + broken + 4
    assert upstream.stats.connections_opened < len(results)


async def _pair() -> tuple[trio.SocketStream, trio.SocketStream]:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    client = await trio.open_tcp_stream("127.0.0.1", port)
    server = await listeners[0].accept()
    await listeners[0].aclose()
    return client, server


def _readers(client: trio.SocketStream) -> dict[str, Any]:
    state = h11.Connection(h11.CLIENT)
    lean = body._H11Body(state, client.receive_some, client.socket)
    through_trio = body._H11Body(state, client.receive_some)

    async def read(reader: Any, size: int) -> bytes:
        monkey = body.RECEIVE_SIZE
        body.RECEIVE_SIZE = size
        try:
            return await reader._read()  # type: ignore[no-any-return]
        finally:
            body.RECEIVE_SIZE = monkey

    return {"lean": partial(read, lean), "trio": partial(read, through_trio)}


@pytest.mark.parametrize("which", ["lean", "trio"])
async def test_the_socket_reader_reads_as_trio_does(which: str) -> None:
    client, server = await _pair()
    read = _readers(client)[which]
    with trio.CancelScope() as scope:
        scope.cancel()
        await read(100)  # cancelled before any data: nothing read
    await server.send_all(b"data: one\n\n")
    assert await read(100) == b"data: one\n\n"
    await server.send_all(b"abcdef")
    assert await read(4) == b"abcd"
    assert await read(100) == b"ef"
    await server.aclose()
    assert await read(100) == b""
    await client.aclose()
    with pytest.raises(httpx.ReadError) as info:
        await read(100)
    assert isinstance(info.value.__cause__, trio.ClosedResourceError)


async def test_a_reset_reads_as_the_same_error_as_trios() -> None:
    errors: dict[str, BaseException] = {}
    for which in ("lean", "trio"):
        client, server = await _pair()
        # SO_LINGER with a zero timeout: close() sends RST, not FIN.
        server.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await server.aclose()
        with pytest.raises(httpx.ReadError) as info:
            await _readers(client)[which](100)
        errors[which] = info.value
        await client.aclose()
    # The same httpx error, message and causes as httpcore's reads give (the OS's
    # reason is what fanout's error line quotes).
    assert str(errors["lean"]) == str(errors["trio"])
    assert "Connection reset" in str(errors["lean"])
    for error in errors.values():
        assert isinstance(error.__cause__, trio.BrokenResourceError)
        cause = error.__cause__.__cause__
        assert isinstance(cause, OSError) and cause.errno == errno.ECONNRESET


def _chunked(payloads: list[bytes]) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in payloads)


BODIES = {
    "plain": _chunked([b"data: %d\n\n" % i * (i % 5 + 1) for i in range(40)]) + b"0\r\n\r\n",
    "extensions and trailers": (_chunked([b"one "]) + b"5;name=value\r\ntwo  \r\n"
                                + _chunked([b"three"]) + b"0\r\nx-trailer: 1\r\n\r\n"),
    "upper-case hex and leading zeros": (b"000A\r\n0123456789\r\n" + _chunked([b"x" * 300])
                                         + b"00\r\n\r\n"),
    "cut mid-chunk": _chunked([b"abc"]) + b"10\r\nonly part",
    "cut mid-header": _chunked([b"abc"]) + b"1",
    "bad footer": _chunked([b"abc"]) + b"3\r\ndefXY" + _chunked([b"g"]) + b"0\r\n\r\n",
    "bad header": _chunked([b"abc"]) + b"zz\r\nnope\r\n0\r\n\r\n",
}


async def _read_all(raw: bytes, cuts: list[int], own: bool, monkeypatch: pytest.MonkeyPatch
                    ) -> tuple[bytes, str, Any]:
    state = h11.Connection(h11.CLIENT)
    state.send(h11.Request(method="GET", target="/", headers=[("host", "x")]))
    state.send(h11.EndOfMessage())
    state.receive_data(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
    assert type(state.next_event()) is h11.Response
    pieces = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    pieces.append(b"")

    async def receive(size: int) -> bytes:
        await trio.lowlevel.checkpoint()
        return pieces.pop(0)

    reader = body._H11Body(state, receive)
    if not own:
        monkeypatch.setattr(body._H11Body, "_at_boundary", lambda self: False)
    got = []
    error = ""
    try:
        async for data in reader:
            got.append(data)
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}"
    return b"".join(got), error, (state.our_state, state.their_state)


@pytest.mark.parametrize("name", sorted(BODIES))
@pytest.mark.parametrize("seed", range(6))
async def test_chunks_decoded_here_read_as_h11_reads_them(name: str, seed: int,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    # Whole, byte by byte, and at random cuts: the same payload, the same error, and
    # the same end state (DONE: the connection can go back to the pool) as h11 alone.
    raw = BODIES[name]
    rng = random.Random(seed)
    cuts = ([] if seed == 0 else list(range(1, len(raw))) if seed == 1
            else sorted(rng.sample(range(1, len(raw)), rng.randrange(1, min(30, len(raw))))))
    with monkeypatch.context() as patch:
        h11_alone = await _read_all(raw, cuts, False, patch)
    decoded_here = await _read_all(raw, cuts, True, monkeypatch)
    assert decoded_here[:2] == h11_alone[:2]
    if not name.startswith(("cut", "bad")):
        assert h11_alone[1] == "" and decoded_here[2] == h11_alone[2] == (h11.DONE, h11.DONE)
    else:  # an error, and a connection that does not go back to the pool
        assert h11_alone[1] and decoded_here[2][1] is not h11.DONE


async def test_the_reader_takes_over_between_chunks() -> None:
    state = h11.Connection(h11.CLIENT)
    state.send(h11.Request(method="GET", target="/", headers=[("host", "x")]))
    state.send(h11.EndOfMessage())
    state.receive_data(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
    state.next_event()
    pieces = [_chunked([b"a"]), _chunked([b"b"]), _chunked([b"c"]) + b"0\r\n\r\n"]
    seen = []

    async def receive(size: int) -> bytes:
        seen.append(reader._own)
        return pieces.pop(0)

    reader = body._H11Body(state, receive)
    assert [data async for data in reader] == [b"a", b"b", b"c"]
    assert seen == [True, True, True] and state.their_state is h11.DONE
