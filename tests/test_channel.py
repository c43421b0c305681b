"""EventChannel: a cancel point on every receive, a schedule point when it must wait."""

from __future__ import annotations

import pytest
import trio
from trio.testing import MockClock

from fanout._channel import EventChannel


async def test_order_and_end_of_channel() -> None:
    send, receive = trio.open_memory_channel[int](10)
    channel = EventChannel(receive)
    async with send:
        for i in range(5):
            send.send_nowait(i)
    assert [i async for i in channel] == [0, 1, 2, 3, 4]


async def test_every_receive_is_a_cancel_point_even_when_ready() -> None:
    send, receive = trio.open_memory_channel[int](10)
    channel = EventChannel(receive)
    send.send_nowait(1)
    with trio.CancelScope() as scope:
        scope.cancel()
        await channel.receive()
    assert scope.cancelled_caught
    assert channel.receive_nowait() == 1  # nothing was lost to the cancellation


async def test_it_yields_at_least_every_n_receives() -> None:
    send, receive = trio.open_memory_channel[int](100)
    channel = EventChannel(receive, schedule_every=10)
    for i in range(100):
        send.send_nowait(i)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticker)
        await trio.lowlevel.checkpoint()
        before = ticks
        for _ in range(100):
            await channel.receive()
        # 9 schedule points for 100 receives; trio shuffles the tasks of a batch, so the
        # ticker's first or last turn may fall outside: 8 to 11, never ~0 nor ~100.
        assert 8 <= ticks - before <= 11
        nursery.cancel_scope.cancel()


async def test_waiting_receive_sleeps_until_a_send(autojump_clock: MockClock) -> None:
    send, receive = trio.open_memory_channel[str](0)
    channel = EventChannel(receive)

    async def later() -> None:
        await trio.sleep(3)
        await send.send("x")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(later)
        assert await channel.receive() == "x"
        assert trio.current_time() == pytest.approx(3)


async def test_close_breaks_the_senders() -> None:
    send, receive = trio.open_memory_channel[int](1)
    channel = EventChannel(receive)
    channel.close()
    with pytest.raises(trio.BrokenResourceError):
        send.send_nowait(1)
    with pytest.raises(ValueError, match="schedule_every"):
        EventChannel(receive, schedule_every=0)
