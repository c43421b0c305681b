"""What the commands share: the endpoint (or the embedded upstream), number formats."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable, Mapping
from typing import TextIO

from rich.console import Console

from .._runtime import interrupt_on_signals, only, open_endpoint
from ..config import DEFAULT_CONFIG, find_config
from ..net.stream import public_url

__all__ = ["environment_note", "format_seconds", "interrupt_on_sigint", "only",
           "open_endpoint", "silence_stdout", "text_console"]
# only and open_endpoint: fanout._runtime's, for the commands


def environment_note(config: str | None, environ: Mapping[str, str] | None = None
                     ) -> str | None:
    """The line that says ``OPENAI_BASE_URL`` took the place of the embedded upstream
    (no config file was chosen, so the packaged default gives way to it), else ``None``:
    the README's embedded quick start would otherwise turn into relay calls silently."""
    env = os.environ if environ is None else environ
    url = env.get("OPENAI_BASE_URL")
    if not url or find_config(config) != DEFAULT_CONFIG:
        return None
    return (f"using OPENAI_BASE_URL={public_url(url)} from the environment, not the embedded "
            "upstream (unset it to use the embedded upstream)")


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
    await interrupt_on_signals(lambda signum: first(), (signal.SIGINT,))


def format_seconds(value: float | None) -> str:
    """``-``, ``850ms`` or ``2.41s``."""
    if value is None:
        return "-"
    return f"{value * 1000:.0f}ms" if value < 1 else f"{value:.2f}s"
