"""What a run of the library needs around it: the endpoint (or the embedded
upstream), signals, and trio's exception groups."""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import trio

from .request import Endpoint

__all__ = ["interrupt_on_signals", "only", "open_endpoint"]


async def interrupt_on_signals(first: Callable[[int], None],
                               signals: tuple[int, ...] = (signal.SIGINT,)) -> None:
    """The first of ``signals`` calls ``first(signum)`` (cancel, keep what arrived); a
    second one raises KeyboardInterrupt: out at once.

    A signal the process was started with ignored stays ignored (a job a shell started
    in the background, ``nohup``: a Ctrl-C meant for the shell is not for it)."""
    signals = tuple(s for s in signals if signal.getsignal(s) is not signal.SIG_IGN)
    if not signals:
        await trio.sleep_forever()
    with trio.open_signal_receiver(*signals) as received:
        interrupted = False
        async for signum in received:
            if interrupted:
                raise KeyboardInterrupt
            interrupted = True
            first(signum)


@asynccontextmanager
async def open_endpoint(endpoint: Endpoint | None) -> AsyncIterator[Endpoint]:
    """The configured endpoint, or (``None``) the embedded upstream, started in-process
    on a free loopback port for the length of the block."""
    if endpoint is not None:
        yield endpoint
        return
    from .upstream import open_upstream  # only when the config asks for it

    async with open_upstream() as upstream:
        yield Endpoint(upstream.base_url)


def only(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    """``exc`` (or the first leaf of the group) if it, or its whole group, is ``kind``:
    trio delivers KeyboardInterrupt and OSError wrapped in exception groups."""
    if isinstance(exc, BaseExceptionGroup):
        matched, rest = exc.split(kind)
        if rest is not None or matched is None:
            return None
        leaf: BaseException = matched
        while isinstance(leaf, BaseExceptionGroup):
            leaf = leaf.exceptions[0]
        return leaf
    return exc if isinstance(exc, kind) else None
