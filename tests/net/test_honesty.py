"""The engine's honesty, in virtual time: reasons, retries that help and retries that
do not, default bounds, cookies, the key, exactly one final event whatever ends a
stream, and the typed settings."""

from __future__ import annotations

import errno
import gzip
import inspect
import random
from collections import Counter
from typing import Any

import httpx
import pytest
import trio
from trio.testing import MockClock

from fanout import (
    Deadlines,
    Endpoint,
    Flag,
    Outcome,
    RetryPolicy,
    StreamFinished,
    StreamRequest,
    StreamStarted,
    make_client,
    open_fanout,
    run_fanout,
)
from fanout.fanout import FanoutOptions
from tests.net.scripted import (
    DONE,
    SSE,
    Script,
    ScriptedBody,
    delayed,
    event,
    raises,
    status,
    stream,
)
from tests.net.test_stream import ENDPOINT, MESSAGES, request, run, text_steps

KEY = ENDPOINT.api_key
assert KEY is not None


def connect_error(code: int) -> httpx.ConnectError:
    exc = httpx.ConnectError("All connection attempts failed")
    exc.__cause__ = OSError(code, "os says no")
    return exc


# -- every outcome says why -----------------------------------------------------------------

async def test_too_many_open_files_names_ulimit(autojump_clock: MockClock) -> None:
    results, _ = await run(Script([raises(connect_error(errno.EMFILE))]),
                           retry=RetryPolicy(attempts=1))
    result = results["s"]
    assert result.outcome is Outcome.ERROR
    assert result.reason is not None and "ulimit -n" in result.reason
    assert "All connection attempts failed" not in result.reason


async def test_a_reset_connection_mid_stream_is_truncated_with_its_reason(
        autojump_clock: MockClock) -> None:
    reset = httpx.ReadError("[Errno 104] Connection reset by peer")
    reset.__cause__ = ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")
    results, _ = await run(Script([stream((0, event("a")), (0, event("b")), (0.1, reset))]))
    result = results["s"]
    assert (result.outcome, result.text) == (Outcome.TRUNCATED, "ab")
    assert result.reason == ("the connection broke after 2 events without [DONE]: "
                             "connection reset by the "
                             "server (ReadError: [Errno 104] Connection reset by peer)")


async def test_an_html_page_is_an_error_with_an_excerpt(autojump_clock: MockClock) -> None:
    page = httpx.Response(200, headers={"content-type": "text/html; charset=utf-8"},
                          content=b"<html><title>Sign in</title></html>")
    results, _ = await run(Script([lambda _: page]))
    result = results["s"]
    assert result.outcome is Outcome.ERROR
    assert result.reason == ("not an event stream (content-type text/html; charset=utf-8): "
                             "'<html><title>Sign in</title></html>'")
    assert len(results) == 1


async def test_a_json_completion_for_a_stream_is_read_and_flagged(
        autojump_clock: MockClock) -> None:
    body = {"choices": [{"index": 0, "message": {"content": "whole"}, "finish_reason": "stop"}]}
    results, _ = await run(Script([status(200, body)]))
    result = results["s"]
    assert (result.outcome, result.text) == (Outcome.COMPLETED, "whole")
    assert Flag.NOT_STREAMED in result.flags


async def test_cancel_and_timeouts_say_why(autojump_clock: MockClock) -> None:
    slow = Script([stream(*text_steps(10, 1.0))])
    async with slow.client() as client, open_fanout(
            ENDPOINT, [request("a"), request("b")], client=client,
            deadlines=Deadlines(total=2.5)) as fan:
        await trio.sleep(0.5)
        fan.cancel("a")
        async for _ in fan.events:
            pass
    assert (fan.results["a"].outcome, fan.results["a"].reason) == (
        Outcome.CANCELLED, "cancelled by the caller")
    assert (fan.results["b"].outcome, fan.results["b"].reason) == (
        Outcome.TIMED_OUT, "the total deadline of 2.5 s passed")


async def test_leaving_the_block_says_so(autojump_clock: MockClock) -> None:
    async with Script([stream(*text_steps(10, 1.0))]).client() as client, open_fanout(
            ENDPOINT, [request("a")], client=client) as fan:
        await trio.sleep(1.5)
    assert fan.results["a"].outcome is Outcome.CANCELLED
    assert fan.results["a"].reason == "cancelled: the fan-out's block ended before the stream did"
    assert fan.results["a"].text == "t0 "


# -- retries that help --------------------------------------------------------------------

@pytest.mark.parametrize("first", [
    [],  # an empty 200
    [(0.0, event(role="assistant"))],  # a cut before the first token
    [(0.0, DONE)],  # [DONE] with nothing
    [(0.0, event(role="assistant")), (0.0, httpx.RemoteProtocolError("peer closed"))],
])
async def test_a_response_that_delivered_nothing_is_retried(
        first: list[tuple[float, bytes | Exception]], autojump_clock: MockClock) -> None:
    script = Script([stream(*first), stream(*text_steps(2, 0.1))])
    results, _ = await run(script, retry=RetryPolicy(jitter=False))
    result = results["s"]
    assert (result.outcome, result.text, len(script.requests)) == (
        Outcome.COMPLETED, "t0 t1 ", 2)
    assert [a.delivered_content for a in result.attempts] == [False, True]


async def test_nothing_delivered_while_others_ran_is_left_to_the_caller(
        autojump_clock: MockClock) -> None:
    # A single-slot server cuts the running stream when another arrives: retrying the cut
    # one at once would cut the other.  The result says others ran; the caller decides.
    script = Script([stream((0.0, event(role="assistant")), (0.0, DONE)),
                     stream(*text_steps(3, 1.0))])
    results, _ = await run(script, request("cut"), request("other"), max_concurrency=2)
    cut = next(r for r in results.values() if r.text == "")
    assert (cut.outcome, len(cut.attempts), cut.others_running) == (Outcome.TRUNCATED, 1, 1)


async def test_never_retried_after_content(autojump_clock: MockClock) -> None:
    script = Script([stream((0.0, event("a")), (0.0, httpx.RemoteProtocolError("cut"))),
                     stream(*text_steps(2, 0.1))])
    results, _ = await run(script)
    assert (results["s"].outcome, results["s"].text, len(script.requests)) == (
        Outcome.TRUNCATED, "a", 1)


@pytest.mark.parametrize(("code", "body"), [
    (500, {"error": {"message": "1 validation error: Input should be a valid number",
                     "type": "internal_server_error"}}),
    (400, {"error": {"message": "bad request", "type": "invalid_request_error"}}),
    (401, {"error": {"message": "no key"}}),
    (404, {"detail": "Not Found"}),
    (422, {"error": {"message": "unprocessable"}}),
])
async def test_deterministic_errors_are_final(code: int, body: dict[str, Any],
                                              autojump_clock: MockClock) -> None:
    script = Script([status(code, body)])
    results, _ = await run(script, retry=RetryPolicy(attempts=8))
    assert (results["s"].outcome, len(script.requests)) == (Outcome.ERROR, 1)


async def test_server_errors_get_a_few_attempts_not_the_429_budget(
        autojump_clock: MockClock) -> None:
    broken = Script([status(503)])
    await run(broken, retry=RetryPolicy(attempts=8))
    busy = Script([status(429)])
    await run(busy, retry=RetryPolicy(attempts=8, max_retry_after=1))
    assert (len(broken.requests), len(busy.requests)) == (3, 8)
    for code in (408, 409):
        retried = Script([status(code), stream(*text_steps(1, 0))])
        results, _ = await run(retried)
        assert (results["s"].outcome, len(retried.requests)) == (Outcome.COMPLETED, 2)


async def test_timings_cover_the_whole_stream_retries_included(
        autojump_clock: MockClock) -> None:
    script = Script([delayed(1.0, status(503)), stream(*text_steps(2, 0.5))])
    results, _ = await run(script, retry=RetryPolicy(initial=2.0, jitter=False))
    timings = results["s"].timings
    assert timings is not None
    assert timings.ttft == pytest.approx(0.5)  # the model's latency, last attempt
    assert timings.retrying == pytest.approx(3.0)  # 1 s failing + 2 s backoff
    assert timings.e2e == pytest.approx(4.0)


# -- bounded by default ---------------------------------------------------------------------

async def test_a_server_that_never_answers_ends_at_the_default_first_byte_deadline(
        autojump_clock: MockClock) -> None:
    never = Script([delayed(10**9, stream(*text_steps(1, 0)))])
    start = trio.current_time()
    results, _ = await run(never, retry=RetryPolicy(attempts=1))
    assert (results["s"].outcome, results["s"].timed_out) == (Outcome.TIMED_OUT, "first_byte")
    assert trio.current_time() - start == pytest.approx(Deadlines().first_byte)


async def test_bytes_that_never_make_an_event_end_at_the_default_idle_deadline(
        autojump_clock: MockClock) -> None:
    drip = [(0.0, b"data: {\"choices\": [")] + [(5.0, b" ")] * 10_000
    results, _ = await run(Script([stream(*drip)]))
    assert (results["s"].outcome, results["s"].timed_out) == (Outcome.TIMED_OUT, "idle")


async def test_an_endless_stream_ends_at_the_default_total_deadline(
        autojump_clock: MockClock) -> None:
    endless = [(0.0, event(role="assistant"))] + [(1.0, event("x"))] * 5000
    results, _ = await run(Script([stream(*endless)]))
    result = results["s"]
    assert (result.outcome, result.timed_out) == (Outcome.TIMED_OUT, "total")
    assert len(result.text) == Deadlines().total - 1  # every token until then kept


async def test_deadlines_can_be_disabled_one_by_one_or_all() -> None:
    assert Deadlines(idle=None).idle is None and Deadlines(idle=None).total == 3600
    assert Deadlines.none() == Deadlines(None, None, None, None, None)


async def test_the_response_cap_ends_a_stream_with_its_output(autojump_clock: MockClock) -> None:
    steps = [(0.0, event("x" * 1000))] * 200
    results, _ = await run(Script([stream(*steps)]), max_response_bytes=50_000)
    result = results["s"]
    assert result.outcome is Outcome.ERROR
    assert result.error is not None and result.error.code == "response_too_large"
    assert 40_000 < len(result.text) < 50_000


def gzip_response(body: bytes) -> Any:
    def respond(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={**SSE, "content-encoding": "gzip"},
                              stream=ScriptedBody([(0.0, gzip.compress(body))]))
    return respond


async def test_a_gzip_body_is_read_in_bounded_pieces(autojump_clock: MockClock) -> None:
    body = b"".join(event(f"{i} ") for i in range(50)) + event(finish="stop") + DONE
    results, _ = await run(Script([gzip_response(body)]))
    assert (results["s"].outcome, results["s"].text.split()[-1]) == (Outcome.COMPLETED, "49")
    bomb = event("x") * 2_000_000  # 46 MB of events, 45 kB compressed
    results, _ = await run(Script([gzip_response(bomb)]), max_response_bytes=1_000_000)
    result = results["s"]
    assert result.error is not None and result.error.code == "response_too_large"
    assert result.bytes_received <= 1_000_000


async def test_an_encoding_fanout_cannot_read_is_an_error(autojump_clock: MockClock) -> None:
    def brotli(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={**SSE, "content-encoding": "br"},
                              stream=ScriptedBody([(0.0, b"\x1b\x00")]))
    results, _ = await run(Script([brotli]), retry=RetryPolicy(attempts=1))
    assert results["s"].outcome is Outcome.ERROR
    assert results["s"].reason == ("the body is br-encoded, which fanout cannot read "
                                   "(it asks for identity)")


# -- cookies and the key --------------------------------------------------------------------

@pytest.mark.parametrize("own_client", [True, False])
async def test_no_stream_sends_a_cookie_another_streams_server_set(
        own_client: bool, autojump_clock: MockClock) -> None:
    def set_cookie(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={**SSE, "set-cookie": "session=abc; Path=/"},
                              stream=ScriptedBody(text_steps(1, 0)))
    script = Script([set_cookie])
    transport = httpx.MockTransport(script.handler)
    client = (make_client() if own_client else httpx.AsyncClient())
    client._transport = transport  # the caller's jar, or fanout's
    async with client:
        for key in ("a", "b"):
            async with open_fanout(ENDPOINT, [request(key)], client=client) as fan:
                async for _ in fan.events:
                    pass
    assert [r.headers.get("cookie") for r in script.requests] == [None, None]


async def test_the_key_never_leaves_through_headers_or_errors(autojump_clock: MockClock) -> None:
    echo = {"x-request-id": KEY, "openai-model": KEY, "retry-after": KEY,
            "x-ratelimit-remaining-requests": KEY, "content-type": "text/event-stream"}
    script = Script([stream(*text_steps(1, 0), headers=echo),
                     status(401, {"error": {"message": KEY, "type": KEY, "code": KEY}}),
                     raises(httpx.ConnectError(f"cannot reach {KEY}"))])
    results, events = await run(script, request("a"), request("b"), request("c"),
                                retry=RetryPolicy(attempts=1), max_concurrency=1)
    started = [e for e in events if isinstance(e, StreamStarted)]
    assert started and all(KEY not in repr(e.headers) for e in started)
    assert "***" in started[0].headers["x-request-id"]
    seen = repr(events) + repr(results) + "".join(str(r.reason) for r in results.values())
    assert KEY not in seen


# -- exactly one final event, whatever ends the stream ----------------------------------------

async def nursery_below(request: httpx.Request) -> httpx.Response:
    # A transport that waits inside a nursery (as happy-eyeballs connects do): a cancel
    # from outside reaches the stream as a group wrapping trio.Cancelled.
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.sleep_forever)
        await trio.sleep_forever()
    raise AssertionError("unreachable")


@pytest.mark.parametrize("seed", range(20))
async def test_every_stream_ends_with_one_final_event_under_random_outside_cancels(
        seed: int, autojump_clock: MockClock) -> None:
    rng = random.Random(seed)
    kinds = [nursery_below, stream(*text_steps(5, 0.1)), delayed(0.2, status(503)),
             stream((0.05, event("a")), (0.1, httpx.ReadError("cut")))]
    script = Script([kinds[i % len(kinds)] for i in range(40)])
    requests = [request(f"s{i}") for i in range(40)]
    finals: Counter[str] = Counter()
    box: list[Any] = []
    with trio.move_on_after(rng.uniform(0, 0.6)):
        async with script.client() as client, open_fanout(
                ENDPOINT, requests, client=client, max_concurrency=rng.choice([None, 7]),
                seed=seed) as fan:
            box.append(fan)
            if rng.random() < 0.5:
                await trio.sleep(rng.uniform(0, 0.3))
                fan.cancel(f"s{rng.randrange(40)}")
            async for item in fan.events:
                if isinstance(item, StreamFinished):
                    finals[item.stream] += 1
    assert box, "the fan-out opened"
    assert sorted(box[0].results) == sorted(r.key for r in requests)
    assert all(count == 1 for count in finals.values())
    assert {r.outcome for r in box[0].results.values()} <= set(Outcome)


async def test_grouped_cancellation_while_connecting_keeps_every_result(
        autojump_clock: MockClock) -> None:
    box: list[Any] = []
    with trio.move_on_after(1.0):
        async with Script([nursery_below]).client() as client, open_fanout(
                ENDPOINT, [request(f"s{i}") for i in range(30)], client=client) as fan:
            box.append(fan)
            async for _ in fan.events:
                pass
    results = box[0].results
    assert len(results) == 30
    assert {(r.outcome, r.reason) for r in results.values()} == {
        (Outcome.CANCELLED, "cancelled from outside the fan-out (a cancel scope or deadline)")}


# -- keys and settings ------------------------------------------------------------------------

async def test_duplicate_keys_raise_a_plain_value_error_before_anything_is_sent() -> None:
    script = Script([stream(*text_steps(1, 0))])
    with pytest.raises(ValueError, match="stream key 'a' is used twice"):
        await run_fanout(ENDPOINT, [request("a"), request("b"), request("a")],
                         client=script.client())
    assert script.requests == []


async def test_run_fanout_refuses_accept_more() -> None:
    with pytest.raises(TypeError, match="accept_more"):
        await run_fanout(ENDPOINT, [], accept_more=True)  # type: ignore[typeddict-unknown-key]


def test_run_fanout_takes_exactly_the_options_of_open_fanout() -> None:
    options = {name for name, parameter in inspect.signature(open_fanout).parameters.items()
               if parameter.kind is inspect.Parameter.KEYWORD_ONLY}
    assert set(FanoutOptions.__annotations__) == options - {"accept_more"}


async def test_a_request_brings_its_own_headers_and_retry(autojump_clock: MockClock) -> None:
    script = Script([status(503), stream(*text_steps(1, 0))])
    own = request(headers={"X-Trace": "t1"}, retry=RetryPolicy(attempts=1))
    results, _ = await run(script, own)
    assert (results["s"].outcome, len(script.requests)) == (Outcome.ERROR, 1)
    assert script.requests[0].headers["x-trace"] == "t1"
    with pytest.raises(ValueError, match="must not carry Authorization"):
        StreamRequest("k", "m", MESSAGES, headers={"Authorization": "Bearer x"})


def test_expectations_come_from_the_request() -> None:
    assert StreamRequest("k", "m", MESSAGES, {"n": 3}).expected_choices == 3
    assert StreamRequest("k", "m", MESSAGES).expects_usage
    off = StreamRequest("k", "m", MESSAGES, {"stream_options": {"include_usage": False}})
    assert not off.expects_usage


async def test_endpoint_switch_accepts_done_alone(autojump_clock: MockClock) -> None:
    lax = Endpoint("http://relay.test/v1", "k", require_finish_reason=False)
    body = [(0.0, event("hi")), (0.0, DONE)]
    async with Script([stream(*body)]).client() as client:
        results = await run_fanout(lax, [request()], client=client)
    assert results["s"].outcome is Outcome.COMPLETED
    assert Flag.NO_FINISH_REASON in results["s"].flags
    strict_results, _ = await run(Script([stream(*body)]))
    assert strict_results["s"].outcome is Outcome.TRUNCATED



async def test_http_transport_and_deadline_errors_are_events_too(
        autojump_clock: MockClock) -> None:
    from fanout import ErrorReported, StreamRetrying

    script = Script([status(503), stream((0.0, event("a")), (0.0, httpx.ReadError("cut")))])
    _, events = await run(script, retry=RetryPolicy(jitter=False))
    kinds = [type(e).__name__ for e in events if isinstance(e, ErrorReported | StreamRetrying)]
    assert kinds == ["ErrorReported", "StreamRetrying", "ErrorReported"]
    errors = [e.error for e in events if isinstance(e, ErrorReported)]
    assert (errors[0].status, errors[1].type) == (503, "transport_error")
    in_stream = Script([stream((0.0, event("a")), (0.0, b'data: {"error": {"message": "x"}}\n\n'))])
    _, events = await run(in_stream)
    assert sum(isinstance(e, ErrorReported) for e in events) == 1  # sent once, not twice
    slow = Script([stream((5.0, event("late")))])
    _, events = await run(slow, deadlines=Deadlines(first_byte=1.0), retry=RetryPolicy(attempts=1))
    [timeout] = [e for e in events if isinstance(e, ErrorReported)]
    assert (timeout.error.type, timeout.error.code) == ("timeout", "first_byte")
