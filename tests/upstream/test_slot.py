"""slot/*: llama.cpp's one slot, where a new request cuts the stream that holds it."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
import trio
from trio.testing import MockClock

from fanout.upstream import RunningUpstream
from fanout.upstream.catalog import plan_chat
from fanout.upstream.models import Context, Slot
from fanout.upstream.plans import Abort, Send, parse_chat_request
from fanout.upstream.server import WATCH_PAUSES
from tests.upstream.virtual import virtual_upstream
from tests.upstream.wire import RawConnection, payloads

END = b"\r\n0\r\n\r\n"  # the zero-length chunk that ends a chunked body
DONE = b"data: [DONE]\n\n"
LONG = {"x-fanout-tokens": "400"}  # 400 chunks: a stream that cannot end by itself in a test


def contents(body: bytes) -> list[str]:
    return [c["delta"]["content"] for p in payloads(body) for c in p.get("choices", [])
            if c["delta"].get("content")]


def finishes(body: bytes) -> list[Any]:
    return [c.get("finish_reason") for p in payloads(body) for c in p.get("choices", [])
            if c.get("finish_reason")]


async def cut_one(upstream: RunningUpstream, first: str, second: str = "slot/clean:0",
                  **body: Any) -> tuple[RawConnection, RawConnection]:
    """``first`` streams until it has sent 3 content chunks; then ``second`` takes the slot."""
    a = await RawConnection.start(upstream, first, headers=LONG)
    await a.read_until(b'"content":"', count=4)  # the role chunk's "" and 3 content chunks
    b = await RawConnection.start(upstream, second, max_tokens=5, **body)
    await b.read_until(END)
    await a.read_until(END)  # or EOF
    return a, b


async def test_clean_cut_sends_done_without_finish_and_ends_the_body(
        upstream: RunningUpstream) -> None:
    with trio.fail_after(5):
        a, b = await cut_one(upstream, "slot/clean:0.02",
                             stream_options={"include_usage": True})
    cut = a.body
    assert cut.complete and not a.closed  # a clean end of the body; the connection lives on
    assert cut.chunks[-1] == DONE and finishes(cut.body) == []
    assert len(contents(cut.body)) >= 3
    assert not any(p.get("usage") for p in payloads(cut.body))
    whole = b.body
    assert whole.complete and whole.body.endswith(DONE)
    events = payloads(whole.body)
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert (finishes(whole.body), len(contents(whole.body))) == (["length"], 5)
    assert events[-1]["usage"]["completion_tokens"] == len(contents(whole.body))
    assert upstream.context.slot.cuts == 1 and upstream.context.slot.holder is None
    await a.aclose()
    await b.aclose()


async def test_broken_cut_sends_done_then_breaks_the_chunked_framing(
        upstream: RunningUpstream) -> None:
    with trio.fail_after(5):
        a, b = await cut_one(upstream, "slot/broken:0.02")
    cut = a.body
    assert a.closed and not cut.complete
    assert cut.chunks[-1] == DONE and finishes(cut.body) == []
    size, _, partial = cut.rest.partition(b"\r\n")
    assert int(size, 16) == 2 * len(partial) and partial.startswith(b"data: {")
    assert b.body.complete and b.body.body.endswith(DONE)
    await a.aclose()
    await b.aclose()


async def test_relay_cut_becomes_a_stop_then_done(upstream: RunningUpstream) -> None:
    with trio.fail_after(5):
        a, b = await cut_one(upstream, "slot/relay:0.02")
    cut = a.body
    assert cut.complete and cut.body.endswith(DONE)
    last = payloads(cut.body)[-1]["choices"]
    assert last == [{"index": 0, "delta": {}, "finish_reason": "stop"}]
    assert finishes(cut.body) == ["stop"] and len(contents(cut.body)) >= 3
    await a.aclose()
    await b.aclose()


async def test_relay_cut_before_any_content_looks_like_an_empty_answer(
        upstream: RunningUpstream) -> None:
    with trio.fail_after(5):
        a = await RawConnection.start(upstream, "slot/relay:0.3")  # the role chunk, then 0.3 s
        await a.read_until(b'"role":"assistant"')
        b = await RawConnection.start(upstream, "slot/clean:0", max_tokens=2)
        await b.read_until(END)
        await a.read_until(END)
    assert contents(a.body.body) == [] and finishes(a.body.body) == ["stop"]
    assert a.body.body.endswith(DONE)
    await a.aclose()
    await b.aclose()


@pytest.mark.parametrize("seed", range(5))
async def test_the_cut_is_prompt(autojump_clock: MockClock, seed: int) -> None:
    rng = random.Random(seed)
    async with virtual_upstream() as upstream:
        a = upstream.connect("slot/clean:0.05", headers=LONG)
        chunks = 2 + rng.randrange(5)  # the role chunk's "" and 1 to 5 content chunks
        await a.wait_for(lambda c: c.data.count(b'"content":"') >= chunks)
        await trio.sleep(rng.uniform(0.001, 0.049))  # some moment between two of a's chunks
        cut_at = a.now
        b = upstream.connect("slot/clean:0", max_tokens=2)
        await a.wait_for(lambda c: c.body.complete)
        await b.wait_for(lambda c: c.body.complete)
    last_before = max(at for at, _ in a.writes if at < cut_at)
    after = [(at, data) for at, data in a.writes if at > cut_at]
    assert len(after) == 1  # nothing more of the answer: the cut, at a's next chunk
    assert after[0][0] == pytest.approx(last_before + 0.05)
    assert DONE in after[0][1] and after[0][1].endswith(END) and not contents(after[0][1])
    assert upstream.context.slot.cuts == 1


async def test_the_model_of_the_cut_stream_decides_how_it_ends(
        upstream: RunningUpstream) -> None:
    with trio.fail_after(5):
        a, b = await cut_one(upstream, "slot/clean:0.02", second="slot/relay:0")
    assert a.body.complete and finishes(a.body.body) == []  # clean, though cut by slot/relay
    assert finishes(b.body.body) == ["length"]
    await a.aclose()
    await b.aclose()


async def test_finished_stream_gives_the_slot_back(upstream: RunningUpstream) -> None:
    with trio.fail_after(5):
        for _ in range(2):  # one after the other: nothing is cut
            a = await RawConnection.start(upstream, "slot/broken:0", max_tokens=4)
            await a.read_until(END)
            assert a.body.complete and finishes(a.body.body) == ["length"]
            await a.aclose()
    assert upstream.context.slot.cuts == 0 and upstream.context.slot.holder is None
    assert upstream.context.slot.issued == 2


@pytest.mark.parametrize("cadence", [0.02, 1000])
async def test_a_client_that_leaves_gives_the_slot_back(upstream: RunningUpstream,
                                                       cadence: float) -> None:
    with trio.fail_after(10):  # a hang guard: when it is noticed is checked virtually below
        a = await RawConnection.start(upstream, f"slot/clean:{cadence}", headers=LONG)
        await a.read_until(b'"role":"assistant"')
        assert upstream.context.slot.holds(1)
        await a.aclose()  # a long pause is watched: noticed at once, not in 1,000 s
        await upstream.stats.wait_for(lambda s: s.connections_closed == 1)
    assert upstream.context.slot.holder is None and upstream.context.slot.cuts == 0


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize(("cadence", "watched"), [(0.02, False), (0.5, True)])
async def test_a_client_that_leaves_is_noticed_at_once_or_at_the_next_chunk(
        autojump_clock: MockClock, cadence: float, watched: bool, seed: int) -> None:
    rng = random.Random(seed)
    async with virtual_upstream() as upstream:
        a = upstream.connect(f"slot/clean:{cadence}", headers=LONG)
        chunks = 1 + rng.randrange(4)
        await a.wait_for(lambda c: c.data.count(b'"content":"') >= chunks)
        await trio.sleep(rng.uniform(0.001, cadence - 0.001))
        assert upstream.context.slot.holds(1)
        left_at = a.now
        a.leave()
        await upstream.stats.wait_for(lambda s: s.connections_closed == 1)
        last_write = max(at for at, _ in a.writes)
    assert a.closed_at is not None
    assert watched is (cadence >= WATCH_PAUSES)
    if watched:  # a pause this long watches the socket: at once
        assert a.closed_at == pytest.approx(left_at)
    else:  # a short pause just sleeps: the next write fails
        assert a.closed_at == pytest.approx(last_write + cadence)
    assert upstream.context.slot.holder is None and upstream.context.slot.cuts == 0


# ---------------------------------------------------------------- without sockets

def request(model: str, **body: Any) -> Any:
    payload = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": True,
               "max_tokens": 6, **body}
    return parse_chat_request(json.dumps(payload).encode(), {})


def drain(steps: Any) -> list[Any]:
    return list(steps)


@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_batch_at_concurrency_1_completes_at_4_is_mostly_cut(concurrency: int) -> None:
    context = Context()
    outcomes = []
    for _ in range(8 // concurrency):
        plans = [plan_chat(request("slot/clean"), context) for _ in range(concurrency)]
        for plan in plans:  # the last to arrive holds the slot; the others see they lost it
            body = b"".join(s.data for s in drain(plan.steps) if isinstance(s, Send))
            outcomes.append("cut" if finishes(body) == [] else "complete")
    if concurrency == 1:
        assert outcomes == ["complete"] * 8
    else:
        assert outcomes == ["cut", "cut", "cut", "complete"] * 2
    assert context.slot.holder is None


def test_a_stream_never_started_gives_the_slot_back() -> None:
    context = Context()
    plan = plan_chat(request("slot/relay"), context)
    assert context.slot.holds(1)
    plan.steps.close()  # type: ignore[union-attr]  # the server closes every plan's steps
    assert context.slot.holder is None


def test_broken_ends_in_an_abort_with_a_partial_chunk() -> None:
    context = Context()
    first = plan_chat(request("slot/broken"), context)
    plan_chat(request("slot/clean", stream=False), context)  # a non-streamed request cuts too
    steps = drain(first.steps)
    assert steps[-2] == Send(DONE) and isinstance(steps[-1], Abort)
    assert steps[-1].partial_chunk and context.slot.holder is None


def test_slot_tickets() -> None:
    slot = Slot()
    one = slot.take()
    two = slot.take()
    assert not slot.holds(one) and slot.holds(two)
    slot.release(one)  # a cut stream cannot free the slot its successor holds
    assert slot.holds(two)
    slot.release(two)
    assert slot.holder is None and slot.issued == 2
