"""No text a server sends, and no record a results file holds, crashes `fanout batch` or
`fanout report`: lone surrogates are escaped in the results file (exact round trip) and
replaced on the terminal; a report reads any record shape and says what it could not."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fanout.cli.batch import BatchOptions, run_batch
from fanout.cli.report import model_summary, printable, report
from fanout.records import dumps_bytes
from fanout.request import content_key
from fanout.upstream.capture import Capture

COMMAND = [sys.executable, "-m", "fanout.cli.main"]
S = "\\ud800"  # a lone surrogate, as JSON escapes it (valid JSON)


def _chunk(delta: dict[str, Any], finish: str | None = None) -> str:
    frame = {"id": "c1", "object": "chat.completion.chunk", "model": "m\ud800",
             "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return f"data: {json.dumps(frame)}\n\n"  # json.dumps writes \ud800 as an escape


def _captures(directory: Path) -> None:
    """Streams with lone surrogates in text, reasoning, tool call ids, names and arguments,
    the response's model, an HTTP error's message and type, and an error event."""
    body = (_chunk({"role": "assistant"}) + _chunk({"reasoning_content": "think \ud800"})
            + _chunk({"content": "a\ud800b"})
            + _chunk({"tool_calls": [{"index": 0, "id": "call_\ud800", "type": "function",
                                      "function": {"name": "get_\ud800",
                                                   "arguments": '{"x": "\ud800"}'}}]})
            + _chunk({}, "tool_calls")
            + 'data: {"id":"c1","object":"chat.completion.chunk","choices":[],"usage":'
              '{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}\n\n'
            + "data: [DONE]\n\n")
    stream = (("content-type", "text/event-stream"),)
    Capture("sur_text", 200, stream, body.encode()).dump(directory / "sur_text.capture.json")
    error = json.dumps({"error": {"message": "bad \ud800 input", "type": "invalid_\udfff"}})
    Capture("sur_error", 400, (("content-type", "application/json"),), error.encode()).dump(
        directory / "sur_error.capture.json")
    event = _chunk({"content": "x"}) + "data: " + json.dumps(
        {"error": {"message": "boom \ud800", "type": "server_error"}}) + "\n\n"
    Capture("sur_event", 200, stream, event.encode()).dump(directory / "sur_event.capture.json")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`fanout mock --captures DIR` in a real process on loopback: its base URL."""
    directory = tmp_path_factory.mktemp("captures")
    _captures(directory)
    process = subprocess.Popen([*COMMAND, "mock", "--port", "0", "--captures", str(directory)],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)
        if process.stdout is not None:
            process.stdout.close()


@pytest.fixture
def config(tmp_path: Path, server: str) -> str:
    path = tmp_path / "fanout.toml"
    path.write_text(f'[endpoint]\nbase_url = "{server}"\n'
                    '[[models]]\nname = "text"\nid = "replay/sur_text:x0"\n'
                    '[[models]]\nname = "refused"\nid = "replay/sur_error:x0"\n'
                    '[[models]]\nname = "event"\nid = "replay/sur_event:x0"\n')
    return str(path)


def strict_stream() -> io.TextIOWrapper:
    """A text stream that fails on anything UTF-8 cannot encode (as a pipe would)."""
    return io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict",
                            write_through=True)


def read(stream: io.TextIOWrapper) -> str:
    buffer = stream.buffer
    assert isinstance(buffer, io.BytesIO)
    return buffer.getvalue().decode("utf-8")  # strict: it must be valid UTF-8


def test_lone_surrogates_from_the_server_round_trip_through_the_results_file(
        tmp_path: Path, config: str) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": "q1", "prompt": "hi"}\n')
    output = tmp_path / "results.jsonl"
    for run in range(2):  # and a resume reads them back, redoing the errors only
        out, err = strict_stream(), strict_stream()
        status = run_batch(BatchOptions(prompts=str(prompts), output=str(output),
                                        config=config), stdout=out, stderr=err, environ={})
        # a 400 (for good) and an error event on one unit: a rerun may go otherwise the
        # first time; the same error event again on the rerun is the model's own (exit 1)
        assert status == (1 if run else 75)
        shown = read(out) + read(err)
        assert "\ud800" not in shown and "Traceback" not in shown
        assert "text" in read(out) and "bad \ufffd input" in read(out)  # replaced on screen
        if run:  # the refused request is not sent again unchanged: said, and skipped
            assert "3 streams: 1 prompts x 3 models x 1 samples; 1 already completed, 1 to " \
                   "run" in read(err)
            assert "1 unit skipped: refused as sent before (HTTP 400)" in read(err)
    data = output.read_bytes()
    data.decode("utf-8")  # strict
    lines = data.splitlines()
    assert len(lines) == 4
    rows = {row["model"]: row for row in map(json.loads, lines)}
    text = rows["text"]
    choice = text["choices"][0]
    assert text["outcome"] == "completed"
    assert (text["text"], choice["reasoning"]) == ("a\ud800b", "think \ud800")
    call = choice["tool_calls"][0]
    assert (call["id"], call["name"], call["arguments"]) == (
        "call_\ud800", "get_\ud800", '{"x": "\ud800"}')
    assert call["parsed"] == {"x": "\ud800"} and text["response_model"] == "m\ud800"
    refused = rows["refused"]
    assert refused["error"]["message"] == "bad \ud800 input"
    assert refused["error"]["type"] == "invalid_\udfff"
    assert refused["reason"] == "HTTP 400: bad \ud800 input"
    assert rows["event"]["reason"] == "boom \ud800"
    # What a lone-surrogate line is, byte for byte: the stdlib's spacing, the surrogate
    # as its JSON escape, everything else as UTF-8.
    line = next(line for line in lines if b'"model": "text"' in line)
    assert line.startswith(b'{"id": "q1", "model": "text", "sample": 0, "outcome": '
                           b'"completed", "reason": null, "flags": [], ')
    assert b'"text": "a\\ud800b"' in line and b'"name": "get_\\ud800"' in line
    assert b'"arguments": "{\\"x\\": \\"\\ud800\\"}"' in line
    assert dumps_bytes(json.loads(line)) == line + b"\n"  # the writer's exact output


def test_lone_surrogates_through_the_command_line(tmp_path: Path, config: str) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": "q1", "prompt": "hi"}\n')
    output = tmp_path / "results.jsonl"
    batch = subprocess.run([*COMMAND, "batch", str(prompts), "-o", str(output), "--config",
                            config], capture_output=True, timeout=60)
    assert batch.returncode == 75  # one of its failures a rerun may finish
    err = batch.stderr.decode("utf-8")  # strict
    assert "Traceback" not in err and "refused: 1 request refused as sent (HTTP 400: bad " \
                                      "\ufffd input)" in err
    assert "refused: 1 error HTTP 400: bad \ufffd input" in batch.stdout.decode("utf-8")
    for options in ([], ["--json"]):
        shown = subprocess.run([*COMMAND, "report", str(output), *options],
                               capture_output=True, timeout=60)
        # stderr says only whether the file is complete for its plan
        assert shown.returncode == 0 and [
            line.split(b": ")[-1].split(b" of its plan")[0]
            for line in shown.stderr.splitlines()] == [b"every unit"], shown.stderr
        shown.stdout.decode("utf-8")
    summary = json.loads(shown.stdout)
    assert summary["refused"]["reasons"] == [
        {"outcome": "error", "status": 400, "reason": "HTTP 400: bad \ud800 input", "count": 1}]


def _library_sends(text: str) -> bool:
    """Whether fanout's request path takes ``text`` (a lone surrogate is no UTF-8)."""
    messages = [{"role": "user", "content": text}]
    try:
        content_key("", "m", messages, {})
        httpx.Request("POST", "http://127.0.0.1/", json={"messages": messages})
    except UnicodeEncodeError:
        return False
    return True


def test_a_prompt_with_a_lone_surrogate(tmp_path: Path) -> None:
    # mock/echo sends the prompt back: a lone surrogate in it would come back.  The
    # request itself cannot be sent today (UTF-8 cannot carry it): a bad line, found
    # before anything is sent, never a crash in the middle of a run.
    config = tmp_path / "fanout.toml"
    config.write_text('[endpoint]\nbase_url = "embedded"\n'
                      '[[models]]\nname = "echo"\nid = "mock/echo"\n')
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": "ok", "prompt": "fine"}\n'
                       f'{{"id": "s", "prompt": "say {S} back"}}\n')
    output = tmp_path / "results.jsonl"
    out, err = strict_stream(), strict_stream()
    status = run_batch(BatchOptions(prompts=str(prompts), output=str(output),
                                    config=str(config)), stdout=out, stderr=err, environ={})
    if _library_sends("\ud800"):  # the library learnt to send it: it comes back whole
        assert status == 0, read(err)
        echoed = [json.loads(line) for line in output.read_bytes().splitlines()]
        assert {row["id"]: row["text"] for row in echoed}["s"] == "say \ud800 back"
        return
    assert status == 2
    assert read(err).splitlines() == [
        f"fanout batch: {prompts}:2: cannot be sent: it holds a lone surrogate (U+D800), "
        "which is not UTF-8 text",
        f"fanout batch: {prompts}: 1 bad line; nothing was sent"]
    assert not output.exists()


# ------------------------------------------------------------- hand-written files

def _line(**fields: Any) -> bytes:
    record = {"id": "q1", "model": "m", "sample": 0, "outcome": "completed",
              "content_key": "k", **fields}
    return dumps_bytes(record)


def test_report_shows_hostile_text_inert(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    path.write_bytes(
        _line(model="m\ud800\x1b[31m", text="a\ud800")
        + _line(id="q\udfff", model="m\ud800\x1b[31m", outcome="error", status=500,
                reason="HTTP 500: \x1b]0;title\x07bad \ud800\u202e\x9b2J")
        + _line(id=2, model="\u202eevil", outcome="timed_out", reason=None))
    out, err = strict_stream(), strict_stream()
    assert report(str(path), as_json=False, stdout=out, stderr=err) == 0
    shown = read(out)
    assert "m\ufffd" in shown and "bad \ufffd" in shown and "evil" in shown
    for bad in ("\x1b", "\u202e", "\x9b", "\x07", "\ud800"):
        assert bad not in shown
    assert read(err) == ""
    out = strict_stream()
    assert report(str(path), as_json=True, stdout=out) == 0
    summary = json.loads(read(out))
    assert summary["m\ud800\x1b[31m"]["reasons"][0]["reason"].endswith("bad \ud800\u202e\x9b2J")
    assert read(out).isascii()  # and so safe for any terminal


def test_printable() -> None:
    assert printable("a\ud800b\udfff") == "a\ufffdb\ufffd"
    assert printable("\x1b[2Jx\u202ey\x9b1m") == "xy"
    assert printable("plain é 👍") == "plain é 👍"


# -------------------------------------------------------------------- 9: report

@pytest.mark.parametrize(("content", "status", "lines"), [
    (b"", 1, ["no records (the file is empty)"]),
    (b"\n\n", 1, ["no records"]),
    (b'{"id": "q1", "prompt": "What is 2 + 2?"}\n{"id": "q2", "prompt": "Hi"}\n', 2,
     ["2 lines are not fanout records: lines 1, 2 (line 1: no model, sample, outcome, "
      "content_key)",
      "not a fanout results file: no line is a record (an object with id, model, sample, "
      "outcome and content_key)"]),
    (b"caf\xe9\n\xff\xfe\x00\n", 2,
     ["2 lines are not UTF-8 text: lines 1, 2",
      "not a fanout results file: no line is a record (an object with id, model, sample, "
      "outcome and content_key)"]),
    (b'{"id":"q1","model":"fa', 1,
     ["ignored a torn last line (22 bytes, from an interrupted run)", "no records"]),
    (_line() + b"oops\n" + _line(id="q2", outcome="nope") + b"[1]\n" + _line(id="q3")
     + b'{"id":"q4","mo', 0,
     ["1 line is not JSON: line 2",
      "2 lines are not fanout records: lines 3, 4 (line 3: outcome is 'nope', not one of "
      "completed, truncated, error, timed_out, cancelled)",
      "ignored a torn last line (14 bytes, from an interrupted run)"]),
])
def test_report_says_what_it_could_not_read(tmp_path: Path, content: bytes, status: int,
                                            lines: list[str]) -> None:
    path = tmp_path / "results.jsonl"
    path.write_bytes(content)
    out, err = io.StringIO(), io.StringIO()
    assert report(str(path), as_json=False, stdout=out, stderr=err) == status
    assert err.getvalue().splitlines() == [f"fanout report: {path}: {line}" for line in lines]
    assert ("model" in out.getvalue()) is (status == 0)  # a table only of something


def test_report_lists_at_most_ten_line_numbers_a_kind(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    path.write_bytes(_line() + b"x\n" * 25)
    err = io.StringIO()
    assert report(str(path), as_json=True, stdout=io.StringIO(), stderr=err) == 0
    assert err.getvalue() == (f"fanout report: {path}: 25 lines are not JSON: lines 2, 3, 4, "
                              "5, 6, 7, 8, 9, 10, 11, …\n")


def test_report_of_a_missing_or_unreadable_path(tmp_path: Path) -> None:
    err = io.StringIO()
    assert report(str(tmp_path / "none.jsonl"), as_json=False, stderr=err) == 2
    assert report(str(tmp_path), as_json=False, stderr=err) == 2
    assert err.getvalue().splitlines() == [
        f"fanout report: {tmp_path / 'none.jsonl'}: no such file",
        f"fanout report: {tmp_path}: cannot read: Is a directory"]


def test_report_on_the_command_line_exits_non_zero_on_nothing(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_bytes(b"")
    done = subprocess.run([*COMMAND, "report", str(path)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == f"fanout report: {path}: no records (the file is empty)\n"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(min_value=2**64)
    | st.floats(allow_nan=False) | st.text(max_size=5)
    | st.sampled_from(["completed", "error", "\ud800", "\x1b[2J", "\u202e", "HTTP 500: x"]),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.text(max_size=4) | st.sampled_from(
        ["ttft", "tokens_per_second", "prompt_tokens", "completion_tokens", "text",
         "tool_calls", "reasoning"]), children, max_size=3),
    max_leaves=8)
FIELDS = ("id", "model", "sample", "outcome", "content_key", "metrics", "usage", "flags",
          "choices", "cut", "reason", "status", "rate_limited", "retry_wait", "error", "text")
VALID = {"id": st.sampled_from(["q1", "q2", 3]), "model": st.sampled_from(["a", "b\ud800"]),
         "sample": st.integers(0, 2),
         "outcome": st.sampled_from(["completed", "error", "truncated", "timed_out",
                                     "cancelled"]),
         "content_key": st.just("k")}


@st.composite
def records(draw: st.DrawFn) -> dict[str, Any]:
    record: dict[str, Any] = {}
    for field in FIELDS:
        choice = draw(st.integers(0, 9))
        if choice == 0:
            continue  # missing
        if field in VALID and choice < 8:
            record[field] = draw(VALID[field])
        else:
            record[field] = draw(json_values)
    return record


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(records(), max_size=8))
def test_report_never_crashes_on_a_record_shape(tmp_path: Path,
                                                rows: list[dict[str, Any]]) -> None:
    path = tmp_path / "fuzz.jsonl"
    path.write_bytes(b"".join(dumps_bytes(row) for row in rows))
    for as_json in (False, True):
        out, err = strict_stream(), strict_stream()
        status = report(str(path), as_json=as_json, stdout=out, stderr=err)
        assert status in (0, 1, 2)
        read(out), read(err)  # valid UTF-8
        if status == 0 and as_json:
            summary = json.loads(read(out))
            assert all(isinstance(row["runs"], int) for row in summary.values())
    os.unlink(path)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from(FIELDS), json_values), max_size=5))
def test_the_summary_takes_any_record_of_the_right_shape(rows: list[dict[str, Any]]) -> None:
    shaped = [{**row, "id": "q", "model": "m", "sample": 0, "outcome": "error",
               "content_key": "k"} for row in rows]
    model_summary(shaped)


def test_every_line_of_a_config_error_is_printed(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import fanout.batch.runner as batch_module
    from fanout import ConfigError

    def broken(path: str | None) -> None:
        raise ConfigError("c.toml: [[models]] 1: no id\nc.toml: [deadlines] idle: must be "
                          "a number\x1b[2J\nc.toml: [concurrency] max: must be >= 1")

    monkeypatch.setattr(batch_module, "load_config", broken)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": 1, "prompt": "x"}\n')
    err = io.StringIO()
    status = run_batch(BatchOptions(prompts=str(prompts), output=str(tmp_path / "r.jsonl")),
                       stdout=io.StringIO(), stderr=err, environ={})
    assert status == 2
    assert err.getvalue().splitlines() == [
        "fanout batch: c.toml: [[models]] 1: no id",
        "fanout batch: c.toml: [deadlines] idle: must be a number",
        "fanout batch: c.toml: [concurrency] max: must be >= 1"]
    assert not (tmp_path / "r.jsonl").exists()


def test_a_config_with_several_mistakes_through_the_command_line(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('[deadlines]\nidel = 3\n[concurrency]\nmax = 0\n[[models]]\nname = "a"\n')
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": 1, "prompt": "x"}\n')
    done = subprocess.run([*COMMAND, "batch", str(prompts), "-o", str(tmp_path / "r.jsonl"),
                           "--config", str(config)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert len(lines) == 3 and all(line.startswith(f"fanout batch: {config}: ")
                                   for line in lines), lines
    assert "unknown key 'idel'" in lines[0] and "id is missing" in lines[2]


def test_a_model_whose_params_json_cannot_carry(tmp_path: Path) -> None:
    config = tmp_path / "fanout.toml"
    config.write_text('[endpoint]\nbase_url = "embedded"\n'
                      '[[models]]\nname = "odd"\nid = "mock/fast"\nparams = { temperature = nan }\n')
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": 1, "prompt": "x"}\n{"id": 2, "prompt": "y", "params": {"top_p": '
                       'NaN}}\n')
    err = io.StringIO()
    status = run_batch(BatchOptions(prompts=str(prompts), output=str(tmp_path / "r.jsonl"),
                                    config=str(config)), stdout=io.StringIO(), stderr=err,
                       environ={})
    assert status == 2
    line, = err.getvalue().splitlines()  # (the stdlib's wording varies by version)
    assert line.startswith("fanout batch: model 'odd': its params cannot be sent (not JSON: "
                           "Out of range float values are not JSON compliant")
    assert line.endswith("; nothing was sent")
    config.write_text('[endpoint]\nbase_url = "embedded"\n'
                      '[[models]]\nname = "fine"\nid = "mock/fast"\n')
    err = io.StringIO()
    status = run_batch(BatchOptions(prompts=str(prompts), output=str(tmp_path / "r.jsonl"),
                                    config=str(config)), stdout=io.StringIO(), stderr=err,
                       environ={})
    assert status == 2
    lines = err.getvalue().splitlines()
    assert len(lines) == 2 and lines[0].startswith(
        f"fanout batch: {prompts}:2: cannot be sent: not JSON: Out of range float values are "
        "not JSON compliant")
    assert lines[1] == f"fanout batch: {prompts}: 1 bad line; nothing was sent"
    assert not (tmp_path / "r.jsonl").exists()
