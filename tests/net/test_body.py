"""The direct body reader (h11 over the pool's own socket stream) against httpx's
``aiter_raw``: the same results, the same errors, the connection left to the pool."""

from __future__ import annotations

import errno
import socket
import struct
from typing import Any

import attrs
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
    return {"lean": body._SocketReader(client.socket), "trio": client.receive_some}


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
    with pytest.raises(trio.ClosedResourceError):
        await read(100)


async def test_a_reset_reads_as_the_same_error_as_trios() -> None:
    errors: dict[str, BaseException] = {}
    for which in ("lean", "trio"):
        client, server = await _pair()
        # SO_LINGER with a zero timeout: close() sends RST, not FIN.
        server.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await server.aclose()
        with pytest.raises(trio.BrokenResourceError) as info:
            await _readers(client)[which](100)
        errors[which] = info.value
        await client.aclose()
    assert str(errors["lean"]) == str(errors["trio"])
    assert "Connection reset" in str(errors["lean"])
    causes = [e.__cause__ for e in errors.values()]
    assert all(isinstance(c, OSError) and c.errno == errno.ECONNRESET for c in causes)
