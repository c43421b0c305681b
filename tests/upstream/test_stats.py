"""The running upstream's live counters, and that it notices a client that left at once."""

from __future__ import annotations

import httpx
import trio
from trio.testing import MockClock

from fanout.upstream import RunningUpstream, UpstreamStats, open_upstream
from tests.upstream.virtual import virtual_upstream
from tests.upstream.wire import MESSAGES, TIMEOUT, chat, raw_chat


async def test_stats_count_connections_and_requests_by_model(upstream: RunningUpstream) -> None:
    stats = upstream.stats
    assert (stats.connections_open, stats.connections_opened, stats.requests) == (0, 0, {})
    async with httpx.AsyncClient(base_url=upstream.base_url, timeout=TIMEOUT) as http:
        for model in ("mock/fast", "mock/fast", "fault/429:1@byte"):
            await chat(http, model, max_tokens=3)
        await http.get("/models")  # not a chat request: not counted by model
        assert (stats.connections_open, stats.connections_opened) == (1, 1)  # keep-alive
    with trio.fail_after(10):  # a hang guard
        await stats.wait_for(lambda s: s.connections_open == 0)
    assert (stats.connections_opened, stats.connections_closed) == (1, 1)
    assert stats.requests == {"mock/fast": 2, "fault/429:1@byte": 1}


async def test_a_client_leaving_mid_pause_is_noticed_at_once(upstream: RunningUpstream) -> None:
    # The first content comes after 1,000 s: without watching the socket during the pause
    # the server would only notice the client left at its next write, long after the guard.
    with trio.fail_after(10):  # a hang guard: exact timing is checked below, virtually
        raw = await raw_chat(upstream, "fault/slow-first-token:1000", until=b"assistant")
        assert raw.status == 200 and not raw.closed
        await upstream.stats.wait_for(lambda s: s.connections_closed == 1)
    assert upstream.stats.connections_open == 0


async def test_a_client_leaving_mid_pause_is_noticed_the_moment_it_leaves(
        autojump_clock: MockClock) -> None:
    async with virtual_upstream() as upstream:
        client = upstream.connect("fault/slow-first-token:10")
        await trio.sleep(4)  # inside the 10 s pause, after the role chunk
        assert len(client.writes) == 2 and client.closed_at is None
        client.leave()
        await upstream.stats.wait_for(lambda s: s.connections_closed == 1)
        assert client.closed_at == 4 and len(client.writes) == 2


async def test_a_client_leaving_a_hang_closes_the_connection(upstream: RunningUpstream) -> None:
    async with httpx.AsyncClient(base_url=upstream.base_url, timeout=TIMEOUT) as http:
        reply = await chat(http, "fault/stall:2", until=lambda body: body.count(b"\n\n") >= 2)
        assert reply.body.count(b"data: ") == 2 and reply.error is None
    with trio.fail_after(10):  # a hang guard: test_server.py times it, virtually
        await upstream.stats.wait_for(lambda s: s.connections_open == 0)


async def test_open_upstream_exposes_the_same_stats() -> None:
    with trio.fail_after(5):
        async with (open_upstream() as upstream,
                    httpx.AsyncClient(base_url=upstream.base_url, timeout=TIMEOUT) as http):
            response = await http.post("/chat/completions", json={
                "model": "mock/echo", "messages": MESSAGES})
            assert response.status_code == 200
            assert upstream.stats.requests == {"mock/echo": 1}
            assert upstream.stats.connections_opened == 1


def test_running_upstream_stays_constructible_and_comparable() -> None:
    a, b = RunningUpstream("127.0.0.1", 1), RunningUpstream("127.0.0.1", 1)
    assert a == b and isinstance(a.stats, UpstreamStats) and a.stats is not b.stats
    assert repr(a) == "RunningUpstream(host='127.0.0.1', port=1)"
