"""`fanout compare` end to end against the embedded upstream (in-process or `fanout mock`)."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from rich.console import Console

from fanout.cli.compare import CompareOptions, UsageError, read_prompt, run_compare
from fanout.cli.main import main
from fanout.cli.render import inert
from tests.helpers import fanout_mock, ignores, interrupt, sigint_default

COMMAND = [sys.executable, "-m", "fanout.cli.main"]

CONFIG = """
[endpoint]
base_url = "embedded"

[deadlines]
idle = 3
total = 20

[compare]
models = ["steady", "reasoner", "tools"]

[[models]]
name = "steady"
id = "mock/fast"
params = { max_tokens = 30 }

[[models]]
name = "reasoner"
id = "mock/reasoning"
params = { max_tokens = 40 }

[[models]]
name = "tools"
id = "mock/tools"

[[models]]
name = "short"
id = "mock/length"
params = { max_tokens = 5 }

[[models]]
name = "flaky"
id = "fault/truncate:3"

[[models]]
name = "stalled"
id = "fault/heartbeat-stall:2"
deadlines = { idle = 0.5 }

[[models]]
name = "hanging"
id = "fault/stall:4"
deadlines = { idle = 600, total = 600 }

[[models]]
name = "empty"
id = "replay/L10_context_overflow_stream:x0"

[[models]]
name = "interrupted"
id = "replay/15_interrupted_first:x0"

[[models]]
name = "two"
id = "replay/L03_mock_n2:x0"
params = { n = 2 }

[[models]]
name = "slowpoke"
id = "mock/fast:0.05"
params = { max_tokens = 20 }
"""


@pytest.fixture
def config(tmp_path: Path) -> str:
    path = tmp_path / "fanout.toml"
    path.write_text(CONFIG)
    return str(path)


def compare(config: str, *models: str, prompt: str = "Tell me about rivers.",
            json_lines: bool = False, environ: dict[str, str] | None = None,
            console: Console | None = None, **options: object) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = run_compare(
        CompareOptions(prompt=prompt, models=models, config=config, json=json_lines,
                       **options),  # type: ignore[arg-type]
        stdout=out, stderr=err, environ=environ or {}, console=console)
    return status, out.getvalue(), err.getvalue()


def test_plain_output_has_a_block_per_model_and_a_summary(config: str) -> None:
    status, out, err = compare(config)
    assert status == 0, err
    assert err == ""
    blocks = [line for line in out.splitlines() if line.startswith("== ")]
    assert [b.split()[1] for b in blocks] == ["steady", "reasoner", "tools"]
    assert all(" done " in b for b in blocks)
    assert "finish tool_calls" in blocks[2]
    assert "→ get_weather(" in out  # tool calls, pretty-printed
    summary = out[out.index(" model "):]
    assert all(name in summary for name in ("steady", "reasoner", "tools"))
    assert "\x1b" not in out  # not a terminal: no colour codes


def test_a_fault_model_shows_its_outcome_and_fails_the_run(config: str) -> None:
    status, out, err = compare(config, "steady", "flaky", "stalled", "short")
    assert status == 1
    # flaky may break off while the others still run: then a line of advice follows it.
    lines = [line for line in err.splitlines() if "one stream at a time" not in line]
    assert lines == [
        "fanout compare: flaky: truncated: the connection broke after 3 events without [DONE]: "
        "the server closed the connection mid-response (RemoteProtocolError: peer closed "
        "connection without sending complete message body (incomplete chunked read))",
        "fanout compare: stalled: timed out (idle): no event within 0.5 s"]
    assert all(line.startswith("fanout compare: flaky: this stream broke off while ")
               for line in err.splitlines() if line not in lines)
    blocks = {line.split()[1]: line for line in out.splitlines() if line.startswith("== ")}
    assert " truncated " in blocks["flaky"]
    assert blocks["flaky"].endswith(" · the connection broke after 3 events without [DONE]: "
                                    "the server closed the connection mid-response "
                                    "(RemoteProtocolError: peer closed connection without "
                                    "sending complete message body (incomplete chunked read))") \
        or " · broke off while " in blocks["flaky"]
    assert blocks["stalled"].endswith(" · no event within 0.5 s")
    assert "finish length" in blocks["short"] and " done " in blocks["short"]  # length completes
    summary = out[out.index(" model "):]
    assert " note" in summary.splitlines()[0] and "no event within 0.5 s" in summary


def test_json_lines(config: str) -> None:
    status, out, _ = compare(config, "steady", "tools", "flaky", json_lines=True)
    assert status == 1
    records = [json.loads(line) for line in out.splitlines()]
    results = {r["stream"]: r for r in records if r["type"] == "result"}
    assert set(results) == {"steady", "tools", "flaky"}
    assert [r["type"] for r in records].count("result") == 3
    for key, result in results.items():
        mine = [r for r in records if r["stream"] == key]
        assert mine[-1] is result  # the result is each stream's last record
        text = "".join(r["text"] for r in mine if r["type"] == "text" and r["choice"] == 0)
        assert text == result["text"]
        assert all(r["t"] >= 0 for r in mine)
    assert results["steady"]["outcome"] == "completed"
    assert results["steady"]["metrics"]["ttft"] > 0
    assert results["flaky"]["outcome"] == "truncated" and results["flaky"]["text"]
    calls = results["tools"]["choices"][0]["tool_calls"]
    assert [c["name"] for c in calls] == ["get_weather", "get_time"]
    assert all(c["valid_json"] for c in calls)
    assert {"started", "text", "finish", "usage", "done_marker"} <= {r["type"] for r in records}


def test_live_view_on_a_terminal(config: str) -> None:
    terminal = Console(file=io.StringIO(), width=150, height=40, force_terminal=True,
                       record=True, color_system="truecolor")
    status, _, err = compare(config, "steady", "short", "reasoner", console=terminal)
    assert status == 0, err
    screen = terminal.export_text()
    header = next(line for line in screen.splitlines() if "steady" in line)
    assert "short" in header and "reasoner" in header  # side by side
    assert screen.count("done  finish length") == 3  # the final screen: every column
    raw = terminal.file.getvalue()  # type: ignore[attr-defined]
    assert "\x1b[" in raw  # it did draw in colour


def test_no_reasoning_hides_it(config: str) -> None:
    _, shown, _ = compare(config, "reasoner")
    _, hidden, _ = compare(config, "reasoner", reasoning=False)
    assert "Let me think" in shown and "Let me think" not in hidden


def test_system_message_and_prompt_reach_the_model(config: str, tmp_path: Path) -> None:
    path = tmp_path / "echo.toml"
    path.write_text(CONFIG.replace('id = "mock/fast"', 'id = "mock/echo"'))
    status, out, _ = compare(str(path), "steady", prompt="[bold]echo me[/bold]",
                             system="be brief")
    assert status == 0
    assert "[bold]echo me[/bold]" in out  # model text is never markup


def test_unknown_model_is_a_usage_error(config: str) -> None:
    status, out, err = compare(config, "stedy")
    assert status == 2 and out == ""
    assert err.strip() == (f"fanout compare: {config}: no model named 'stedy' "
                           "(did you mean 'steady'?) (known: steady, reasoner, tools, short, "
                           "flaky, stalled, hanging, empty, interrupted, two, slowpoke)")


def test_a_missing_key_variable_is_named_not_printed(tmp_path: Path) -> None:
    path = tmp_path / "relay.toml"
    path.write_text('[endpoint]\nbase_url = "http://127.0.0.1:9/v1"\napi_key_env = "MY_KEY"\n'
                    '[[models]]\nname = "a"\nid = "a"\n')
    status, _, err = compare(str(path), environ={"OPENAI_API_KEY": "sk-should-not-appear"})
    assert status == 2
    assert "MY_KEY is not set" in err and "sk-should-not-appear" not in err


@pytest.fixture
def mock_with_key() -> Iterator[str]:
    with fanout_mock("--key", "sk-compare-secret-1") as base_url:
        yield base_url


def test_a_real_endpoint_with_a_key_never_shows_the_key(mock_with_key: str,
                                                        tmp_path: Path) -> None:
    path = tmp_path / "relay.toml"
    path.write_text(f'[endpoint]\nbase_url = "{mock_with_key}"\napi_key_env = "MY_KEY"\n'
                    '[[models]]\nname = "echo"\nid = "mock/echo"\n')
    secret = "sk-compare-secret-1"
    ok = compare(str(path), environ={"MY_KEY": secret}, json_lines=True)
    assert ok[0] == 0
    refused = compare(str(path), environ={"MY_KEY": "sk-wrong-key-000"})
    assert refused[0] == 1 and "fanout compare: echo: error: HTTP 401: the key in MY_KEY was sent to " in refused[2]
    assert "(the server said: Incorrect API key provided.)" in refused[2]
    for _, out, err in (ok, refused):
        assert secret not in out + err and "sk-wrong-key-000" not in out + err


def test_read_prompt(tmp_path: Path) -> None:
    assert read_prompt("hello") == "hello"
    assert read_prompt("-", io.StringIO("from stdin\n")) == "from stdin\n"
    path = tmp_path / "p.txt"
    path.write_text("from a file")
    assert read_prompt(f"@{path}") == "from a file"
    with pytest.raises(UsageError, match="no such file"):
        read_prompt(f"@{tmp_path / 'missing'}")
    with pytest.raises(UsageError, match="the prompt is empty"):
        read_prompt("-", io.StringIO("  \n"))
    with pytest.raises(UsageError, match="the prompt is empty"):
        read_prompt("")


def test_the_command_line_reads_the_prompt_from_stdin(config: str) -> None:
    out = subprocess.run([*COMMAND, "compare", "-", "-m", "steady", "--config", config, "--json"],
                         input="from stdin", capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1])["outcome"] == "completed"
    empty = subprocess.run([*COMMAND, "compare", "@/nonexistent/prompt.txt", "--config", config],
                           capture_output=True, text=True, timeout=60)
    assert empty.returncode == 2
    assert empty.stderr == "fanout compare: PROMPT @/nonexistent/prompt.txt: no such file\n"


def _interrupt(config: str) -> subprocess.CompletedProcess[str]:
    """Start compare, wait until text arrived (--json shows it), then Ctrl-C."""
    process = subprocess.Popen(
        [*COMMAND, "compare", "hi", "-m", "hanging", "-m", "steady", "--config", config,
         "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"}, preexec_fn=sigint_default)
    assert process.stdout is not None
    seen: list[str] = []
    texts = 0
    for line in process.stdout:
        seen.append(line)
        record = json.loads(line)
        texts += record["stream"] == "hanging" and record["type"] == "text"
        if texts == 3:  # the model hangs after its 4th chunk: this is mid-stream
            break
    interrupt(process)
    rest, err = process.communicate(timeout=30)
    return subprocess.CompletedProcess(process.args, process.returncode, "".join(seen) + rest,
                                       err)


def test_ctrl_c_cancels_keeps_the_partial_output_and_exits_130(config: str) -> None:
    done = _interrupt(config)
    assert done.returncode == 130, done.stderr
    assert "Traceback" not in done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    results = {r["stream"]: r for r in records if r["type"] == "result"}
    assert results["hanging"]["outcome"] == "cancelled"
    partial = "".join(r["text"] for r in records
                      if r["stream"] == "hanging" and r["type"] == "text")
    assert partial and results["hanging"]["text"] == partial  # nothing lost


def test_ctrl_c_in_plain_mode_prints_the_final_screen(config: str) -> None:
    process = subprocess.Popen(
        [*COMMAND, "compare", "hi", "-m", "hanging", "--config", config],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=sigint_default)
    try:
        # Nothing is printed before the end in plain mode; the stream hangs after
        # 4 chunks, so any moment after start-up is "mid-stream".
        with pytest.raises(subprocess.TimeoutExpired):
            process.wait(timeout=3)
        interrupt(process)
        out, err = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 130, err
    assert "Traceback" not in err
    assert "== hanging" in out and "cancelled" in out
    assert "interrupted (Ctrl-C): every stream was cancelled" in out


def test_main_wires_compare(config: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "hi", "-m", "steady", "--config", config]) == 0
    assert "== steady" in capsys.readouterr().out


def test_ctrl_c_on_a_real_terminal(config: str) -> None:
    # A pseudo-terminal: the live view runs, and ^C typed at it becomes SIGINT.
    import fcntl
    import pty
    import select
    import termios
    import time

    def controlling_terminal() -> None:  # in the child: the pty becomes its terminal
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        sigint_default()  # ^C is SIGINT to it, as to a foreground job

    leader, follower = pty.openpty()
    os.set_blocking(leader, False)
    process = subprocess.Popen(
        [*COMMAND, "compare", "hi", "-m", "hanging", "-m", "steady", "--config", config],
        stdin=follower, stdout=follower, stderr=follower, preexec_fn=controlling_terminal,
        env={**os.environ, "COLUMNS": "100", "LINES": "30", "TERM": "xterm-256color"})
    os.close(follower)
    screen = b""

    def read(seconds: float) -> None:
        nonlocal screen
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if select.select([leader], [], [], 0.1)[0]:
                try:
                    screen += os.read(leader, 65536)
                except OSError:  # the child closed the terminal
                    return

    try:
        deadline = time.monotonic() + 30
        while b"streaming" not in screen and time.monotonic() < deadline:
            read(0.2)
        assert b"streaming" in screen  # the live view is up, mid-stream
        assert not ignores(process.pid)  # else ^C would be lost (see sigint_default)
        os.write(leader, b"\x03")
        while process.poll() is None and time.monotonic() < deadline:
            read(0.2)  # keep reading: a full terminal buffer would block the child
        read(0.2)
        assert process.returncode == 130
    finally:
        process.kill()
        os.close(leader)
    final = screen.decode("utf-8", "replace")
    # Which streams were cancelled, and which had finished (steady streams for ~0.1 s).
    assert "cancelled" in final
    # The line may wrap at the terminal's width: compare its words, without the colours.
    words = " ".join(re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", final).split())
    assert "interrupted (Ctrl-C): 1 cancelled (hanging), 1 had finished (steady: done); what " \
        "arrived is shown above" in words
    assert "Traceback" not in final


def test_a_closed_pipe_is_not_a_traceback(config: str) -> None:
    # `fanout compare ... --json | head -1`: the reader leaves early.
    # slowpoke streams for about a second: it still writes after the reader left
    # (a fast model could write everything into the pipe's buffer first, and exit 0).
    process = subprocess.Popen([*COMMAND, "compare", "hi", "-m", "slowpoke", "-m", "reasoner",
                                "--config", config, "--json"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout is not None and process.stderr is not None
    assert json.loads(process.stdout.readline())["type"] == "started"
    process.stdout.close()
    err = process.stderr.read()
    process.stderr.close()
    assert process.wait(timeout=30) == 1
    assert b"Traceback" not in err and b"Exception ignored" not in err


def test_a_stream_waiting_for_a_slot_shows_queued(tmp_path: Path) -> None:
    path = tmp_path / "one.toml"
    path.write_text('[endpoint]\nbase_url = "embedded"\n[concurrency]\nmax = 1\n'
                    '[[models]]\nname = "first"\nid = "mock/fast:0.05"\nparams = { max_tokens = 8 }\n'
                    '[[models]]\nname = "second"\nid = "mock/fast:0.05"\nparams = { max_tokens = 8 }\n')
    terminal = Console(file=io.StringIO(), width=120, height=30, force_terminal=True, record=True)
    assert compare(str(path), console=terminal)[0] == 0
    frames = terminal.export_text().split("Ctrl-C stops all")
    assert any("1 streaming · 1 queued" in frame or "1 queued · 1 streaming" in frame
               for frame in frames)


# ---------------------------------------------------------------- honest outcomes

def test_an_empty_answer_is_flagged_and_fails_the_run(config: str) -> None:
    # A relay's invented finish_reason "stop" on a stream that produced nothing.
    status, out, err = compare(config, "empty")
    assert status == 1
    assert err == ("fanout compare: empty: completed (finish stop), but the answer is empty: "
                   "no text, reasoning, refusal or tool call\n")  # it ran alone: no cut advice
    block = next(line for line in out.splitlines() if line.startswith("== empty"))
    assert " done finish stop " in block and block.endswith(" · ⚠ empty answer · missing usage")
    assert "⚠ empty answer" in out[out.index(" model "):]  # the summary's note
    status, out, _ = compare(config, "empty", json_lines=True)
    result = json.loads(out.splitlines()[-1])
    assert result["outcome"] == "completed" and result["flags"] == ["empty_answer", "missing_usage"]


def test_a_flagged_choice_shows_and_the_run_still_passes(config: str) -> None:
    # LiteLLM's mock with n=2: choice 1 never gets a finish reason.
    status, out, err = compare(config, "two")
    assert (status, err) == (0, "")
    block = next(line for line in out.splitlines() if line.startswith("== two"))
    assert block.endswith(" · ⚠ choice 1 unfinished · missing usage")


def test_done_without_a_finish_reason_is_truncated_with_its_reason(config: str) -> None:
    status, out, err = compare(config, "interrupted")
    assert status == 1
    assert err == ("fanout compare: interrupted: truncated: [DONE] arrived but no choice had a "
                   "finish reason (the server cut the stream)\n")
    block = next(line for line in out.splitlines() if line.startswith("== interrupted"))
    assert " truncated " in block and block.endswith("(the server cut the stream)")


def test_a_stream_cut_while_others_ran_says_so_and_what_to_do(config: str) -> None:
    # The replay ends at once; slowpoke streams for about a second: it holds its slot.
    status, out, err = compare(config, "interrupted", "slowpoke")
    assert status == 1
    assert err.splitlines() == [
        "fanout compare: interrupted: truncated: [DONE] arrived but no choice had a finish "
        "reason (the server cut the stream)",
        "fanout compare: interrupted: the server cut this stream while 1 other stream ran: a "
        "server like that (llama.cpp with one slot) serves one stream at a time; compare fewer "
        "models at once, or set [concurrency] max = 1"]
    block = next(line for line in out.splitlines() if line.startswith("== interrupted"))
    assert block.endswith(" · cut while 1 other stream ran")
    assert "the server cut this stream while 1 other stream ran" in out  # the column's body
    status, out, _ = compare(config, "interrupted", "slowpoke", json_lines=True)
    results = {r["stream"]: r for r in map(json.loads, out.splitlines()) if r["type"] == "result"}
    assert results["interrupted"]["others_running"] == 1
    assert results["slowpoke"]["others_running"] == 0


def _on_a_terminal(args: list[str], *, until: Callable[[bytes, int | None], bool],
                   seconds: float = 30) -> tuple[bytes, int | None]:
    """Run ``fanout ARGS`` on a pseudo-terminal of 100x30 until ``until(screen, status)``;
    returns every byte it wrote and its exit status."""
    import fcntl
    import pty
    import select
    import termios
    import time

    def controlling_terminal() -> None:  # in the child: the pty becomes its terminal
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    leader, follower = pty.openpty()
    os.set_blocking(leader, False)
    process = subprocess.Popen(
        [*COMMAND, *args], stdin=follower, stdout=follower, stderr=follower,
        preexec_fn=controlling_terminal,
        env={**os.environ, "COLUMNS": "100", "LINES": "30", "TERM": "xterm-256color"})
    os.close(follower)
    screen = b""
    try:
        deadline = time.monotonic() + seconds
        while not until(screen, process.poll()) and time.monotonic() < deadline:
            # Keep reading: a full terminal buffer would block the child.
            if select.select([leader], [], [], 0.1)[0]:
                try:
                    screen += os.read(leader, 65536)
                except OSError:  # the child closed the terminal
                    process.wait(timeout=seconds)
    finally:
        process.kill()
        process.wait()
        os.close(leader)
    return screen, process.returncode


def test_the_reason_shows_on_a_real_terminal(config: str) -> None:
    screen, status = _on_a_terminal(
        ["compare", "hi", "-m", "flaky", "--config", config],
        until=lambda screen, status: status is not None and screen.endswith(b"\n"))
    assert status == 1
    raw = screen.decode("utf-8", "replace")
    assert "\x1b[" in raw  # the live view drew in colour: this was a terminal
    text = inert(raw)  # the colours and cursor moves out of the way
    # The column's header: the reason on its own line, cut to fit the box (98 wide).
    header = next(line for line in text.splitlines() if line.startswith("│ the connection"))
    assert header == ("│ the connection broke after 3 events without [DONE]: the server closed the "
                      "connection mid-respon… │")
    assert ("\nfanout compare: flaky: truncated: the connection broke after 3 events without "
            "[DONE]: the server closed the connection mid-response (RemoteProtocolError: peer "
            "closed connection without sending complete message body (incomplete chunked "
            "read))\n") in text


def test_a_single_slot_server_cuts_one_of_two_and_compare_says_so(tmp_path: Path) -> None:
    path = tmp_path / "slot.toml"
    path.write_text('[endpoint]\nbase_url = "embedded"\n'
                    + "".join(f'[[models]]\nname = "{name}"\nid = "slot/clean"\n'
                              'params = { max_tokens = 10 }\n' for name in ("one", "two")))
    status, _, err = compare(str(path))
    assert status == 1
    # Both ask at once; the second request takes the server's one slot from the first.
    lines = err.splitlines()
    assert len(lines) == 2
    cut = lines[0].split(":")[1].strip()
    assert cut in ("one", "two")
    assert lines == [
        f"fanout compare: {cut}: truncated: [DONE] arrived but no choice had a finish reason "
        "(the server cut the stream)",
        f"fanout compare: {cut}: the server cut this stream while 1 other stream ran: a "
        "server like that (llama.cpp with one slot) serves one stream at a time; compare "
        "fewer models at once, or set [concurrency] max = 1"]
    path.write_text(path.read_text().replace('base_url = "embedded"\n',
                                             'base_url = "embedded"\n[concurrency]\nmax = 1\n'))
    assert compare(str(path))[0] == 0  # what it advised: one at a time


def test_a_long_prompt_with_keepalives_is_not_idle(tmp_path: Path) -> None:
    # #27: llama.cpp sends only `: ping` while it evaluates a long prompt.  Before the first
    # content a keep-alive moves the idle deadline; silence still ends the stream by it.
    path = tmp_path / "fanout.toml"
    path.write_text('[endpoint]\nbase_url = "embedded"\n\n[deadlines]\nidle = 0.5\n'
                    'total = 20\n\n[[models]]\nname = "pinging"\n'
                    'id = "fault/ping-then-answer:1.5:0.05"\n\n[[models]]\nname = "silent"\n'
                    'id = "fault/ping-then-answer:1.5:0"\n')
    status, out, _ = compare(str(path), "pinging", "silent", json_lines=True)
    results = {r["stream"]: r for r in map(json.loads, out.splitlines()) if r["type"] == "result"}
    assert results["pinging"]["outcome"] == "completed", results["pinging"]
    assert results["pinging"]["text"]
    assert (results["silent"]["outcome"], results["silent"]["timed_out"]) == ("timed_out", "idle")
    assert results["silent"]["reason"] == "no event within 0.5 s"
    assert status == 1  # the silent one failed the run
