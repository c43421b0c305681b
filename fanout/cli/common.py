"""What the commands share: the endpoint (or the embedded upstream), number formats."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TextIO

import trio
from rich.console import Console

from ..request import Endpoint

__all__ = ["format_seconds", "interrupt_on_sigint", "only", "open_endpoint", "silence_stdout",
           "text_console"]


def text_console(file: TextIO, *, wide: bool = False) -> Console:
    """A console that never interprets what it prints (no markup, emoji or highlighting).

    ``wide``: off a terminal, 240 columns, so a summary table is never folded.
    """
    console = Console(file=file, highlight=False, emoji=False, markup=False)
    if wide and not console.is_terminal:
        console = Console(file=file, highlight=False, emoji=False, markup=False, width=240)
    return console


def silence_stdout() -> None:
    """The reader of stdout went away (``| head``): nothing more goes there, and no
    traceback either, now or when the interpreter flushes stdout at exit."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


async def interrupt_on_sigint(first: Callable[[], None]) -> None:
    """The first Ctrl-C calls ``first`` (cancel, keep what arrived); a second one
    raises KeyboardInterrupt: out at once."""
    with trio.open_signal_receiver(signal.SIGINT) as signals:
        interrupted = False
        async for _ in signals:
            if interrupted:
                raise KeyboardInterrupt
            interrupted = True
            first()


@asynccontextmanager
async def open_endpoint(endpoint: Endpoint | None) -> AsyncIterator[Endpoint]:
    """The configured endpoint, or (``None``) the embedded upstream, started in-process
    on a free loopback port for the length of the block."""
    if endpoint is not None:
        yield endpoint
        return
    from ..upstream import open_upstream  # only when the config asks for it

    async with open_upstream() as upstream:
        yield Endpoint(upstream.base_url)


def format_seconds(value: float | None) -> str:
    """``-``, ``850ms`` or ``2.41s``."""
    if value is None:
        return "-"
    return f"{value * 1000:.0f}ms" if value < 1 else f"{value:.2f}s"


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
