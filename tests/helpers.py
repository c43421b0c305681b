"""Helpers shared by the tests: the ways one body can be cut into reads; Ctrl-C to a child."""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import pty
import random
import signal
import struct
import subprocess
import sys
import termios
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Protocol

from fanout import ServerSentEvent, SSEDecoder


def byte_at_a_time(body: bytes) -> list[bytes]:
    return [body[i : i + 1] for i in range(len(body))]


def split_at(body: bytes, offsets: Sequence[int]) -> list[bytes]:
    """Cut ``body`` at the given offsets (any order, duplicates allowed: empty reads)."""
    points = [0, *sorted(offsets), len(body)]
    return [body[a:b] for a, b in itertools.pairwise(points)]


def random_splits(body: bytes, seed: int, count: int = 20) -> Iterator[list[bytes]]:
    rng = random.Random(seed)
    for _ in range(count):
        cuts = rng.randint(0, min(len(body), 64))
        yield split_at(body, [rng.randint(0, len(body)) for _ in range(cuts)])


def every_split(body: bytes) -> Iterator[list[bytes]]:
    """The body whole, byte at a time, and cut in two at every offset."""
    yield [body]
    yield byte_at_a_time(body)
    for i in range(len(body) + 1):
        yield [body[:i], body[i:]]


def decode(chunks: Sequence[bytes], **kwargs: int) -> tuple[list[ServerSentEvent], SSEDecoder]:
    decoder = SSEDecoder(**kwargs)
    events: list[ServerSentEvent] = []
    for chunk in chunks:
        events.extend(decoder.feed(chunk))
    events.extend(decoder.close())
    return events, decoder


def chunk(*choices: dict[str, object], **fields: object) -> dict[str, object]:
    """A chat.completion.chunk with these choices and top-level fields."""
    return {"id": "c1", "object": "chat.completion.chunk", "choices": list(choices), **fields}


def delta(index: int = 0, finish_reason: str | None = None, **fields: object) -> dict[str, object]:
    """One ``choices[i]`` entry with a delta of these fields."""
    return {"index": index, "delta": fields, "finish_reason": finish_reason}


def sse_body(*frames: object, done: bool = True) -> bytes:
    """Serialize frames as ``data:`` events; str frames are sent verbatim."""
    import json

    parts = [f"data: {f if isinstance(f, str) else json.dumps(f)}\n\n" for f in frames]
    if done:
        parts.append("data: [DONE]\n\n")
    return "".join(parts).encode()


def on_pty(command: Sequence[str], rows: int, columns: int) -> tuple[int, str]:
    """Run ``command`` on a real pseudo-terminal of ``rows`` x ``columns`` (no COLUMNS or
    LINES to override it); its exit status and everything it wrote, decoded."""
    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    environ = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    process = subprocess.Popen(list(command), stdin=child, stdout=child, stderr=child,
                               env=environ, close_fds=True)
    os.close(child)
    chunks = []
    while True:
        try:
            data = os.read(main, 65536)
        except OSError:  # EIO: the child closed its side
            break
        if not data:
            break
        chunks.append(data)
    os.close(main)
    return process.wait(timeout=60), b"".join(chunks).decode("utf-8", "replace")


# ------------------------------------------------------------------ Ctrl-C to a child

def sigint_default() -> None:
    """``preexec_fn`` of every child a test sends SIGINT: its default action, as a
    terminal's foreground job has it, so the child's Python installs its own
    ``KeyboardInterrupt`` handler.

    A shell that starts a job in the background without job control (``nohup make test
    &``, a script, many CI runners) sets SIGINT to be ignored, and every process started
    from it inherits that across exec: Python then installs no handler, and neither does
    ``fanout``'s entry point, which leaves an ignored SIGINT ignored as a background job's
    should be.  Runs in the child between fork and exec."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class _Child(Protocol):
    @property
    def pid(self) -> int: ...

    def send_signal(self, sig: int) -> None: ...


def ignores(pid: int, sig: int = signal.SIGINT) -> bool:
    """Whether process ``pid`` ignores ``sig`` (its ``SigIgn`` mask in /proc); False once
    it is gone, or where there is no /proc."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return False


def interrupt(process: _Child, sig: int = signal.SIGINT) -> None:
    """Ctrl-C (or ``sig``): the signal to ``process``, which must not ignore it.  A child
    started without ``preexec_fn=sigint_default`` from a suite run in the background
    would never see a SIGINT: this fails at once, saying so, instead of the test waiting
    for an exit that never comes."""
    assert not ignores(process.pid, sig), (
        f"process {process.pid} ignores signal {sig} (inherited SIG_IGN: the suite runs in "
        "the background); start it with preexec_fn=sigint_default")
    process.send_signal(sig)


@contextlib.contextmanager
def fanout_mock(*options: str) -> Iterator[str]:
    """``fanout mock OPTIONS`` as a process of its own: its base URL (ending in /v1),
    for the block; killed after it."""
    process = subprocess.Popen([sys.executable, "-m", "fanout.cli.main", "mock", *options],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert process.stdout is not None
        yield process.stdout.readline().strip()
    finally:
        process.kill()
        process.communicate(timeout=10)


#: A batch whose answers are judged by a judge that answers and one that never does
#: (Ctrl-C while judging): ``.format(base_url=...)``.
JUDGING_CONFIG = """
[endpoint]
base_url = "{base_url}"

[deadlines]
total = 120

[[models]]
name = "echo"
id = "mock/echo"

[[models]]
name = "judge"
id = "mock/judge"

[[models]]
name = "stuck"
id = "fault/no-response"

[[scorers]]
name = "judged"
kind = "judge"
model = "judge"
concurrency = 1

[[scorers]]
name = "stuck-judged"
kind = "judge"
model = "stuck"
concurrency = 1
"""
