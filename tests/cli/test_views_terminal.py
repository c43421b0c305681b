"""`fanout compare` on a real pseudo-terminal, read back through a small terminal emulator.

The child runs on a pty of the given size; every byte it writes is read from the
leader and replayed through ``Terminal``: cursor moves, erases, autowrap and
scrolling into scrollback, as a VT100-style terminal does them, with each
character as wide as a terminal draws it (``wcwidth``: spacing vowel signs take
a cell, a variation selector none; or, ``emoji=True``, a VS16 emoji takes two,
as terminals with emoji presentation draw it).  What is left in the scrollback
and on the screen at the end is what a user scrolls back through.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import unicodedata
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

COMMAND = [sys.executable, "-m", "fanout.cli.main"]
ROOT = Path(__file__).resolve().parents[2]
DEMO = ["compare", "Tell me about rivers, in a few sentences.", "--config",
        str(ROOT / "config" / "default.toml")]
_CSI = re.compile(r"\x1b\[([0-?]*)([ -/]*)([@-~])")
_OTHER_ESCAPE = re.compile(r"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[PX^_][^\x1b]*\x1b\\|\x1b[ -/]*[0-~]")


def wcwidth(character: str) -> int:
    """How wide a wcwidth terminal (glibc, xterm, tmux) draws ``character``."""
    code = ord(character)
    if code < 0x20 or 0x7F <= code < 0xA0:
        return 0
    if unicodedata.category(character) in ("Mn", "Me", "Cf") or 0x1160 <= code <= 0x11FF:
        return 0 if code != 0xAD else 1
    return 2 if unicodedata.east_asian_width(character) in ("W", "F") else 1


class Terminal:
    """A VT100-style screen of ``width`` x ``height`` cells with unbounded scrollback."""

    def __init__(self, width: int, height: int, *, emoji: bool = False) -> None:
        self.width, self.height, self.emoji = width, height, emoji
        self.screen = [[" "] * width for _ in range(height)]
        self.scrollback: list[list[str]] = []
        self.x = self.y = 0
        self.pending = False  # the last column was written: the next character wraps
        self.wrapped = 0  # lines the terminal wrapped on its own (autowrap)

    def feed(self, data: str) -> None:
        position = 0
        while position < len(data):
            character = data[position]
            if character == "\x1b":
                match = _CSI.match(data, position)
                if match:
                    self._csi(match.group(1), match.group(3))
                    position = match.end()
                    continue
                match = _OTHER_ESCAPE.match(data, position)
                position = match.end() if match else position + 1
                continue
            position += 1
            if character == "\r":
                self.x, self.pending = 0, False
            elif character == "\n":
                self._line_feed()
            elif character == "\b":
                self.x, self.pending = max(0, self.x - 1), False
            elif character == "\t":
                self.x = min(self.width - 1, (self.x // 8 + 1) * 8)
            elif ord(character) >= 0x20:
                self._draw(character)

    def _line_feed(self) -> None:
        self.pending = False
        if self.y == self.height - 1:
            self.scrollback.append(self.screen.pop(0))
            self.screen.append([" "] * self.width)
        else:
            self.y += 1

    def _draw(self, character: str) -> None:
        width = wcwidth(character)
        if self.emoji and character == "\ufe0f" and self.x > 0 and not self.pending:
            previous = self.screen[self.y][self.x - 1]
            if previous and wcwidth(previous[0]) == 1 and unicodedata.category(
                    previous[0]) == "So":
                width = 1  # the emoji takes a second cell
        if width == 0:
            x = self.x - 1 if not self.pending else self.x
            self.screen[self.y][max(x, 0)] += character
            return
        if self.pending or (width == 2 and self.x == self.width - 1):
            self.x, self.pending = 0, False
            self.wrapped += 1
            self._line_feed()
        row = self.screen[self.y]
        row[self.x] = character
        if width == 2:
            row[self.x + 1] = ""
        self.x += width
        if self.x >= self.width:
            self.x, self.pending = self.width - 1, True

    def _csi(self, parameters: str, final: str) -> None:
        if parameters.startswith("?"):
            return  # modes: cursor visibility, bracketed paste, ...
        numbers = [int(p) if p else 0 for p in parameters.split(";")] if parameters else []
        n = numbers[0] if numbers else 0
        self.pending = False if final in "ABCDGHfJK" else self.pending
        if final == "A":
            self.y = max(0, self.y - max(n, 1))
        elif final == "B":
            self.y = min(self.height - 1, self.y + max(n, 1))
        elif final == "C":
            self.x = min(self.width - 1, self.x + max(n, 1))
        elif final == "D":
            self.x = max(0, self.x - max(n, 1))
        elif final == "G":
            self.x = min(self.width - 1, max(n, 1) - 1)
        elif final in "Hf":
            row = numbers[0] if numbers else 1
            column = numbers[1] if len(numbers) > 1 else 1
            self.y, self.x = min(self.height, max(row, 1)) - 1, min(self.width, max(column, 1)) - 1
        elif final == "K":
            row = self.screen[self.y]
            start, end = {0: (self.x, self.width), 1: (0, self.x + 1), 2: (0, self.width)}.get(
                n, (0, 0))
            row[start:end] = [" "] * (end - start)
        elif final == "J":
            if n in (2, 3):
                self.screen = [[" "] * self.width for _ in range(self.height)]
            elif n == 0:
                self.screen[self.y][self.x:] = [" "] * (self.width - self.x)
                for y in range(self.y + 1, self.height):
                    self.screen[y] = [" "] * self.width

    def lines(self) -> list[str]:
        """Scrollback and screen, top to bottom, trailing blank rows and spaces dropped."""
        rows = ["".join(row).rstrip() for row in [*self.scrollback, *self.screen]]
        while rows and not rows[-1]:
            rows.pop()
        return rows

    def screen_lines(self) -> list[str]:
        return ["".join(row).rstrip() for row in self.screen]


def run_on_terminal(args: Sequence[str], width: int, height: int, *, seconds: float = 60,
                    until: Callable[[bytes, int | None], bool] | None = None,
                    send: Callable[[bytes, int], bytes | None] | None = None,
                    env: dict[str, str] | None = None) -> tuple[bytes, int | None]:
    """Run ``fanout ARGS`` on a pseudo-terminal of ``width`` x ``height`` until it exits
    (or ``until(output, status)``); ``send(output, fd)`` may type at it.  Returns every
    byte the terminal received and the exit status."""
    import fcntl
    import pty
    import select
    import struct
    import termios
    import time

    def controlling_terminal() -> None:  # in the child: the pty becomes its terminal
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", height, width, 0, 0))
    os.set_blocking(leader, False)
    environ = {key: value for key, value in os.environ.items()
               if key not in ("COLUMNS", "LINES")}  # the pty's own size
    process = subprocess.Popen(
        [*COMMAND, *args], stdin=follower, stdout=follower, stderr=follower, cwd=ROOT,
        preexec_fn=controlling_terminal,
        env={**environ, "TERM": "xterm-256color", **(env or {})})
    os.close(follower)
    output = b""
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            status = process.poll()
            if until is not None and until(output, status):
                break
            if send is not None:
                typed = send(output, leader)
                if typed:
                    os.write(leader, typed)
            # Keep reading: a full terminal buffer would block the child.
            if select.select([leader], [], [], 0.05)[0]:
                try:
                    output += os.read(leader, 65536)
                except OSError:  # the child closed the terminal: it is done
                    process.wait(timeout=seconds)
                    break
            elif status is not None:
                break
    finally:
        process.kill()
        process.wait()
        os.close(leader)
    return output, process.returncode


def replay(output: bytes, width: int, height: int, *, emoji: bool = False) -> Terminal:
    terminal = Terminal(width, height, emoji=emoji)
    terminal.feed(output.decode("utf-8", "replace"))
    return terminal


def box_tops(lines: Sequence[str]) -> list[int]:
    return [i for i, line in enumerate(lines) if line.startswith("╭")]


def assert_whole_boxes(lines: Sequence[str], width: int) -> None:
    """Every box top has its bottom before the next top, and no line is wider than the
    terminal: no frame of the live view was left behind."""
    open_box = None
    for i, line in enumerate(lines):
        if line.startswith("╭"):
            assert open_box is None, f"line {i}: a box top inside the box of line {open_box}"
            open_box = i
        elif line.startswith("╰"):
            assert open_box is not None, f"line {i}: a box bottom without its top"
            open_box = None
    assert open_box is None


# ------------------------------------------------------------------- the demo, at sizes

DEMO_SIZES = [(160, 48), (100, 40), (80, 24), (60, 20)]


@pytest.mark.parametrize(("width", "height"), DEMO_SIZES)
def test_the_demo_leaves_no_stray_line_in_scrollback(width: int, height: int) -> None:
    output, status = run_on_terminal(DEMO, width, height)
    assert status == 0, output.decode(errors="replace")[-2000:]
    for emoji in (False, True):  # a wcwidth terminal, and one that draws VS16 emoji wide
        terminal = replay(output, width, height, emoji=emoji)
        lines = terminal.lines()
        assert_whole_boxes(lines, width)
        tops = box_tops(lines)
        # The final screen: one row of boxes at 160 columns, two below that; nothing else.
        assert len(tops) == (1 if width >= 4 * 28 else 2), (emoji, len(tops))
        assert terminal.wrapped == 0, "a line was wider than the terminal"
        tables = sum(line.startswith(" model ") for line in lines)  # the summary's
        assert tables in (1, 2)
        for name in ("writer", "thinker", "tools", "smollm2"):
            assert sum(line.startswith(f" {name} ") for line in lines) == tables


def frames(output: bytes, width: int, height: int) -> list[list[str]]:
    """The screen after each live frame (each ends with the footer)."""
    terminal = Terminal(width, height)
    text = output.decode("utf-8", "replace")
    shown = []
    position = 0
    while (end := text.find("Ctrl-C stops all", position)) >= 0:
        end += len("Ctrl-C stops all")
        terminal.feed(text[position:end])
        shown.append(terminal.screen_lines())
        position = end
    return shown


@pytest.mark.parametrize(("width", "height"), [(40, 15), (60, 20), (40, 12)])
def test_every_stream_stays_visible_on_a_small_terminal(width: int, height: int) -> None:
    output, status = run_on_terminal(DEMO, width, height)
    assert status == 0
    seen = frames(output, width, height)
    streaming = [screen for screen in seen if any("streaming" in line for line in screen)]
    assert len(streaming) > 5
    for screen in seen:
        # The compact layout: a line per model, its status first, then its numbers.
        for name in ("writer", "thinker", "tools", "smollm2"):
            line = next((line for line in screen if line.startswith(name + " ")), None)
            assert line is not None, (name, screen)
            assert any(status in line for status in ("connecting", "waiting", "streaming",
                                                      "done", "queued")), line
        footer = [i for i, line in enumerate(screen) if "Ctrl-C stops all" in line]
        assert len(footer) == 1 and footer[0] <= height - 2  # a free line under the frame
    middle = streaming[len(streaming) // 2]
    assert any("tok/s" in line and "ms" in line for line in middle)  # TTFT, tok/s
    final = replay(output, width, height)
    assert final.wrapped == 0
    assert_whole_boxes(final.lines(), width)


def test_the_layout_is_boxes_when_they_fit_and_compact_when_not() -> None:
    from fanout.cli.render import Column, CompareView
    view = CompareView([Column(f"m{i}", "m", started=0.0) for i in range(4)])
    assert view.layout(160, 47) == "boxes" and view.layout(80, 23) == "boxes"
    assert view.layout(60, 19) == "compact" and view.layout(40, 14) == "compact"
    assert view.layout(27, 40) == "compact"
