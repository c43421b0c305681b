"""The engine against servers that misbehave the way real and hostile ones do, over
loopback: single-slot cuts, relays that invent answers, key echoes, servers that
never answer, compressed bombs, amplification.  Real sockets, real time, short
deadlines; the assertions are about outcomes and reasons, never durations."""

from __future__ import annotations

from functools import partial
from typing import Any

import httpx
import pytest
import trio

from fanout import (
    Deadlines,
    Endpoint,
    Flag,
    Outcome,
    RetryPolicy,
    StreamFinished,
    StreamRequest,
    StreamRetrying,
    open_fanout,
    run_fanout,
)
from fanout.upstream import RunningUpstream, open_upstream
from fanout.upstream.models import ECHO_PLACES

MESSAGES = [{"role": "user", "content": "Say something about rivers."}]
KEY = "sk-hostile-test-KEY-0123456789"
FAST = RetryPolicy(initial=0.01, maximum=0.05)


def endpoint(upstream: RunningUpstream, **options: Any) -> Endpoint:
    return Endpoint(upstream.base_url, KEY, **options)


def req(key: str, model: str | None = None, **params: Any) -> StreamRequest:
    return StreamRequest(key, model or key, MESSAGES, params)


async def test_a_single_slot_server_cuts_the_running_stream(upstream: RunningUpstream) -> None:
    for model in ("slot/clean", "slot/broken", "slot/relay"):
        results = await run_fanout(endpoint(upstream), [req("a", model), req("b", model)],
                                   start_together=True, retry=RetryPolicy(attempts=1))
        cut = [r for r in results.values() if r.outcome is not Outcome.COMPLETED
               or Flag.EMPTY_ANSWER in r.flags]
        whole = [r for r in results.values() if r not in cut]
        assert len(cut) == 1 and len(whole) == 1, (model, results)
        assert cut[0].others_running == 1, model
        if model == "slot/relay":  # the relay turned the cut into an empty "stop"
            assert (cut[0].outcome, cut[0].flags[:1]) == (Outcome.COMPLETED,
                                                          (Flag.EMPTY_ANSWER,))
        else:
            assert cut[0].outcome is Outcome.TRUNCATED, (model, cut[0].reason)
            assert cut[0].reason is not None and "[DONE]" in cut[0].reason


async def test_one_at_a_time_a_single_slot_server_completes_everything(
        upstream: RunningUpstream) -> None:
    requests = [req(f"s{i}", "slot/clean", max_tokens=5) for i in range(4)]
    results = await run_fanout(endpoint(upstream), requests, max_concurrency=1)
    assert {r.outcome for r in results.values()} == {Outcome.COMPLETED}
    assert {r.others_running for r in results.values()} == {0}


EXPECTED: list[tuple[str, Deadlines | None, Outcome, str]] = [
    # model, deadlines, outcome, the reason contains
    ("fault/no-response", Deadlines(first_byte=0.4), Outcome.TIMED_OUT, "no first byte"),
    ("fault/drip-headers:0.05", Deadlines(first_byte=0.4), Outcome.TIMED_OUT, "no first byte"),
    ("fault/drip-body:0.05", Deadlines(idle=0.4), Outcome.TIMED_OUT, "no event within"),
    ("fault/html", None, Outcome.ERROR, "not an event stream (content-type text/html"),
    ("fault/json-error-200", None, Outcome.ERROR, ""),
    ("fault/validation-500", None, Outcome.ERROR, "HTTP 500: "),
    ("fault/400", None, Outcome.ERROR, "HTTP 400: "),
    ("fault/empty-200", None, Outcome.TRUNCATED, "the body ended before any event"),
    ("fault/no-done", None, Outcome.TRUNCATED, "without [DONE]"),
    ("fault/truncate", None, Outcome.TRUNCATED, "the connection broke after"),
]


async def test_every_hostile_server_gives_an_outcome_with_its_reason(
        upstream: RunningUpstream) -> None:
    requests = [StreamRequest(model, model, MESSAGES, deadlines=deadlines)
                for model, deadlines, *_ in EXPECTED]
    with trio.fail_after(20):
        results = await run_fanout(endpoint(upstream), requests, retry=FAST)
    for model, _, outcome, reason in EXPECTED:
        result = results[model]
        assert result.outcome is outcome, (model, result.reason)
        assert result.reason is not None and reason in result.reason, (model, result.reason)
        assert "\n" not in result.reason
    assert len(results["fault/validation-500"].attempts) == 1  # deterministic: not retried
    assert len(results["fault/400"].attempts) == 1
    # delivered nothing while other streams ran: maybe a single-slot cut, left to the caller
    assert len(results["fault/empty-200"].attempts) == 1


async def test_retries_turn_content_less_answers_into_complete_ones(
        upstream: RunningUpstream) -> None:
    for model in ["fault/cut-before-content", "fault/done-only", "fault/503-then-ok"]:
        result = (await run_fanout(endpoint(upstream), [req(model)], retry=FAST))[model]
        assert result.outcome is Outcome.COMPLETED, (model, result.reason)
        assert [a.delivered_content for a in result.attempts] == [False, True], model


async def test_bodies_that_are_not_streams_and_odd_numbers(upstream: RunningUpstream) -> None:
    results = await run_fanout(endpoint(upstream), [
        req("fault/json-body"), req("fault/negative-index"), req("fault/big-int"),
        req("fault/gzip")])
    assert (results["fault/json-body"].outcome, Flag.NOT_STREAMED in
            results["fault/json-body"].flags) == (Outcome.COMPLETED, True)
    negative = results["fault/negative-index"]
    assert negative.outcome is Outcome.COMPLETED and negative.skipped_frames == 2
    assert [c.index for c in negative.choices] == [0]
    big = results["fault/big-int"]
    assert big.outcome is Outcome.COMPLETED and [c.index for c in big.choices] == [0]
    assert results["fault/gzip"].outcome is Outcome.COMPLETED
    assert results["fault/gzip"].text


async def test_amplification_is_capped(upstream: RunningUpstream) -> None:
    results = await run_fanout(endpoint(upstream), [
        req("fault/many-choices:2000"), req("fault/many-tools:2000")])
    choices = results["fault/many-choices:2000"]
    assert len(choices.choices) == 128 and choices.skipped_frames == 2000 - 128
    tools = results["fault/many-tools:2000"]
    assert len(tools.choices[0].tool_calls) == 128 and tools.skipped_frames == 2000 - 128


async def test_endless_and_bombs_stop_at_the_response_cap_with_output_kept(
        upstream: RunningUpstream) -> None:
    with trio.fail_after(30):
        results = await run_fanout(endpoint(upstream), [
            req("fault/endless"), req("fault/gzip-bomb:64")], max_response_bytes=2_000_000)
    for name, result in results.items():
        assert result.error is not None and result.error.code == "response_too_large", name
        assert result.bytes_received <= 2_000_000 and result.text, name


@pytest.mark.parametrize("where", sorted(ECHO_PLACES))
async def test_an_echoed_key_appears_nowhere(where: str, upstream: RunningUpstream) -> None:
    seen: list[str] = []
    box: list[Any] = []
    async with open_fanout(endpoint(upstream), [req("s", f"fault/echo-key:{where}")],
                           retry=RetryPolicy(attempts=1)) as fan:
        box.append(fan)
        async for event in fan.events:
            seen.append(repr(event))
            if isinstance(event, StreamFinished):
                result = event.result
                seen += [str(result.reason), repr(result.error), repr(result.attempts)]
                if result.usage is not None:
                    seen.append(repr(result.usage.raw))
    seen.append(repr(box[0].results))
    assert not any(KEY in text for text in seen), where
    assert any("***" in text for text in seen), where  # it was echoed, and replaced


async def test_cookies_never_travel_between_streams() -> None:
    async with open_upstream() as upstream:
        await run_fanout(endpoint(upstream), [req("a", "fault/set-cookie")])
        await run_fanout(endpoint(upstream), [req("b", "fault/set-cookie"), req("c", "mock/fast")])
        assert upstream.context.cookies_seen == []


async def test_an_outside_cancel_at_random_moments_keeps_every_result(
        upstream: RunningUpstream) -> None:
    import random

    rng = random.Random(2026)
    for _ in range(12):
        requests = [req(f"s{i}", rng.choice(["mock/slow", "fault/truncate", "fault/stall:2",
                                             "fault/no-response", "mock/fast"]))
                    for i in range(60)]
        box: list[Any] = []
        finals: dict[str, int] = {}
        with trio.move_on_after(rng.uniform(0.0, 0.15)):
            async with open_fanout(endpoint(upstream), requests) as fan:
                box.append(fan)
                async for event in fan.events:
                    if isinstance(event, StreamFinished):
                        finals[event.stream] = finals.get(event.stream, 0) + 1
        if not box:
            continue  # cancelled before the block opened: nothing was started
        assert sorted(box[0].results) == sorted(r.key for r in requests)
        assert set(finals.values()) <= {1}


async def test_a_lone_surrogate_travels_both_ways(upstream: RunningUpstream) -> None:
    # "\ud800" is valid JSON text: a prompt may hold one, and a server may send one back.
    prompt = [{"role": "user", "content": "bad \ud800 text"}]
    request = StreamRequest("s", "mock/echo", prompt)
    assert request.content_key(endpoint(upstream))  # hashes, never crashes
    result = (await run_fanout(endpoint(upstream), [request]))["s"]
    assert (result.outcome, result.text) == (Outcome.COMPLETED, "bad \ud800 text")


# -- connections the server gave up on ----------------------------------------------------

STALE_MODELS = ["fault/close-after-response", "fault/close-after-response:reset",
                "fault/close-idle:0.5:3"]


def stale_attempts(results: dict[str, Any]) -> int:
    return sum(1 for r in results.values() for a in r.attempts
               if a.error is not None and a.error.code == "stale_connection")


@pytest.mark.parametrize("model", STALE_MODELS)
@pytest.mark.parametrize("own_client", [False, True])
async def test_a_pooled_connection_the_server_closed_is_sent_again_on_a_fresh_one(
        model: str, own_client: bool, upstream: RunningUpstream) -> None:
    # attempts=1: no retry budget at all, and 3 other streams run: neither stops a re-send.
    requests = [StreamRequest(f"s{i}", model, [{"role": "user", "content": f"Question {i}"}])
                for i in range(24)]
    events: list[Any] = []
    async with (httpx.AsyncClient() as own,
                open_fanout(endpoint(upstream), requests, max_concurrency=4,
                            retry=RetryPolicy(attempts=1),
                            client=own if own_client else None) as fan):
        async for event in fan.events:
            events.append(event)
    results = fan.results
    assert {r.outcome for r in results.values()} == {Outcome.COMPLETED}, [
        r.reason for r in results.values()]
    stale = stale_attempts(results)
    assert stale == upstream.stats.unanswered > 0  # every request the server dropped, resent
    for result in results.values():
        *before, last = result.attempts
        assert last.status == 200 and last.error is None
        for attempt in before:
            assert attempt.status is None and attempt.error is not None
            assert attempt.error.code == "stale_connection"
            # A reset seen while writing the body comes out as a close (httpcore reads
            # on after a failed write, and the socket's error was spent on the write).
            said = (("reset", "closed") if "reset" in model else ("closed",))
            assert any(attempt.error.message.startswith(
                f"the server {what} the connection before answering") for what in said), (
                attempt.error)
        if not own_client:  # fanout's client resends on a fresh connection: never stale twice
            assert len(before) <= 1, result.attempts
    retrying = [e for e in events if isinstance(e, StreamRetrying)]
    assert len(retrying) == stale and {e.wait for e in retrying} == {0.0}


async def test_a_fresh_connection_closed_before_an_answer_is_not_resent(
        nursery: trio.Nursery, watchdog: None) -> None:
    # A server that reads each request and closes the connection: no connection was
    # reused, so there is no stale keep-alive to blame and nothing is sent again for free.
    seen: list[int] = []

    async def drop(stream: trio.SocketStream) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += await stream.receive_some(65536)
        seen.append(1)
        await stream.aclose()

    listeners = await nursery.start(partial(trio.serve_tcp, drop, 0, host="127.0.0.1"))
    port = listeners[0].socket.getsockname()[1]
    result = (await run_fanout(Endpoint(f"http://127.0.0.1:{port}/v1", KEY),
                               [req("s", "mock/fast")], retry=RetryPolicy(attempts=1)))["s"]
    assert (result.outcome, len(result.attempts), len(seen)) == (Outcome.ERROR, 1, 1)
    assert result.reason is not None and result.reason.startswith(
        "the server closed the connection before answering"), result.reason
    assert result.error is not None and result.error.code != "stale_connection"


@pytest.mark.parametrize("route", ["chat", "responses", "anthropic"])
async def test_an_error_body_that_is_an_event_stream_gives_its_message(
        route: str, upstream: RunningUpstream) -> None:
    request = StreamRequest("s", "fault/sse-500", MESSAGES, {"max_tokens": 5}, api=route)
    result = (await run_fanout(endpoint(upstream), [request],
                               retry=RetryPolicy(attempts=1)))["s"]
    assert result.outcome is Outcome.ERROR and result.error is not None
    assert (result.error.status, result.error.message) == (
        500, "The server had an error while processing your request.")
    assert result.error.type == ("api_error" if route == "anthropic" else "server_error")
    assert result.reason is not None and "data:" not in result.reason
