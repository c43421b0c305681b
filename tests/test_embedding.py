"""The library as a trio application embeds it: handles on single streams, bounded
submission, groups of streams, honest timings with the caller's own client, and
exceptions that come out as themselves."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import httpx
import pytest
import trio
from trio.testing import MockClock

from fanout import (
    Deadlines,
    Endpoint,
    Outcome,
    StreamFinished,
    StreamRequest,
    TextDelta,
    make_client,
    open_fanout,
)
from fanout.upstream import RunningUpstream
from tests.net.scripted import Script, stream
from tests.net.test_stream import ENDPOINT, MESSAGES, request, text_steps
from tests.upstream.virtual import virtual_upstream


async def test_a_handle_waits_for_one_stream_and_shows_its_progress(
        autojump_clock: MockClock) -> None:
    script = Script([stream(*text_steps(4, 1.0))])
    async with script.client() as client, open_fanout(
            ENDPOINT, client=client, accept_more=True, max_concurrency=1) as fan:
        first = await fan.submit(request("a"))
        second = await fan.submit(request("b"))
        await trio.sleep(2.5)
        now = first.snapshot()
        assert (now.state, now.attempt, now.status, now.text) == ("streaming", 1, 200, "t0 t1 ")
        assert fan.snapshot("b").state == "queued" and second.result is None
        result = await fan.wait("a")
        assert (result.outcome, result.text) == (Outcome.COMPLETED, "t0 t1 t2 t3 ")
        assert first.snapshot().state == "finished" and first.snapshot().result is result
        assert (await second.wait()).outcome is Outcome.COMPLETED
        fan.seal()
        async for _ in fan.events:  # the channel still holds every event, unconsumed
            pass


async def test_unknown_and_forgotten_keys(autojump_clock: MockClock) -> None:
    script = Script([stream(*text_steps(1, 0.1))])
    async with script.client() as client, open_fanout(
            ENDPOINT, client=client, accept_more=True) as fan:
        handle = await fan.submit(request("a"))
        await handle.wait()
        fan.forget("a")
        assert (await handle.wait()).outcome is Outcome.COMPLETED  # a handle outlives forget
        assert fan.cancel("a") is False and fan.cancel("never") is False
        for lookup in (fan.handle, fan.snapshot):
            with pytest.raises(KeyError, match="never submitted, or forgotten"):
                lookup("a")
        with pytest.raises(KeyError):
            await fan.wait("never")
        fan.seal()


async def test_submit_pushes_back_when_max_queued_streams_wait(autojump_clock: MockClock) -> None:
    script = Script([stream(*text_steps(2, 0.5))])
    most_queued = 0
    submitted = 0
    async with script.client() as client, open_fanout(
            ENDPOINT, client=client, accept_more=True, max_concurrency=4, max_queued=8) as fan:

        async def produce() -> None:
            nonlocal submitted
            for i in range(200):
                await fan.submit(request(f"s{i}"))
                submitted += 1
            fan.seal()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(produce)
            async for event in fan.events:
                most_queued = max(most_queued, len(fan.queued))
                assert len(fan.running) <= 4
                if isinstance(event, StreamFinished):
                    fan.forget(event.stream)
    assert submitted == 200 and most_queued <= 8


async def test_a_slow_consumer_pushes_back_on_the_producer(autojump_clock: MockClock) -> None:
    # Streams that end while their last event waits for the consumer still count against
    # max_queued: else finished tasks would pile up without bound behind a slow reader.
    script = Script([stream(*text_steps(1, 0))])
    most_tasks = 0
    async with script.client() as client, open_fanout(
            ENDPOINT, client=client, accept_more=True, max_concurrency=2, max_queued=4,
            buffer=0) as fan:

        async def produce() -> None:
            for i in range(100):
                await fan.submit(request(f"s{i}"))
            fan.seal()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(produce)
            baseline = trio.lowlevel.current_statistics().tasks_living
            async for event in fan.events:
                streams = trio.lowlevel.current_statistics().tasks_living - baseline
                most_tasks = max(most_tasks, streams)
                await trio.sleep(1)  # a consumer far slower than the streams
                if isinstance(event, StreamFinished):
                    fan.forget(event.stream)
    assert most_tasks <= 2 + 4 + 1  # the streams, and the one task watching idle deadlines


def test_twenty_thousand_submits_stay_in_bounded_memory() -> None:
    # A producer loop with the defaults: submit waits while 1,024 streams are queued.
    code = r'''
import httpx, trio
from fanout import Endpoint, StreamFinished, StreamRequest, open_fanout

BODY = (b'data: {"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}]}\n\n'
        b"data: [DONE]\n\n")

async def handler(request):
    await trio.sleep(0.05)  # slower than submitting: without a bound, the queue grows
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=BODY)

async def main():
    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    done = most_queued = most_tasks = 0
    async with open_fanout(Endpoint("http://relay.test/v1"), client=client, accept_more=True,
                           max_concurrency=64) as fan:
        async def produce():
            for i in range(20_000):
                await fan.submit(StreamRequest(f"s{i}", "m", [{"role": "user", "content": "x"}]))
            fan.seal()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(produce)
            async for event in fan.events:
                most_queued = max(most_queued, len(fan.queued))
                most_tasks = max(most_tasks, trio.lowlevel.current_statistics().tasks_living)
                if isinstance(event, StreamFinished):
                    fan.forget(event.stream)
                    done += 1
                    if done % 10 == 0:
                        await trio.sleep(0.002)  # a consumer slower than the streams
    # VmHWM, not ru_maxrss: a child's ru_maxrss starts at its parent's (pytest's) peak
    peak = next(line for line in open("/proc/self/status") if line.startswith("VmHWM"))
    print(done, most_queued, most_tasks, int(peak.split()[1]) // 1024)

trio.run(main)
'''
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, check=True)
    done, most_queued, most_tasks, peak_mb = map(int, out.stdout.split())
    assert done == 20_000 and most_queued <= 1024  # the default bound, held
    assert most_tasks <= 1024 + 64 + 10  # finished streams waiting on the consumer included
    # Measured here: ~48 MB; without the bound (before) the queue reached 10,266 and 133 MB.
    assert peak_mb < 100, f"peak RSS {peak_mb} MB"


async def test_cancel_a_group_by_tag(autojump_clock: MockClock) -> None:
    script = Script([stream(*text_steps(5, 1.0))])
    requests = [StreamRequest(f"{job}/{model}", model, MESSAGES, tags={job})
                for job in ("job-1", "job-2") for model in ("m1", "m2")]
    async with script.client() as client, open_fanout(ENDPOINT, requests, client=client) as fan:
        await trio.sleep(1.5)
        cancelled = fan.cancel_where(lambda r: "job-1" in r.tags, "job-1 was withdrawn")
        async for _ in fan.events:
            pass
    assert sorted(cancelled) == ["job-1/m1", "job-1/m2"]
    outcomes = {key: (r.outcome, r.reason) for key, r in fan.results.items()}
    assert outcomes["job-1/m1"] == (Outcome.CANCELLED, "job-1 was withdrawn")
    assert outcomes["job-2/m2"][0] is Outcome.COMPLETED
    assert "job-1" not in StreamRequest("k", "m", MESSAGES, tags={"job-1"}).body()


async def test_an_exception_in_the_block_comes_out_unwrapped(autojump_clock: MockClock) -> None:
    class ClientGone(Exception):
        pass

    for error in (ClientGone("the websocket closed"), KeyboardInterrupt()):
        box: list[Any] = []
        with pytest.raises(type(error)) as caught:
            async with Script([stream(*text_steps(10, 0.1))]).client() as client, open_fanout(
                    ENDPOINT, [request(f"s{i}") for i in range(3)], client=client) as fan:
                box.append(fan)
                async for event in fan.events:
                    if isinstance(event, TextDelta):
                        raise error
        assert caught.value is error  # itself, not an ExceptionGroup
        assert {r.outcome for r in box[0].results.values()} == {Outcome.CANCELLED}


async def test_a_small_pool_of_your_own_counts_as_queueing_not_ttft(
        autojump_clock: MockClock) -> None:
    # 6 streams at once through a client whose pool holds 2 connections: 4 of them wait
    # for a connection.  That wait is queueing; it must not eat the first-token deadline.
    # The upstream is reached in memory, on virtual time: the times below are exact.
    requests = [StreamRequest(f"s{i}", "mock/slow", MESSAGES, {"max_tokens": 12})
                for i in range(6)]
    limits = httpx.Limits(max_connections=2, max_keepalive_connections=2)
    async with virtual_upstream() as upstream:
        endpoint = Endpoint("http://upstream.test/v1", "sk-pool")
        timeout = httpx.Timeout(10, read=None)
        async with (upstream.http_client(limits=limits, timeout=timeout) as client,
                    open_fanout(endpoint, requests, client=client,
                                deadlines=Deadlines(first_token=0.3)) as fan):
            async for _ in fan.events:
                pass
        assert upstream.stats.connections_opened == 2
    results = list(fan.results.values())
    assert {r.outcome for r in results} == {Outcome.COMPLETED}, [r.reason for r in results]
    assert all(r.timings is not None for r in results)
    queued = sorted(r.timings.queued for r in results if r.timings)
    assert queued[:2] == [0, 0] and all(q > 0.3 for q in queued[2:])  # 4 waited for a
    for result in results:  # connection longer than the whole first-token deadline
        assert result.timings is not None and result.timings.ttft is not None
        assert 0 < result.timings.ttft <= 0.3  # the model's own latency, from its request


async def test_one_shared_client_serves_many_fan_outs(upstream: RunningUpstream) -> None:
    endpoint = Endpoint(upstream.base_url, "sk-shared")
    async with make_client(8) as client:
        for round_number in range(3):
            async with open_fanout(endpoint, [StreamRequest(f"r{round_number}", "mock/fast",
                                                            MESSAGES)], client=client) as fan:
                async for _ in fan.events:
                    pass
            assert fan.results[f"r{round_number}"].outcome is Outcome.COMPLETED
        assert not client.is_closed  # fanout never closes a client you pass


async def test_submit_never_strands_a_stream_it_started(autojump_clock: MockClock) -> None:
    # Cancelled, submit raises only while it waits for room, before starting anything;
    # a stream it started, it always returns the handle of.
    script = Script([stream(*text_steps(3, 1.0))])
    async with script.client() as client, open_fanout(
            ENDPOINT, client=client, accept_more=True, max_concurrency=1, max_queued=1) as fan:
        handles = []
        with trio.CancelScope() as scope:
            scope.cancel()
            handles.append(await fan.submit(request("a")))  # room: started, returned
            handles.append(await fan.submit(request("b")))
            await fan.submit(request("c"))  # no room: waits, is cancelled, starts nothing
        assert [h.key for h in handles] == ["a", "b"]
        assert set(fan.running) | set(fan.queued) == {"a", "b"}
        with pytest.raises(KeyError):
            fan.handle("c")
        fan.seal()
        async for _ in fan.events:
            pass
    assert sorted(fan.results) == ["a", "b"]
