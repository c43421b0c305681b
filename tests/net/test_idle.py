"""The idle watcher: deadlines fire the moment they fall, however often events move them,
while trio's deadline heap sees a stream about once per idle window."""

from __future__ import annotations

import math
import random

import pytest
import trio
from trio.testing import MockClock

from fanout.net.idle import IdleWatch


class Stream:
    def __init__(self) -> None:
        self.idle_due = math.inf
        self.idle_entry: list[object] | None = None
        self.expired_at: float | None = None

    def idle_expired(self) -> None:
        self.expired_at = trio.current_time()


class CountingScope:
    """Counts the deadline moves of every cancel scope: each is a push on trio's heap."""

    moves = 0

    @classmethod
    def install(cls, monkeypatch: pytest.MonkeyPatch) -> None:
        setter = trio.CancelScope.deadline.fset  # type: ignore[attr-defined]

        def counted(scope: trio.CancelScope, value: float) -> None:
            cls.moves += 1
            setter(scope, value)

        monkeypatch.setattr(trio.CancelScope, "deadline",
                            trio.CancelScope.deadline.setter(counted))  # type: ignore[attr-defined]


@pytest.mark.parametrize("seed", range(5))
async def test_fires_when_it_falls_after_many_moves(autojump_clock: MockClock,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    seed: int) -> None:
    rng = random.Random(seed)
    idle = 10.0
    CountingScope.moves = 0
    CountingScope.install(monkeypatch)
    async with trio.open_nursery() as nursery:
        watch = IdleWatch(nursery)
        streams = [Stream() for _ in range(3)]
        for stream in streams:
            stream.idle_due = trio.current_time() + idle
            watch.arm(stream)
        last = dict.fromkeys(range(3), 0.0)
        for _ in range(300):  # events 0.1-2 s apart, on random streams
            await trio.sleep(rng.uniform(0.1, 2.0))
            index = rng.randrange(2)  # stream 2 never gets an event
            if streams[index].expired_at is not None:
                continue  # it fell silent for longer than idle once: its attempt is over
            last[index] = trio.current_time()
            streams[index].idle_due = last[index] + idle
        await trio.sleep(idle * 2)
    assert streams[2].expired_at == pytest.approx(idle)
    for index in (0, 1):
        assert streams[index].expired_at == pytest.approx(last[index] + idle)
    # ~300 events over ~300 s: the heap saw the streams once a window, not once an event.
    windows = trio.current_time() / idle
    assert CountingScope.moves <= 3 * windows + 3


async def test_a_paused_stream_is_forgotten_until_armed_again(autojump_clock: MockClock) -> None:
    async with trio.open_nursery() as nursery:
        watch = IdleWatch(nursery)
        stream = Stream()
        stream.idle_due = 5.0
        watch.arm(stream)
        await trio.sleep(1)
        stream.idle_due = math.inf  # a consumer that does not read
        await trio.sleep(100)
        assert stream.expired_at is None and stream.idle_entry is None
        stream.idle_due = trio.current_time() + 5
        watch.arm(stream)
    assert stream.expired_at == pytest.approx(106.0)


async def test_the_task_ends_when_nothing_is_armed(autojump_clock: MockClock) -> None:
    # The watcher lives in the fan-out's nursery: it must never hold it open.
    async with trio.open_nursery() as nursery:
        watch = IdleWatch(nursery)
        stream = Stream()
        stream.idle_due = 300.0
        watch.arm(stream)
        await trio.sleep(1)
        watch.disarm(stream)
    assert trio.current_time() == pytest.approx(1.0)
    assert stream.expired_at is None


async def test_a_streams_events_do_not_each_move_a_deadline(autojump_clock: MockClock,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    # 200 events 0.1 s apart under a 300 s idle deadline: the stream's deadlines move a
    # handful of times (request, first byte, idle armed), not once an event.
    from fanout import Deadlines, Outcome
    from tests.net.scripted import Script, stream
    from tests.net.test_stream import run, text_steps

    CountingScope.moves = 0
    CountingScope.install(monkeypatch)
    results, _ = await run(Script([stream(*text_steps(200, 0.1))]),
                           deadlines=Deadlines(idle=300.0))
    assert results["s"].outcome is Outcome.COMPLETED
    assert CountingScope.moves < 20


async def test_idle_fires_exactly_after_many_events(autojump_clock: MockClock) -> None:
    from fanout import Deadlines, Outcome
    from tests.net.scripted import Script, stream
    from tests.net.test_stream import run, text_steps

    steps = text_steps(50, 1.0, done=False)[:-1]  # 50 events a second apart, then silence
    steps.append((30.0, b"data: [DONE]\n\n"))
    results, _ = await run(Script([stream(*steps)]), deadlines=Deadlines(idle=5.0))
    result = results["s"]
    assert (result.outcome, result.timed_out) == (Outcome.TIMED_OUT, "idle")
    assert result.timings is not None and result.timings.end == pytest.approx(55.0)
