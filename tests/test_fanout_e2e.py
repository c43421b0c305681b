"""The fan-out against the embedded upstream over loopback: real sockets, real time.

No autojump clock here (it fires spurious timeouts with real sockets): the
deadlines are short and the assertions are about outcomes, not durations.
"""

from __future__ import annotations

import gc
import random
from collections import defaultdict
from typing import Any

import attrs
import pytest
import trio

from fanout import (
    Deadlines,
    Endpoint,
    Event,
    Outcome,
    RetryPolicy,
    StreamFinished,
    StreamRequest,
    TextDelta,
    open_fanout,
    run_fanout,
)
from fanout.upstream import RunningUpstream

MESSAGES = [{"role": "user", "content": "Say something about rivers."}]
FAST_RETRY = RetryPolicy(initial=0.01, maximum=0.05)


def endpoint(upstream: RunningUpstream) -> Endpoint:
    return Endpoint(upstream.base_url, "sk-e2e", {"x-fanout-retry-after": "0.05"})


def req(key: str, model: str, deadlines: Deadlines | None = None, **params: Any
        ) -> StreamRequest:
    return StreamRequest(key, model, MESSAGES, params, deadlines)


EXPECTED: list[tuple[str, Deadlines | None, Outcome, str | None, bool]] = [
    # model, deadlines, outcome, timed_out, partial text expected
    ("mock/fast", None, Outcome.COMPLETED, None, True),
    ("fault/truncate", None, Outcome.TRUNCATED, None, True),
    ("fault/no-done", None, Outcome.TRUNCATED, None, True),
    ("fault/drop-chunked", None, Outcome.TRUNCATED, None, True),
    ("fault/stall:3", Deadlines(idle=0.4), Outcome.TIMED_OUT, "idle", True),
    ("fault/heartbeat-stall:3", Deadlines(idle=0.5), Outcome.TIMED_OUT, "idle", True),
    ("fault/slow-first-token:5", Deadlines(first_token=0.3), Outcome.TIMED_OUT, "first_token",
     False),
    ("fault/garbage", None, Outcome.COMPLETED, None, True),
    ("fault/bad-utf8", None, Outcome.COMPLETED, None, True),
    ("fault/error-event", None, Outcome.ERROR, None, True),
    ("fault/error-event:typed", None, Outcome.ERROR, None, True),
    ("fault/429:2", None, Outcome.COMPLETED, None, True),
    ("fault/500-then-ok", None, Outcome.COMPLETED, None, True),
    ("fault/empty-200", None, Outcome.TRUNCATED, None, False),
    ("no/such-model", None, Outcome.ERROR, None, False),
]


async def test_every_fault_model_gives_its_outcome(upstream: RunningUpstream) -> None:
    requests = [req(model, model, deadlines) for model, deadlines, *_ in EXPECTED]
    results = await run_fanout(endpoint(upstream), requests, retry=FAST_RETRY,
                               max_event_size=100_000)
    for model, _, outcome, timed_out, partial in EXPECTED:
        result = results[model]
        assert (result.outcome, result.timed_out) == (outcome, timed_out), (model, result.error)
        assert bool(result.text) is partial, model
    assert results["fault/garbage"].skipped_frames >= 3
    assert "\ufffd" in results["fault/bad-utf8"].text
    assert [a.status for a in results["fault/429:2"].attempts] == [429, 429, 200]
    assert [a.status for a in results["fault/500-then-ok"].attempts] == [500, 200]
    assert results["fault/heartbeat-stall:3"].comments >= 1
    assert results["no/such-model"].error.status == 404  # type: ignore[union-attr]
    assert results["fault/truncate"].error.code == "RemoteProtocolError"  # type: ignore[union-attr]


async def test_huge_event_stops_at_the_limit(upstream: RunningUpstream) -> None:
    results = await run_fanout(endpoint(upstream), [req("h", "fault/huge-event:2000000")],
                               max_event_size=100_000)
    result = results["h"]
    assert (result.outcome, bool(result.text)) == (Outcome.ERROR, True)
    assert result.error is not None and result.error.code == "event_too_large"


async def test_200_concurrent_streams_each_end_exactly_once(upstream: RunningUpstream) -> None:
    models = ["mock/fast", "mock/tools", "mock/reasoning", "fault/truncate", "fault/no-done",
              "fault/garbage", "fault/error-event", "fault/500-then-ok", "fault/stall:2",
              "mock/echo"]
    # Only the stall gets a short deadline: the others must complete however slow the
    # machine, so their outcomes do not hang on its speed.
    requests = [req(f"s{i:03d}", model, Deadlines(idle=1.0) if model == "fault/stall:2" else None,
                    seed=i, max_tokens=40)
                for i, model in ((i, models[i % len(models)]) for i in range(200))]
    per_stream: dict[str, list[Event]] = defaultdict(list)
    async with open_fanout(endpoint(upstream), requests, retry=FAST_RETRY,
                           max_concurrency=120) as fan:
        async for item in fan.events:
            per_stream[item.stream].append(item)
    assert set(per_stream) == {r.key for r in requests}
    for key, events in per_stream.items():
        assert sum(isinstance(e, StreamFinished) for e in events) == 1, key
        assert isinstance(events[-1], StreamFinished), key
        assert events[-1].result is fan.results[key]
    by_model: dict[str, set[Outcome]] = defaultdict(set)
    for request in requests:
        by_model[request.model].add(fan.results[request.key].outcome)
    assert by_model["mock/fast"] == {Outcome.COMPLETED}
    assert by_model["fault/truncate"] == {Outcome.TRUNCATED}
    assert by_model["fault/stall:2"] == {Outcome.TIMED_OUT}
    assert by_model["fault/500-then-ok"] == {Outcome.COMPLETED}


async def test_cancel_one_while_the_others_continue(upstream: RunningUpstream) -> None:
    requests = [req(k, "mock/slow", max_tokens=12) for k in ("a", "b", "c")]
    async with open_fanout(endpoint(upstream), requests) as fan:
        async for item in fan.events:
            if isinstance(item, TextDelta) and item.stream == "b":
                fan.cancel("b")
    assert fan.results["b"].outcome is Outcome.CANCELLED and fan.results["b"].text
    assert {fan.results[k].outcome for k in "ac"} == {Outcome.COMPLETED}


@pytest.mark.parametrize("seed", range(4))
async def test_cancelling_the_whole_fanout_keeps_partial_text(upstream: RunningUpstream,
                                                              seed: int) -> None:
    # Ctrl-C-style: the whole fan-out goes from outside, once every stream has sent text,
    # after a random number of further events (not after a time: a loaded machine is slow).
    rng = random.Random(seed)
    more = rng.randrange(20)
    long = {"x-fanout-tokens": "400"}  # mock/slow for seconds: none can finish first
    requests = [attrs.evolve(req(k, "mock/slow"), headers=long) for k in ("a", "b", "c")]
    with trio.CancelScope() as outside:
        async with open_fanout(endpoint(upstream), requests) as fan:
            texted: set[str] = set()
            async for item in fan.events:
                if isinstance(item, TextDelta):
                    texted.add(item.stream)
                if texted == {"a", "b", "c"}:
                    if more == 0:
                        outside.cancel()
                    more -= 1
    assert outside.cancelled_caught
    assert {r.outcome for r in fan.results.values()} == {Outcome.CANCELLED}
    assert all(r.text for r in fan.results.values())
    gc.collect()  # any unfinished async generator would warn now, and warnings are errors


async def test_the_key_is_checked_and_never_leaks(nursery: trio.Nursery,
                                                  watchdog: None) -> None:
    from fanout.upstream import serve_upstream

    upstream: RunningUpstream = await nursery.start(
        lambda task_status: serve_upstream(key="sk-good-key", task_status=task_status))
    wrong = Endpoint(upstream.base_url, "sk-wrong-key-123")
    right = Endpoint(upstream.base_url, "sk-good-key")
    events: list[Event] = []
    for ep in (wrong, right):
        async with open_fanout(ep, [req("k", "mock/fast")]) as fan:
            events += [e async for e in fan.events]
        if ep is wrong:
            assert fan.results["k"].outcome is Outcome.ERROR
            assert fan.results["k"].status == 401
        else:
            assert fan.results["k"].outcome is Outcome.COMPLETED
        text = repr(events) + repr(fan.results) + repr(ep)
        assert "sk-wrong-key-123" not in text and "sk-good-key" not in text


@pytest.mark.parametrize("fragment", ["byte", "evil", "random:5"])
async def test_fragmented_streams_parse_the_same(upstream: RunningUpstream,
                                                 fragment: str) -> None:
    requests = [req("whole", "mock/fast", seed=2, max_tokens=30),
                req("split", f"mock/fast@{fragment}", seed=2, max_tokens=30)]
    results = await run_fanout(endpoint(upstream), requests)
    assert results["split"].text == results["whole"].text != ""
    assert results["split"].outcome is Outcome.COMPLETED


async def wait_until_blocked(fan: Any, senders: int) -> None:
    """Until ``senders`` streams wait for room in the event channel (the consumer stopped)."""
    while fan.events._inner.statistics().tasks_waiting_send < senders:
        await trio.sleep(0.005)


@pytest.mark.parametrize("seed", range(6))
async def test_cancel_closes_the_connection_of_a_stream_blocked_on_its_consumer(
        seed: int, upstream: RunningUpstream) -> None:
    import random

    rng = random.Random(seed)
    buffer = rng.choice([0, 1, 4, 32])
    read_first = rng.randint(1, 40)  # events the consumer takes before it stops reading
    requests = [req("a", "fault/endless"), req("b", "fault/endless")]
    received: dict[str, list[Event]] = defaultdict(list)
    with trio.fail_after(10):
        async with open_fanout(endpoint(upstream), requests, buffer=buffer) as fan:
            events = fan.events
            for _ in range(read_first):
                event = await events.receive()
                received[event.stream].append(event)
            await wait_until_blocked(fan, 2)  # both streams wait on the consumer
            await upstream.stats.wait_for(lambda s: s.connections_open == 2)
            assert fan.cancel("a")
            # The connection closes now, while the consumer still reads nothing.
            await upstream.stats.wait_for(lambda s: s.connections_closed == 1)
            assert upstream.stats.connections_open == 1  # b's stays: only a was cancelled
            async for event in events:
                received[event.stream].append(event)
                if isinstance(event, StreamFinished) and event.stream == "a":
                    fan.cancel("b")
    finals = [e for e in received["a"] if isinstance(e, StreamFinished)]
    assert len(finals) == 1 and received["a"][-1] is finals[0]
    result = finals[0].result
    assert result.outcome is Outcome.CANCELLED and result.reason == "cancelled by the caller"
    # Nothing kept back: the deltas delivered are the result's text.
    assert "".join(e.text for e in received["a"] if isinstance(e, TextDelta)) == result.text
    assert [isinstance(e, StreamFinished) for e in received["b"]].count(True) == 1
