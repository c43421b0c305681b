"""Deadlines, retries and the event contract of one stream, in virtual time.

httpx.MockTransport and trio's autojump MockClock: no sockets, so virtual
time is safe, and every deadline can be checked to the microsecond.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio
from trio.testing import MockClock

from fanout import (
    Deadlines,
    Endpoint,
    Event,
    Outcome,
    RetryPolicy,
    StreamFinished,
    StreamRequest,
    StreamRetrying,
    StreamStarted,
    TextDelta,
    open_fanout,
)
from tests.net.scripted import DONE, Script, delayed, event, raises, status, stream

ENDPOINT = Endpoint("http://relay.test/v1", "sk-test-SECRET-1234")
MESSAGES = [{"role": "user", "content": "hi"}]
NO_JITTER = RetryPolicy(jitter=False)


def request(key: str = "s", model: str = "m", **fields: Any) -> StreamRequest:
    return StreamRequest(key, model, MESSAGES, **fields)


async def run(script: Script, *requests: StreamRequest, **options: Any
              ) -> tuple[dict[str, Any], list[Event]]:
    events: list[Event] = []
    async with (script.client() as client,
                open_fanout(ENDPOINT, requests or [request()], client=client,
                            **options) as fan):
        async for item in fan.events:
            events.append(item)
    return fan.results, events


def text_steps(count: int, every: float, *, done: bool = True) -> list[tuple[float, bytes]]:
    steps = [(0.0, event(role="assistant"))]
    steps += [(every, event(f"t{i} ")) for i in range(count)]
    steps.append((0.0, event(finish="stop")))
    if done:
        steps.append((0.0, DONE))
    return steps


async def test_completed_stream_and_its_events(autojump_clock: MockClock) -> None:
    results, events = await run(Script([stream(*text_steps(3, 0.1))]))
    result = results["s"]
    assert (result.outcome, result.text, result.timed_out) == (Outcome.COMPLETED, "t0 t1 t2 ", None)
    assert isinstance(events[0], StreamStarted) and events[0].status == 200
    assert isinstance(events[-1], StreamFinished) and events[-1].result is result
    assert sum(isinstance(e, StreamFinished) for e in events) == 1
    timings = result.timings
    assert timings is not None
    assert timings.ttft == pytest.approx(0.1) and timings.end == pytest.approx(0.3)
    assert timings.gap_max == pytest.approx(0.1) and timings.gap_p50 == pytest.approx(0.1)


async def test_request_shape(autojump_clock: MockClock) -> None:
    script = Script([stream(*text_steps(1, 0))])
    await run(script, request(params={"temperature": 0.5}))
    sent = script.requests[0]
    assert sent.method == "POST" and str(sent.url) == "http://relay.test/v1/chat/completions"
    assert sent.headers["authorization"] == "Bearer sk-test-SECRET-1234"
    assert sent.headers["accept"] == "text/event-stream"
    assert sent.headers["accept-encoding"] == "identity"
    import json
    body = json.loads(sent.content)
    assert body == {"model": "m", "messages": MESSAGES, "stream": True,
                    "stream_options": {"include_usage": True}, "temperature": 0.5}


async def test_first_byte_deadline_fires_exactly(autojump_clock: MockClock) -> None:
    script = Script([stream((5.0, event("late")))])
    start = trio.current_time()
    results, _ = await run(script, deadlines=Deadlines(first_byte=2.0))
    result = results["s"]
    assert (result.outcome, result.timed_out) == (Outcome.TIMED_OUT, "first_byte")
    assert trio.current_time() - start == pytest.approx(2.0)
    assert result.error is not None and result.error.message == "no first byte within 2 s"


async def test_first_byte_covers_a_slow_response_head(autojump_clock: MockClock) -> None:
    script = Script([delayed(5.0, stream(*text_steps(1, 0)))])
    result = (await run(script, deadlines=Deadlines(first_byte=2.0)))[0]["s"]
    assert (result.outcome, result.timed_out, result.status) == (
        Outcome.TIMED_OUT, "first_byte", None)
    assert result.timings is not None and result.timings.headers is None
    assert result.timings.end == pytest.approx(2.0)


async def test_first_token_deadline_ignores_role_chunks(autojump_clock: MockClock) -> None:
    script = Script([stream((0.1, event(role="assistant")), (9.0, event("x")))])
    results, _ = await run(script, deadlines=Deadlines(first_token=1.5))
    result = results["s"]
    assert (result.outcome, result.timed_out) == (Outcome.TIMED_OUT, "first_token")
    assert result.timings is not None and result.timings.end == pytest.approx(1.5)


async def test_idle_is_not_reset_by_keep_alive_comments(autojump_clock: MockClock) -> None:
    steps: list[tuple[float, bytes | Exception]] = [(0.0, event("a")), (1.0, event("b"))]
    steps += [(0.5, b": ping\n\n")] * 20  # heartbeats forever, never an event
    results, _ = await run(Script([stream(*steps)]), deadlines=Deadlines(idle=2.0))
    result = results["s"]
    assert (result.outcome, result.timed_out, result.text) == (Outcome.TIMED_OUT, "idle", "ab")
    assert result.timings is not None and result.timings.end == pytest.approx(3.0)
    assert result.comments >= 3


async def test_idle_is_reset_by_events(autojump_clock: MockClock) -> None:
    results, _ = await run(Script([stream(*text_steps(10, 1.5))]),
                           deadlines=Deadlines(idle=2.0))
    assert results["s"].outcome is Outcome.COMPLETED


async def test_total_deadline_keeps_partial_text(autojump_clock: MockClock) -> None:
    results, _ = await run(Script([stream(*text_steps(100, 1.0))]),
                           deadlines=Deadlines(total=5.5))
    result = results["s"]
    assert (result.outcome, result.timed_out) == (Outcome.TIMED_OUT, "total")
    assert result.text == "t0 t1 t2 t3 t4 "
    assert len(result.attempts) == 1 and result.attempts[0].status == 200
    assert result.timings is not None and result.timings.end == pytest.approx(5.5)


async def test_fanout_deadline_times_out_every_stream(autojump_clock: MockClock) -> None:
    script = Script([stream(*text_steps(100, 1.0))])
    results, _ = await run(script, request("a"), request("b"), deadline=2.5)
    assert {(r.outcome, r.timed_out) for r in results.values()} == {(Outcome.TIMED_OUT, "fanout")}


async def test_connect_timeout_is_retried_then_reported(autojump_clock: MockClock) -> None:
    script = Script([raises(httpx.ConnectTimeout("timed out"))])
    results, events = await run(script, retry=NO_JITTER, deadlines=Deadlines(connect=1))
    result = results["s"]
    assert (result.outcome, result.timed_out, len(result.attempts)) == (
        Outcome.TIMED_OUT, "connect", 3)
    assert [e.wait for e in events if isinstance(e, StreamRetrying)] == [0.5, 1.0]


async def test_429_honours_retry_after_then_succeeds(autojump_clock: MockClock) -> None:
    script = Script([status(429, headers={"retry-after": "2"}), stream(*text_steps(2, 0.1))])
    start = trio.current_time()
    results, events = await run(script)
    result = results["s"]
    assert (result.outcome, result.text) == (Outcome.COMPLETED, "t0 t1 ")
    assert [(a.number, a.status, a.waited) for a in result.attempts] == [(1, 429, 0.0), (2, 200, 2.0)]
    assert trio.current_time() - start == pytest.approx(2.2)
    started = [e for e in events if isinstance(e, StreamStarted)]
    assert [e.attempt for e in started] == [1, 2]  # one StreamStarted per attempt
    retrying = [e for e in events if isinstance(e, StreamRetrying)]
    assert len(retrying) == 1 and retrying[0].wait == 2.0
    assert retrying[0].error.status == 429
    assert result.timings is not None and result.timings.ttft == pytest.approx(0.1)


async def test_exponential_backoff_and_bounded_attempts(autojump_clock: MockClock) -> None:
    script = Script([status(503)])
    results, events = await run(script, retry=RetryPolicy(attempts=4, failure_attempts=4,
                                                            initial=0.5, jitter=False))
    result = results["s"]
    assert (result.outcome, len(script.requests)) == (Outcome.ERROR, 4)
    assert [e.wait for e in events if isinstance(e, StreamRetrying)] == [0.5, 1.0, 2.0]
    assert result.error is not None and result.error.status == 503


async def test_full_jitter_stays_under_the_ceiling(autojump_clock: MockClock) -> None:
    script = Script([status(500)])
    _, events = await run(script, retry=RetryPolicy(attempts=6, failure_attempts=6, initial=1.0,
                                                     maximum=4.0),
                          seed=3)
    waits = [e.wait for e in events if isinstance(e, StreamRetrying)]
    assert len(waits) == 5
    assert all(0 <= w <= c for w, c in zip(waits, [1, 2, 4, 4, 4], strict=True))
    assert len(set(waits)) == 5  # jittered, not fixed


async def test_no_retry_past_the_total_deadline(autojump_clock: MockClock) -> None:
    script = Script([status(429, headers={"retry-after": "30"}), stream(*text_steps(1, 0))])
    results, _ = await run(script, deadlines=Deadlines(total=10))
    result = results["s"]
    assert (result.outcome, len(script.requests)) == (Outcome.ERROR, 1)


async def test_retry_after_spread_staggers_the_retries(autojump_clock: MockClock) -> None:
    refused = status(429, headers={"retry-after": "2"})
    script = Script([refused] * 6 + [stream(*text_steps(1, 0.1))])  # every first attempt
    keys = [request(f"s{i}") for i in range(6)]
    results, _ = await run(script, *keys, retry=RetryPolicy(retry_after_spread=0.5), seed=3)
    waits = [r.attempts[1].waited for r in results.values()]
    assert all(2.0 <= w <= 3.0 for w in waits)
    assert len(set(waits)) == 6  # not all back at the same instant


async def test_no_retry_after_content(autojump_clock: MockClock) -> None:
    broken = stream((0, event("partial")), (0.1, httpx.RemoteProtocolError("peer closed")))
    script = Script([broken, stream(*text_steps(1, 0))])
    results, _ = await run(script)
    result = results["s"]
    assert (result.outcome, result.text, len(script.requests)) == (
        Outcome.TRUNCATED, "partial", 1)
    assert result.error is not None and result.error.code == "RemoteProtocolError"


async def test_non_retryable_status_is_an_error_with_the_server_message(
        autojump_clock: MockClock) -> None:
    script = Script([status(400, {"error": {"message": "bad model", "code": "model_not_found"}})])
    results, _ = await run(script)
    result = results["s"]
    assert (result.outcome, result.status, len(script.requests)) == (Outcome.ERROR, 400, 1)
    assert result.error is not None and (result.error.message, result.error.code) == (
        "bad model", "model_not_found")


async def test_plain_json_completion_is_handled(autojump_clock: MockClock) -> None:
    completion = {"id": "x", "choices": [{"index": 0, "finish_reason": "stop", "message": {
        "role": "assistant", "content": "whole answer"}}], "usage": {"total_tokens": 5}}
    script = Script([status(200, completion)])
    result = (await run(script))[0]["s"]
    assert (result.outcome, result.text, result.choices[0].finish_reason) == (
        Outcome.COMPLETED, "whole answer", "stop")


async def test_strict_mode_failure_is_data_not_an_exception(autojump_clock: MockClock) -> None:
    script = Script([stream((0, event("a")), (0, b"data: {bad\n\n"), (0, DONE))])
    result = (await run(script, strict=True))[0]["s"]
    assert (result.outcome, result.text) == (Outcome.ERROR, "a")
    assert result.error is not None and result.error.code == "malformed_frame"


async def test_event_limit_stops_reading_cleanly(autojump_clock: MockClock) -> None:
    script = Script([stream((0, event("ok")), (0, b"data: " + b"x" * 5000),
                            *[(0.1, b"y" * 100)] * 50)])
    result = (await run(script, max_event_size=1000))[0]["s"]
    assert (result.outcome, result.text) == (Outcome.ERROR, "ok")
    assert result.error is not None and result.error.code == "event_too_large"


async def test_cancel_one_stream_keeps_its_text_and_spares_the_others(
        autojump_clock: MockClock) -> None:
    script = Script([stream(*text_steps(10, 1.0))])
    async with (script.client() as client,
                open_fanout(ENDPOINT, [request("a"), request("b")], client=client) as fan):
        async for item in fan.events:
            if isinstance(item, TextDelta) and item.stream == "a" and item.text == "t2 ":
                assert fan.cancel("a")
    a, b = fan.results["a"], fan.results["b"]
    assert (a.outcome, a.text) == (Outcome.CANCELLED, "t0 t1 t2 ")
    assert [(x.number, x.status, x.delivered_content) for x in a.attempts] == [(1, 200, True)]
    assert (b.outcome, len(b.text)) == (Outcome.COMPLETED, 30)
    assert fan.cancel("a") is False
    assert fan.cancel("nope") is False  # an unknown key is no error: nothing to cancel


async def test_leaving_the_block_cancels_and_keeps_results(autojump_clock: MockClock) -> None:
    script = Script([stream(*text_steps(10, 1.0))])
    async with (script.client() as client,
                open_fanout(ENDPOINT, [request("a"), request("b")], client=client) as fan):
        await trio.sleep(3.5)
    assert {r.outcome for r in fan.results.values()} == {Outcome.CANCELLED}
    assert all(r.text == "t0 t1 t2 " for r in fan.results.values())


async def test_outside_cancellation_still_ends_each_stream(autojump_clock: MockClock) -> None:
    script = Script([stream(*text_steps(10, 1.0))])
    with trio.move_on_after(2.5):  # like Ctrl-C: the whole fan-out is cancelled
        async with (script.client() as client,
                    open_fanout(ENDPOINT, [request("a"), request("b")], client=client) as fan):
            async for _ in fan.events:
                pass
    assert {r.outcome for r in fan.results.values()} == {Outcome.CANCELLED}
    assert all(r.text == "t0 t1 " for r in fan.results.values())


async def test_concurrency_cap_and_queue_time_not_in_ttft(autojump_clock: MockClock) -> None:
    script = Script([stream(*text_steps(2, 1.0))])
    requests = [request(f"s{i}") for i in range(5)]
    results, _ = await run(script, *requests, max_concurrency=2)
    queued = sorted(r.timings.queued for r in results.values())  # type: ignore[union-attr]
    assert queued == pytest.approx([0, 0, 2, 2, 4])
    assert all(r.timings.ttft == pytest.approx(1.0) for r in results.values())  # type: ignore[union-attr]


async def test_queued_names_the_streams_waiting_for_a_slot(autojump_clock: MockClock) -> None:
    script = Script([stream(*text_steps(2, 1.0))])
    seen: list[tuple[str, set[str], set[str]]] = []
    async with (script.client() as client,
                open_fanout(ENDPOINT, [request("a"), request("b"), request("c")], client=client,
                            max_concurrency=1) as fan):
        await trio.sleep(0.5)
        assert (len(fan.queued), len(fan.running)) == (2, 1)  # disjoint
        assert not fan.queued & fan.running
        async for event in fan.events:
            if isinstance(event, StreamFinished):
                seen.append((event.stream, set(fan.queued), set(fan.running)))
    sizes = [len(q) for _, q, _ in seen]  # when a freed slot is taken depends on scheduling
    assert sizes == sorted(sizes, reverse=True) and sizes[-1] == 0
    assert all(not queued & running and stream not in queued | running
               for stream, queued, running in seen)
    assert not fan.queued and not fan.running


async def test_per_model_concurrency(autojump_clock: MockClock) -> None:
    script = Script([stream(*text_steps(1, 1.0))])
    requests = [request(f"a{i}", "A") for i in range(3)] + [request(f"b{i}", "B") for i in range(3)]
    results, _ = await run(script, *requests, per_model_concurrency={"A": 1})
    queued = {k: r.timings.queued for k, r in results.items()}  # type: ignore[union-attr]
    assert sorted(queued[f"a{i}"] for i in range(3)) == pytest.approx([0, 1, 2])
    assert [queued[f"b{i}"] for i in range(3)] == pytest.approx([0, 0, 0])


async def test_start_together(autojump_clock: MockClock) -> None:
    script = Script([stream(*text_steps(1, 0.5))])
    results, _ = await run(script, request("a"), request("b"), start_together=True)
    assert {r.outcome for r in results.values()} == {Outcome.COMPLETED}
    with pytest.raises(ValueError, match="do not fit in max_concurrency=1"):
        await run(script, request("a"), request("b"), start_together=True, max_concurrency=1)


async def test_submit_and_seal(autojump_clock: MockClock) -> None:
    script = Script([stream(*text_steps(1, 0.5))])
    async with (script.client() as client,
                open_fanout(ENDPOINT, client=client, accept_more=True) as fan):
        await fan.submit(request("a"))
        await fan.submit(request("b"))
        with pytest.raises(ValueError, match="already in this fan-out"):
            await fan.submit(request("a"))
        fan.seal()
        with pytest.raises(RuntimeError, match="sealed"):
            await fan.submit(request("c"))
        finished = [e.stream async for e in fan.events if isinstance(e, StreamFinished)]
    assert sorted(finished) == ["a", "b"]


async def test_ttft_counts_reasoning_ttfc_waits_for_the_answer(autojump_clock: MockClock) -> None:
    reasoning = b'data: {"choices":[{"index":0,"delta":{"reasoning_content":"hmm"}}]}\n\n'
    script = Script([stream((0.0, event(role="assistant")), (0.5, reasoning),
                            (1.5, event("answer")), (0.0, event(finish="stop")), (0.0, DONE))])
    results, _ = await run(script)
    timings = results["s"].timings
    assert timings is not None
    assert timings.ttft == pytest.approx(0.5, abs=1e-6)
    assert timings.ttfc == pytest.approx(2.0, abs=1e-6)


async def test_forget_drops_a_finished_stream(autojump_clock: MockClock) -> None:
    script = Script([stream(*text_steps(1, 0.5))])
    finished = []
    async with (script.client() as client,
                open_fanout(ENDPOINT, client=client, accept_more=True) as fan):
        await fan.submit(request("a"))
        with pytest.raises(KeyError):
            fan.forget("a")  # still running
        async for event in fan.events:
            if not isinstance(event, StreamFinished):
                continue
            finished.append(event.result)
            assert fan.results["a"] is event.result  # there before StreamFinished arrives
            if len(finished) == 1:
                assert fan.forget("a") is event.result
                assert "a" not in fan.results and not fan.running
                await fan.submit(request("a"))  # the key is free again
                fan.seal()
    assert len(finished) == 2 and fan.results["a"] is finished[1]


async def test_content_key_is_on_every_event_and_stable(autojump_clock: MockClock) -> None:
    script = Script([stream(*text_steps(2, 0.1))])
    _, events = await run(script, request("a"), request("b"))
    keys = {e.content_key for e in events}
    assert len(keys) == 1 and len(keys.pop()) == 20  # same model and messages: same key


async def test_the_key_never_leaks(autojump_clock: MockClock) -> None:
    secret = ENDPOINT.api_key
    assert secret is not None
    echo = {"error": {"message": f"Incorrect API key provided: {secret}"}}
    script = Script([status(401, echo), raises(httpx.ConnectError(f"failed for {secret}"))])
    results, events = await run(script, request("a"), request("b"))
    everything = repr(results) + repr(events) + repr(ENDPOINT) + str(ENDPOINT)
    assert secret not in everything
    assert "***" in repr(results)
    with pytest.raises(ValueError, match="Authorization") as info:
        Endpoint("http://x/v1", secret, {"Authorization": f"Bearer {secret}"})
    assert secret not in str(info.value)


async def test_slow_consumer_with_deadlines_leaks_nothing(autojump_clock: MockClock) -> None:
    # Backpressure: the stream waits for the consumer; a cancel or deadline lands
    # at the next read, inside httpx's iterator (a ResourceWarning would fail here).
    script = Script([stream(*text_steps(30, 0.1))])
    requests = [request("a", deadlines=Deadlines(idle=0.5)),
                request("b", deadlines=Deadlines(idle=0.5, total=2.0))]
    async with (script.client() as client,
                open_fanout(ENDPOINT, requests, client=client, buffer=0) as fan):
        async for item in fan.events:
            await trio.sleep(0.3)  # slower than the stream: never an idle timeout
            if isinstance(item, TextDelta) and item.text == "t3 " and item.stream == "a":
                fan.cancel("a")
    assert fan.results["a"].outcome is Outcome.CANCELLED
    assert fan.results["b"].outcome is Outcome.TIMED_OUT
    assert fan.results["b"].timed_out == "total"
    import gc
    gc.collect()


async def test_cancel_a_queued_stream(autojump_clock: MockClock) -> None:
    script = Script([stream(*text_steps(3, 1.0))])
    async with (script.client() as client,
                open_fanout(ENDPOINT, client=client, max_concurrency=1, accept_more=True) as fan):
        await fan.submit(request("a"))
        await trio.sleep(0.1)  # "a" holds the only slot (trio's task order is random)
        await fan.submit(request("b"))
        await trio.sleep(0.5)
        assert fan.cancel("b")  # still waiting for the slot
        fan.seal()
        async for _ in fan.events:
            pass
    b = fan.results["b"]
    assert (b.outcome, b.attempts, b.text) == (Outcome.CANCELLED, (), "")
    assert b.timings is not None and b.timings.request_sent is None
    assert b.timings.queued == pytest.approx(0.5)
    assert fan.results["a"].outcome is Outcome.COMPLETED
    assert len(script.requests) == 1


async def test_others_running_counts_the_streams_in_flight_when_one_ends(
        autojump_clock: MockClock) -> None:
    script = Script([stream(*text_steps(1, 1.0)), stream(*text_steps(3, 1.0)),
                     stream(*text_steps(3, 1.0))])
    together, _ = await run(script, request("a"), request("b"), request("c"))
    # the short stream ended while both others streamed; of those, one ended last
    assert sorted(r.others_running for r in together.values()) == [0, 1, 2]
    one_at_a_time, _ = await run(Script([stream(*text_steps(1, 1.0))]), request("a"),
                                 request("b"), max_concurrency=1)
    assert [r.others_running for r in one_at_a_time.values()] == [0, 0]  # queued is not running
