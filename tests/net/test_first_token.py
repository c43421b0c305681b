"""Waiting for the first token (#27): before the first content, keep-alives show the server
is alive and ``first_token`` bounds the wait; after it, only events move ``idle``.

llama.cpp sends only ``: ping`` comments while it evaluates a long prompt; a relay can
send them forever while its model is stuck.  So: before the first content, a keep-alive
comment or an event the dialect ignores (Anthropic's ``ping``) moves the idle deadline,
and silence (nothing, or bytes that complete neither) still ends the stream by ``idle``;
after the first content, keep-alives move nothing.

First in virtual time (scripted bodies, no sockets), both ways the idle deadline is kept
(the fan-out's ``IdleWatch``, and a ``StreamRunner`` on its own, whose attempt scope
carries it); then through the embedded upstream over loopback, in every dialect, with
generous ratios between intervals (a keep-alive every 0.05 s against idle 0.5 s).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import trio
from trio.testing import MockClock

from fanout import Deadlines, Outcome, StreamRequest, StreamResult
from fanout.net.stream import StreamRunner
from fanout.request import StreamSettings
from fanout.upstream import RunningUpstream
from tests.net.scripted import DONE, Script, event, stream
from tests.net.test_dialects import APIS, ask
from tests.net.test_dialects import run as run_loopback
from tests.net.test_stream import ENDPOINT, request, run, text_steps

PING = b": ping\n\n"


def pings(count: int, every: float = 1.0) -> list[tuple[float, bytes]]:
    return [(every, PING)] * count


async def alone(script: Script, deadlines: Deadlines) -> StreamResult:
    """One ``StreamRunner`` without an ``IdleWatch``: its attempt scope carries ``idle``."""
    send, _receive = trio.open_memory_channel[Any](math.inf)
    async with script.client() as client:
        runner = StreamRunner(client, ENDPOINT, request(), send,
                              StreamSettings(deadlines=deadlines))
        return await runner.run([])


async def one(script: Script, deadlines: Deadlines, watched: bool) -> StreamResult:
    if not watched:
        return await alone(script, deadlines)
    results, _ = await run(script, deadlines=deadlines)
    return results["s"]  # type: ignore[no-any-return]


WAYS = pytest.mark.parametrize("watched", [True, False], ids=["fan-out", "runner"])


@WAYS
async def test_keepalives_before_the_first_content_keep_the_stream(
        autojump_clock: MockClock, watched: bool) -> None:
    # A 27 s prompt, a `: ping` a second, idle 5: the server is working all along.
    script = Script([stream(*pings(27), *text_steps(3, 0.1))])
    result = await one(script, Deadlines(idle=5), watched)
    assert (result.outcome, result.timed_out) == (Outcome.COMPLETED, None), result.reason
    assert result.text == "t0 t1 t2 " and result.comments == 27
    assert result.timings is not None and result.timings.ttft == pytest.approx(27.1)


@WAYS
async def test_keepalives_after_a_role_chunk_keep_it_too(autojump_clock: MockClock,
                                                        watched: bool) -> None:
    # OpenRouter's way: the role chunk at once (no content), then comments until the model
    # answers.
    steps = [(0.0, event(role="assistant")), *pings(20), (1.0, event("hi")),
             (0.0, event(finish="stop")), (0.0, DONE)]
    result = await one(Script([stream(*steps)]), Deadlines(idle=5), watched)
    assert (result.outcome, result.text) == (Outcome.COMPLETED, "hi"), result.reason


@WAYS
async def test_first_token_bounds_the_wait(autojump_clock: MockClock, watched: bool) -> None:
    script = Script([stream(*pings(100), *text_steps(1, 0))])
    result = await one(script, Deadlines(idle=5, first_token=20), watched)
    assert (result.outcome, result.timed_out) == (Outcome.TIMED_OUT, "first_token")
    assert result.reason == "no first token within 20 s"
    assert result.timings is not None and result.timings.end == pytest.approx(20.0)


@WAYS
async def test_without_first_token_total_bounds_it(autojump_clock: MockClock,
                                                   watched: bool) -> None:
    script = Script([stream(*pings(100), *text_steps(1, 0))])
    result = await one(script, Deadlines(idle=5, total=40), watched)
    assert (result.outcome, result.timed_out) == (Outcome.TIMED_OUT, "total")
    assert result.timings is not None and result.timings.end == pytest.approx(40.0)


@WAYS
async def test_silence_before_the_first_content_is_idle_without_first_token(
        autojump_clock: MockClock, watched: bool) -> None:
    # No keep-alive at all and no first_token: idle counts from the headers.
    script = Script([stream((27.0, event("late")), (0.0, event(finish="stop")), (0.0, DONE))])
    result = await one(script, Deadlines(idle=5), watched)
    assert (result.outcome, result.timed_out) == (Outcome.TIMED_OUT, "idle")
    assert result.reason == "no event within 5 s"
    assert result.timings is not None and result.timings.end == pytest.approx(5.0)


@WAYS
async def test_a_set_first_token_governs_alone_before_the_first_content(
        autojump_clock: MockClock, watched: bool) -> None:
    # llama.cpp's native server sends nothing at all while it evaluates a long prompt
    # (its first keep-alive comes at 30 s): with first_token set, idle starts at the
    # first content; the first_token deadline still bounds the wait.
    script = Script([stream((27.0, event("late")), (0.0, event(finish="stop")), (0.0, DONE))])
    result = await one(script, Deadlines(idle=5, first_token=60), watched)
    assert result.outcome == Outcome.COMPLETED and result.text == "late"
    assert result.timings is not None and result.timings.ttft == pytest.approx(27.0)
    script = Script([stream((70.0, event("late")), (0.0, DONE))])
    result = await one(script, Deadlines(idle=5, first_token=60), watched)
    assert (result.outcome, result.timed_out) == (Outcome.TIMED_OUT, "first_token")
    assert result.timings is not None and result.timings.end == pytest.approx(60.0)
    # and once content came, idle is as it always was: silence after it ends the stream
    script = Script([stream((27.0, event("late")), (9.0, event("more")), (0.0, DONE))])
    result = await one(script, Deadlines(idle=5, first_token=60), watched)
    assert (result.outcome, result.timed_out) == (Outcome.TIMED_OUT, "idle")
    assert result.timings is not None and result.timings.end == pytest.approx(32.0)


@WAYS
async def test_silence_after_keepalives_is_idle(autojump_clock: MockClock,
                                                watched: bool) -> None:
    # Keep-alives for 10 s, then none: idle counts from the last one.
    script = Script([stream(*pings(10), (30.0, event("late")), (0.0, DONE))])
    result = await one(script, Deadlines(idle=5), watched)
    assert (result.outcome, result.timed_out) == (Outcome.TIMED_OUT, "idle")
    assert result.timings is not None and result.timings.end == pytest.approx(15.0)


@WAYS
async def test_bytes_that_complete_nothing_are_no_keepalive(autojump_clock: MockClock,
                                                            watched: bool) -> None:
    # An event dripped a byte a second never ends: bytes are no sign of a working server.
    head = b'data: {"choices":[{"index":0,"delta":{"content":"'
    script = Script([stream((0.0, head), *[(1.0, b"x")] * 30)])
    result = await one(script, Deadlines(idle=5), watched)
    assert (result.outcome, result.timed_out) == (Outcome.TIMED_OUT, "idle")
    assert result.timings is not None and result.timings.end == pytest.approx(5.0)


@WAYS
async def test_after_the_first_content_keepalives_do_not_count(autojump_clock: MockClock,
                                                                watched: bool) -> None:
    steps = [*pings(3), (0.0, event(role="assistant")), (1.0, event("hi")), *pings(30)]
    result = await one(Script([stream(*steps)]), Deadlines(idle=5), watched)
    assert (result.outcome, result.timed_out, result.text) == (Outcome.TIMED_OUT, "idle", "hi")
    assert result.timings is not None and result.timings.end == pytest.approx(4.0 + 5.0)


async def test_an_anthropic_ping_event_is_a_keepalive(autojump_clock: MockClock) -> None:
    # A real Anthropic server sends `event: ping`: before the first content, a sign of life.
    ping = b'event: ping\ndata: {"type": "ping"}\n\n'
    start = (b'event: message_start\ndata: {"type": "message_start", "message": {"id": "m", '
             b'"type": "message", "role": "assistant", "model": "m", "content": [], '
             b'"stop_reason": null, "usage": {"input_tokens": 1, "output_tokens": 0}}}\n\n')
    text = (b'event: content_block_start\ndata: {"type": "content_block_start", "index": 0, '
            b'"content_block": {"type": "text", "text": ""}}\n\n'
            b'event: content_block_delta\ndata: {"type": "content_block_delta", "index": 0, '
            b'"delta": {"type": "text_delta", "text": "hi"}}\n\n'
            b'event: content_block_stop\ndata: {"type": "content_block_stop", "index": 0}\n\n'
            b'event: message_delta\ndata: {"type": "message_delta", "delta": {"stop_reason": '
            b'"end_turn"}, "usage": {"output_tokens": 1}}\n\n'
            b'event: message_stop\ndata: {"type": "message_stop"}\n\n')
    steps = [(0.0, start), *[(1.0, ping)] * 20, (1.0, text)]
    results, _ = await run(Script([stream(*steps)]),
                           StreamRequest("s", "m", [{"role": "user", "content": "hi"}],
                                         api="anthropic"),
                           deadlines=Deadlines(idle=5))
    result = results["s"]
    assert (result.outcome, result.text) == (Outcome.COMPLETED, "hi"), result.reason


# ---------------------------------------------------------------- over loopback, real time


@pytest.mark.parametrize("api", APIS)
async def test_a_long_prompt_with_keepalives_completes(upstream: RunningUpstream,
                                                       api: str) -> None:
    # 1.5 s of keep-alives 0.05 s apart (Anthropic: ping events), idle 0.5: completed.
    model = "fault/ping-then-answer:1.5:0.05"
    results, _ = await run_loopback(upstream, ask(model, api),
                                    deadlines=Deadlines(idle=0.5, total=10))
    result = results[f"{model}/{api}"]
    assert (result.outcome, result.timed_out) == (Outcome.COMPLETED, None), result.reason
    assert result.text
    if api != "anthropic":
        assert result.comments >= 10


@pytest.mark.parametrize("api", APIS)
async def test_a_long_prompt_in_silence_is_idle(upstream: RunningUpstream, api: str) -> None:
    model = "fault/ping-then-answer:1.5:0"  # nothing at all before the answer
    results, _ = await run_loopback(upstream, ask(model, api),
                                    deadlines=Deadlines(idle=0.3, total=10))
    result = results[f"{model}/{api}"]
    assert (result.outcome, result.timed_out) == (Outcome.TIMED_OUT, "idle")
    assert result.reason == "no event within 0.3 s" and not result.text


@pytest.mark.parametrize("api", APIS)
async def test_endless_keepalives_end_by_first_token(upstream: RunningUpstream,
                                                     api: str) -> None:
    model = "fault/ping-then-answer:8:0.05"
    results, _ = await run_loopback(upstream, ask(model, api),
                                    deadlines=Deadlines(idle=0.5, first_token=1.5, total=10))
    result = results[f"{model}/{api}"]
    assert (result.outcome, result.timed_out) == (Outcome.TIMED_OUT, "first_token")
    assert result.reason == "no first token within 1.5 s" and not result.text


@pytest.mark.parametrize("api", APIS)
async def test_keepalives_after_content_are_still_idle(upstream: RunningUpstream,
                                                       api: str) -> None:
    # fault/heartbeat-stall: content, then keep-alives only: idle, as before.
    model = "fault/heartbeat-stall:3"
    results, _ = await run_loopback(upstream, ask(model, api, headers={
        "x-fanout-cadence": "0.05"}), deadlines=Deadlines(idle=0.5, total=10))
    result = results[f"{model}/{api}"]
    assert (result.outcome, result.timed_out) == (Outcome.TIMED_OUT, "idle")
    assert result.text
