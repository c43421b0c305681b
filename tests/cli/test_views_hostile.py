"""`fanout compare` against a server that sends hostile text: every output path survives it.

A small scripted server on loopback sends, as valid JSON, lone surrogates (and a
surrogate pair split across two deltas), C1 controls (U+009B is an 8-bit CSI),
bidi controls, zero-width characters, line and paragraph separators, in answer
text, reasoning, refusals, tool names, tool arguments, finish reasons and error
messages.  compare is run as a user runs it (a subprocess, its stdout a pipe or
a pseudo-terminal, both strict UTF-8): no output path may crash, ``--json``
escapes what a terminal must not get and round-trips the text exactly, and the
views show it inert (a lone surrogate as U+FFFD).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.cli.test_views_terminal import replay, run_on_terminal

COMMAND = [sys.executable, "-m", "fanout.cli.main"]

EVIL = ("lone\ud800surrogate 8-bit-CSI\x9b2J ST\x9c OSC\x9d bidi\u202eoverride\u2066isolate "
        "zero\u200bwidth\u200emark\ufeffbom line\u2028separator\u2029paragraph "
        "\x1b[31mred\x1b[0m")
PAIR = ("split pair: \ud83d", "\ude00 joined")  # one emoji, its halves in two deltas
EVIL_ERROR = "quota \x9b2J\u202egone\ud800 \u2066x"


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {"id": "c1", "object": "chat.completion.chunk", "model": "evil",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + json.dumps(body).encode() + b"\n\n"  # ensure_ascii: \ud800 escaped


def _stream(model: str) -> tuple[int, str, bytes]:
    if model == "evil/error":
        body = json.dumps({"error": {"message": EVIL_ERROR, "type": "server\u009b_error"}})
        return 400, "application/json", body.encode()
    if model == "evil/event-error":
        return 200, "text/event-stream", (_chunk({"role": "assistant", "content": "so far "})
                                           + b"data: " + json.dumps({"error": {
                                               "message": EVIL_ERROR}}).encode() + b"\n\n")
    if model == "evil/refusal":
        return 200, "text/event-stream", (_chunk({"role": "assistant"})
                                           + _chunk({"refusal": EVIL}) + _chunk({}, "stop")
                                           + b"data: [DONE]\n\n")
    parts = [_chunk({"role": "assistant"}), _chunk({"reasoning_content": EVIL}),
             _chunk({"content": EVIL}), _chunk({"content": PAIR[0]}),
             _chunk({"content": PAIR[1]}),
             _chunk({"tool_calls": [{"index": 0, "id": "t1", "type": "function",
                                     "function": {"name": "look\ud800up\u202e\x9b",
                                                  "arguments": json.dumps({"q": EVIL})}}]}),
             _chunk({}, "tool_calls\u202e\ud800"), b"data: [DONE]\n\n"]
    return 200, "text/event-stream", b"".join(parts)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers["content-length"])))
        status, kind, body = _stream(request["model"])
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def evil_config(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    path = tmp_path_factory.mktemp("evil") / "evil.toml"
    path.write_text(
        f'[endpoint]\nbase_url = "http://127.0.0.1:{server.server_address[1]}/v1"\n'
        'api_key_env = "EVIL_KEY"\n[deadlines]\ntotal = 20\n'
        + "".join(f'[[models]]\nname = "{name}"\nid = "evil/{name}"\n'
                  for name in ("text", "error", "event-error", "refusal")))
    try:
        yield str(path)
    finally:
        server.shutdown()
        server.server_close()


def _run(config: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    # Pipes, read as bytes: whatever compare writes must be UTF-8 (it cannot write a
    # lone surrogate without crashing).
    return subprocess.run([*COMMAND, "compare", "hi", "--config", config, *args],
                          capture_output=True, timeout=60,
                          env={**os.environ, "EVIL_KEY": "k", "PYTHONIOENCODING": "utf-8"})


def _safe_for_a_terminal(data: bytes, *, invisible: bool = False) -> str:
    """``data`` as text with no control, bidi control or separator (and, unless
    ``invisible``, none of the invisible characters the views remove; JSON may keep
    them: they move nothing)."""
    text = data.decode("utf-8")  # strict: a lone surrogate could not be in it
    unsafe = ["\x1b", "\x9b", "\x9c", "\x9d", "\u202e", "\u2066", "\u200e", "\u2028", "\u2029"]
    for character in unsafe + ([] if invisible else ["\u200b", "\ufeff"]):
        assert character not in text, repr(character)
    return text


def test_json_lines_escape_controls_bidi_and_lone_surrogates(evil_config: str) -> None:
    done = _run(evil_config, "-m", "text", "-m", "error", "-m", "event-error", "--json")
    assert done.returncode == 1, done.stderr
    assert b"Traceback" not in done.stderr
    raw = _safe_for_a_terminal(done.stdout, invisible=True)  # safe to print
    for escape in ("\\u009b", "\\u009c", "\\u009d", "\\u202e", "\\u2066", "\\ud800"):
        assert escape in raw
    records = [json.loads(line) for line in raw.splitlines()]
    results = {r["stream"]: r for r in records if r["type"] == "result"}
    texts = [r["text"] for r in records if r["type"] == "text" and r["stream"] == "text"]
    assert texts == [EVIL, *PAIR]  # parsed back, the very same text, lone surrogates too
    assert results["text"]["text"] == EVIL + "split pair: 😀 joined"  # the result joins them
    assert [r["reasoning"] for r in results["text"]["choices"]] == [EVIL]
    call = results["text"]["choices"][0]["tool_calls"][0]
    assert call["name"] == "look\ud800up\u202e\x9b" and json.loads(call["arguments"]) == {"q": EVIL}
    assert results["text"]["choices"][0]["finish_reason"] == "tool_calls\u202e\ud800"
    errors = [r for r in records if r["type"] == "error"]
    assert {r["stream"] for r in errors} >= {"event-error"}
    assert all(EVIL_ERROR in r["message"] for r in errors)
    assert EVIL_ERROR in results["error"]["error"]["message"]
    assert EVIL_ERROR in results["event-error"]["reason"]


def test_plain_output_and_stderr_show_it_inert(evil_config: str) -> None:
    done = _run(evil_config, "-m", "text", "-m", "error", "-m", "event-error", "-m", "refusal")
    assert done.returncode == 1
    out, err = _safe_for_a_terminal(done.stdout), _safe_for_a_terminal(done.stderr)
    assert "Traceback" not in err
    assert all(line.startswith("fanout compare: ") for line in err.splitlines())
    assert "fanout compare: error: error: HTTP 400: quota gone\ufffd x" in err.splitlines()
    assert "lone\ufffdsurrogate" in out  # a lone surrogate shows as U+FFFD
    assert "split pair: 😀 joined" in out  # the halves of a pair, joined back
    assert "zerowidthmarkbom" in out  # zero-width characters removed
    assert "line\nseparator\nparagraph" in out  # separators break lines
    assert "→ look\ufffdup(" in out and "finish tool_calls\ufffd" in out
    # Off a terminal, reasoning and refusals are marked as the live view marks them.
    block = out[out.index("== text"):out.index("== error")]
    assert block.index("[reasoning]\n") < block.index("[answer]\n")
    refusal = out[out.index("== refusal"):]
    assert "[refusal]\nlone\ufffdsurrogate" in refusal


def test_the_live_view_shows_it_inert_on_a_terminal(evil_config: str) -> None:
    output, status = run_on_terminal(
        ["compare", "hi", "--config", evil_config, "-m", "text", "-m", "error",
         "-m", "refusal"], 100, 30, env={"EVIL_KEY": "k"})
    assert status == 1
    text = output.decode("utf-8")  # strict
    assert "Traceback" not in text
    assert "\x9b" not in text and "\u202e" not in text and "\u2066" not in text
    terminal = replay(output, 100, 30)
    screen = "\n".join(terminal.lines())
    assert "lone\ufffdsurrogate" in screen and "split pair: 😀" in screen
    assert "HTTP 400: quota gone\ufffd x" in screen
    assert terminal.wrapped == 0
