"""The server keeps pauses against a schedule: a stall is caught up, not added on."""

from __future__ import annotations

import h11
import trio
from trio.testing import MockClock

from fanout.upstream.models import Context
from fanout.upstream.plans import Pause, Plan, Send
from fanout.upstream.server import _Upstream


class SlowStream:
    """Records writes; the first body write stalls (a client that stopped reading)."""

    def __init__(self, stall: float) -> None:
        self.stall = stall
        self.writes: list[tuple[float, bytes]] = []

    async def send_all(self, data: bytes) -> None:
        if len(self.writes) == 1:
            await trio.sleep(self.stall)
        self.writes.append((trio.current_time(), data))

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await trio.sleep_forever()  # the client never closes; the server watches while it waits


def responding_connection() -> h11.Connection:
    connection = h11.Connection(h11.SERVER)
    connection.receive_data(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                            b"Content-Length: 0\r\n\r\n")
    assert isinstance(connection.next_event(), h11.Request)
    assert isinstance(connection.next_event(), h11.EndOfMessage)
    return connection


async def respond(fragment: str, stall: float) -> SlowStream:
    steps = [Send(b"data: 0\n\n")]
    for i in range(1, 6):
        steps += [Pause(1.0), Send(b"data: %d\n\n" % i)]
    stream = SlowStream(stall)
    upstream = _Upstream(None, fragment, Context())
    await upstream._respond(responding_connection(), stream, Plan(200, steps=steps))  # type: ignore[arg-type]
    return stream


async def test_on_schedule_one_write_per_event(autojump_clock: MockClock) -> None:
    start = trio.current_time()
    stream = await respond("auto", stall=0)
    body_writes = stream.writes[1:]  # less the headers; the last carries the end of the body
    assert len(body_writes) == 6
    assert body_writes[-1][1].endswith(b"0\r\n\r\n")
    assert [round(t - start) for t, _ in body_writes] == [0, 1, 2, 3, 4, 5]


async def test_a_stall_is_caught_up_and_coalesced(autojump_clock: MockClock) -> None:
    start = trio.current_time()
    stream = await respond("auto", stall=3.5)
    times = [round(t - start, 1) for t, _ in stream.writes]
    assert times[-1] == 5.0  # not 3.5 + 5 pauses: the schedule absorbed the stall
    late = [data for t, data in stream.writes if round(t - start, 1) == 3.5]
    assert b"data: 1" in b"".join(late) and b"data: 3" in b"".join(late)  # one coalesced write


async def test_event_mode_catches_up_without_coalescing(autojump_clock: MockClock) -> None:
    start = trio.current_time()
    stream = await respond("event", stall=3.5)
    assert round(stream.writes[-1][0] - start, 1) == 5.0
    assert len(stream.writes) == 1 + 6 + 1  # headers, one write per event, the end
