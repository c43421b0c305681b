"""The batch summary, `fanout report` and the progress bar fit the terminal: at 160, 120
and 80 columns every number is whole (and at 60 and 40 too, in blocks), on rich's recorder,
with COLUMNS, and on a real pseudo-terminal.  Each model's top failure reasons, with the HTTP
status of errors; `-` for tokens no server reported."""

from __future__ import annotations

import fcntl
import io
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from rich.cells import cell_len
from rich.console import Console

from fanout.cli.batch import BatchOptions, run_batch
from fanout.cli.report import model_summary, report, summary_view
from fanout.records import dumps_bytes
from fanout.store.results import RecordReader

COMMAND = [sys.executable, "-m", "fanout.cli.main"]


# ------------------------------------------------------- a pty, and a screen for it

_CSI = re.compile(r"\x1b\[([0-9;?]*)([@-~])")
_OTHER_ESCAPE = re.compile(r"\x1b(?:\][^\x07\x1b]*(?:\x07|\x1b\\)|[()][0-9A-Za-z]|[=>78]|.)")


def run_on_pty(command: Sequence[str], *, columns: int, rows: int = 24,
               env: dict[str, str] | None = None, cwd: str | None = None,
               timeout: float = 60) -> tuple[int, str]:
    """Run ``command`` on a new pty of ``columns`` x ``rows``: (exit status, output).

    ``COLUMNS`` and ``LINES`` are removed from the environment, so the program has
    only the terminal to ask for its size."""
    environment = {k: v for k, v in (env if env is not None else os.environ).items()
                   if k not in ("COLUMNS", "LINES")}
    environment.setdefault("TERM", "xterm-256color")
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    process = subprocess.Popen(list(command), stdin=follower, stdout=follower,
                               stderr=follower, env=environment, cwd=cwd, close_fds=True,
                               start_new_session=True)
    os.close(follower)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.1)
            if ready:
                try:
                    data = os.read(leader, 65536)
                except OSError:  # EIO: the other side is closed
                    break
                if not data:
                    break
                chunks.append(data)
            elif process.poll() is not None:
                # Drain what is left, then stop.
                continue
        status = process.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if process.poll() is None:
            process.kill()
        os.close(leader)
    return status, b"".join(chunks).decode("utf-8", "replace")


class Screen:
    """What a terminal of ``columns`` shows after ``feed``; ``overflowed`` counts the
    lines whose text ran past the right margin (the terminal wrapped them)."""

    def __init__(self, columns: int) -> None:
        self.columns = columns
        self.lines: list[list[str]] = [[]]
        self.row = 0
        self.col = 0
        self.overflowed = 0
        self.wrapped: list[int] = []  # rows whose text ran past the margin

    def feed(self, text: str) -> Screen:
        i = 0
        while i < len(text):
            char = text[i]
            if char == "\x1b":
                match = _CSI.match(text, i)
                if match:
                    self._csi(match.group(1), match.group(2))
                    i = match.end()
                    continue
                other = _OTHER_ESCAPE.match(text, i)
                i = other.end() if other else i + 1
                continue
            if char == "\r":
                self.col = 0
            elif char == "\n":
                self._down()
            elif char == "\b":
                self.col = max(0, self.col - 1)
            elif char >= " " or char == "\t":
                self._put(char)
            i += 1
        return self

    def _down(self) -> None:
        self.row += 1
        while len(self.lines) <= self.row:
            self.lines.append([])

    def _put(self, char: str) -> None:
        width = max(1, cell_len(char))
        if self.col + width > self.columns:  # autowrap: a stray line
            self.overflowed += 1
            self.wrapped.append(self.row)
            self._down()
            self.col = 0
        line = self.lines[self.row]
        while len(line) < self.col + width:
            line.append(" ")
        line[self.col] = char
        for extra in range(1, width):
            line[self.col + extra] = ""
        self.col += width

    def _csi(self, params: str, final: str) -> None:
        numbers = [int(p) for p in params.lstrip("?").split(";") if p.isdigit()]
        n = numbers[0] if numbers else 1
        if final == "A":
            self.row = max(0, self.row - n)
        elif final == "B":
            for _ in range(n):
                self._down()
        elif final == "C":
            self.col = min(self.columns - 1, self.col + n)
        elif final == "D":
            self.col = max(0, self.col - n)
        elif final == "G":
            self.col = max(0, n - 1)
        elif final == "K":
            line = self.lines[self.row]
            mode = numbers[0] if numbers else 0
            if mode == 2:
                line.clear()
            elif mode == 0:
                del line[self.col:]
            else:
                for index in range(min(self.col + 1, len(line))):
                    line[index] = " "
        elif final == "J":
            mode = numbers[0] if numbers else 0
            if mode in (2, 3):
                self.lines = [[] for _ in self.lines]
            elif mode == 0:
                del self.lines[self.row][self.col:]
                for line in self.lines[self.row + 1:]:
                    line.clear()

    def text(self) -> list[str]:
        """Every line of the screen and scrollback, trailing spaces removed."""
        return ["".join(line).rstrip() for line in self.lines]

    def widest(self) -> int:
        return max((cell_len(line) for line in self.text()), default=0)


# ------------------------------------------------------------- a results file to show

MODELS = ("gpt-4o-mini", "claude-sonnet", "llama-3.1-70b")


def _results(path: Path, runs: int = 1000) -> Path:
    """Big numbers: 1000 runs a model, 987 completed, 1,234,000 tokens in, TTFT 12.50s,
    1234 tok/s, 1000 429s that cost 1500.0s; 8 errors and 5 truncations."""
    with path.open("wb") as file:
        for model in MODELS:
            for i in range(runs):
                outcome = "completed" if i < 987 else "error" if i < 995 else "truncated"
                record: dict[str, Any] = {
                    "id": f"q{i}", "model": model, "sample": 0, "outcome": outcome,
                    "content_key": "k", "flags": [], "cut": False,
                    "reason": None if outcome == "completed" else (
                        f"HTTP {500 + i % 2}: upstream overloaded" if outcome == "error"
                        else "the connection broke after 3 events without [DONE]"),
                    "status": (500 + i % 2) if outcome == "error" else 200,
                    "usage": {"prompt_tokens": 1234, "completion_tokens": 4321},
                    "metrics": {"ttft": 12.5, "tokens_per_second": 1234.0},
                    "rate_limited": 1, "retry_wait": 1.5}
                file.write(dumps_bytes(record))
    return path


WHOLE = ["1000", "987 (99%)", "1,234,000", "4,321,000", "12.50s", "1234", "1500.0s"]


def _check(lines: list[str], width: int) -> None:
    assert max(cell_len(line) for line in lines) <= width, "\n".join(lines)
    text = "\n".join(lines)
    for model in MODELS:
        assert model in text
    for number in WHOLE:
        assert len(re.findall(rf"(?<![\d,.]){re.escape(number)}(?![\d,])", text)) >= 3, \
            (number, text)
    table = [line for line in lines if not line.startswith("  ") and "…" in line]
    assert not table, table  # nothing cut but the reasons' text


@pytest.mark.parametrize("width", [200, 160, 120, 100, 80, 70, 60, 50, 40])
def test_the_summary_fits_and_every_number_is_whole(tmp_path: Path, width: int) -> None:
    path = _results(tmp_path / "results.jsonl")
    out = io.StringIO()
    console = Console(file=out, width=width, color_system=None, highlight=False, markup=False)
    assert report(str(path), as_json=False, stdout=out, console=console) == 0
    lines = out.getvalue().splitlines()
    _check(lines, width)
    headers = " ".join(lines)
    for word in ("runs", "completed", "empty", "truncated", "error", "timed", "cancelled",
                 "TTFT", "p50", "p95", "tok/s", "tokens", "429s", "wait"):
        assert word in headers
    if width >= 170:  # one table
        assert sum(line.lstrip().startswith("model") for line in lines) == 1


def test_the_layouts_at_each_width(tmp_path: Path) -> None:
    with open(_results(tmp_path / "r.jsonl", runs=20), "rb") as file:
        summary = model_summary(RecordReader(file))
    shapes = {}
    for width in (170, 120, 80, 60):
        out = io.StringIO()
        console = Console(file=out, width=width, color_system=None)
        console.print(summary_view(summary, console))
        lines = out.getvalue().splitlines()
        shapes[width] = (sum(line.split()[:1] == ["model"] for line in lines),
                         max(cell_len(line) for line in lines))
    assert shapes[170][0] == 1 and shapes[120][0] == 2 and shapes[80][0] == 2
    assert shapes[60][0] == 0  # blocks, one a model
    assert all(widest <= width for width, (_, widest) in shapes.items())


def test_report_with_columns_set(tmp_path: Path) -> None:
    path = _results(tmp_path / "results.jsonl", runs=1000)
    for width in (120, 80):
        done = subprocess.run([*COMMAND, "report", str(path)], capture_output=True, text=True,
                              env={**os.environ, "COLUMNS": str(width)}, timeout=60)
        assert done.returncode == 0, done.stderr
        _check(done.stdout.splitlines(), width)
    done = subprocess.run([*COMMAND, "report", str(path)], capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if k != "COLUMNS"},
                          timeout=60)
    assert sum(line.split()[:1] == ["model"] for line in done.stdout.splitlines()) == 1


def test_report_on_a_real_terminal(tmp_path: Path) -> None:
    path = _results(tmp_path / "results.jsonl")
    for width in (80, 120):
        status, output = run_on_pty([*COMMAND, "report", str(path)], columns=width, rows=50)
        assert status == 0, output
        screen = Screen(width).feed(output)
        assert screen.overflowed == 0
        _check([line for line in screen.text() if line], width)


# --------------------------------------------------------------- batch on a terminal

BATCH_CONFIG = """
[endpoint]
base_url = "embedded"

[deadlines]
idle = 3
total = 30

[concurrency]
max = 16

[[models]]
name = "fast"
id = "mock/fast"

[[models]]
name = "flaky"
id = "fault/truncate:3"

[[models]]
name = "stalled"
id = "fault/heartbeat-stall:2"
deadlines = { idle = 0.5 }

[[models]]
name = "missing"
id = "mock/no-such-model"

[[models]]
name = "slow"
id = "mock/slow:0.01"
"""


@pytest.fixture
def config(tmp_path: Path) -> str:
    path = tmp_path / "fanout.toml"
    path.write_text(BATCH_CONFIG)
    return str(path)


def _prompts(tmp_path: Path, count: int) -> Path:
    path = tmp_path / "prompts.jsonl"
    lines = [json.dumps({"id": f"question-{i}", "prompt": f"Question {i}?"})
             for i in range(count)]
    lines.append(json.dumps({"id": "hot", "prompt": "x", "params": {"temperature": "hot"}}))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_batch_on_a_real_terminal_at_80_columns(tmp_path: Path, config: str) -> None:
    prompts = _prompts(tmp_path, 110)
    output = tmp_path / "results.jsonl"
    status, raw = run_on_pty([*COMMAND, "batch", str(prompts), "-o", str(output), "--config",
                              config], columns=80, rows=40, timeout=120)
    assert status == 1, raw
    screen = Screen(80).feed(raw)
    lines = screen.text()
    # Only stderr's messages may be longer than the terminal (it wraps them whole, a
    # message and its continuations); nothing of the progress bar or the summary.
    wrapped, message = set(screen.wrapped), set()
    for row, line in enumerate(lines):
        if line.startswith("fanout batch: ") or (row - 1 in wrapped and row - 1 in message):
            message.add(row)
    assert wrapped <= message, [lines[row] for row in sorted(wrapped - message)]
    progress = [line for line in lines if "/555" in line]
    assert progress and progress[-1].split().count("555/555") == 1, progress  # whole
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["model", "runs"])
    table = lines[start - 1:]
    table = table[:next(i for i, line in enumerate(table) if line.startswith("fanout batch: "))]
    assert max(cell_len(line) for line in table) <= 80
    assert not [line for line in table if "…" in line and not line.startswith("  ")]
    # 13: why, per model, with the HTTP status of errors.
    assert "why streams did not complete (the reported record of each):" in table
    # each reason starts indented; it wraps at word boundaries onto lines of its own
    why = table.index("why streams did not complete (the reported record of each):")
    reasons: list[str] = []
    for line in table[why + 1:]:
        if not line.strip():
            break
        if line.startswith("  "):
            reasons.append(line.strip())
        else:
            reasons[-1] += " " + line.strip()
    assert any(line.startswith("flaky: 110 truncated: the connection broke after 3 events")
               for line in reasons), reasons
    assert any(line.startswith("stalled: 110 timed out: no event within 0.5 s")
               for line in reasons), reasons
    assert any(line.startswith("missing: 110 error HTTP 404: the endpoint does not know "
                               "model 'mock/no-such") for line in reasons), reasons
    assert "missing: 1 error HTTP 400: 'temperature' must be a number, not 'hot'." in reasons
    assert "fast: 1 error HTTP 400: 'temperature' must be a number, not 'hot'." in reasons


def test_tokens_no_server_reported_are_unknown_not_zero(tmp_path: Path, config: str) -> None:
    prompts = _prompts(tmp_path, 3)
    output = tmp_path / "results.jsonl"
    out = io.StringIO()
    run_batch(BatchOptions(prompts=str(prompts), output=str(output), config=config,
                           models=("fast", "flaky")), stdout=out, stderr=io.StringIO(),
              environ={})
    rows = {line.split()[0]: line.split() for line in out.getvalue().splitlines()
            if line.split()[:1] in (["fast"], ["flaky"])}
    # model runs completed (pct) empty truncated error timed cancelled p50 p95 tok/s in out
    assert rows["flaky"][12:14] == ["-", "-"]
    assert rows["fast"][12].rstrip("+").replace(",", "").isdigit()
    assert rows["fast"][12].endswith("+")  # the refused request sent no usage
    summary = io.StringIO()
    assert report(str(output), as_json=True, stdout=summary) == 0
    data = json.loads(summary.getvalue())
    assert data["flaky"]["tokens_in"] is None and data["flaky"]["tokens_out"] is None
    assert data["flaky"]["tokens_in_known"] == 0
    assert data["fast"]["tokens_in"] > 0 and data["fast"]["tokens_in_known"] == 3
    reasons = data["fast"]["reasons"]
    assert reasons == [{"outcome": "error", "status": 400, "count": 1,
                        "reason": "HTTP 400: 'temperature' must be a number, not 'hot'."}]


def test_the_top_reasons_are_grouped_and_counted() -> None:
    rows = [{"id": f"q{i}", "model": "m", "sample": 0, "content_key": "k",
             "outcome": "error" if i < 7 else "timed_out", "status": 503 if i < 5 else 429,
             "reason": f"HTTP {503 if i < 5 else 429}: busy, retry in {i} s" if i < 7 else
             "no event within 2 s"} for i in range(9)]
    rows += [{"id": "e", "model": "m", "sample": 0, "content_key": "k", "outcome": "completed",
              "flags": ["empty_answer"]},
             {"id": "c", "model": "m", "sample": 0, "content_key": "k", "outcome": "completed",
              "cut": True},
             {"id": "x", "model": "m", "sample": 0, "content_key": "k", "outcome": "cancelled"}]
    reasons = model_summary(rows)["m"]["reasons"]
    assert [(r["outcome"], r["status"], r["count"]) for r in reasons] == [
        ("error", 503, 5), ("error", 429, 2), ("timed_out", None, 2), ("empty", None, 1),
        ("truncated", None, 1), ("cancelled", None, 1)]
    assert reasons[0]["reason"] == "HTTP 503: busy, retry in 0 s"  # the first, as an example
    out = io.StringIO()
    console = Console(file=out, width=80, color_system=None)
    console.print(summary_view(model_summary(rows), console))
    lines = out.getvalue().splitlines()
    assert lines[-4:] == [
        "  m: 5 error HTTP 503: busy, retry in 0 s",
        "  m: 2 error HTTP 429: busy, retry in 5 s",
        "  m: 2 timed out: no event within 2 s",
        "  m: 3 more, for other reasons (fanout report --json lists them)"]
