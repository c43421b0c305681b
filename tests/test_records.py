"""Records: what --json, results files and the service hold of a result."""

from __future__ import annotations

import json
from pathlib import Path

import attrs

from fanout import Timings, parse_stream
from fanout.records import result_record, tokens_per_second
from tests.helpers import chunk, delta, sse_body


def test_estimated_rate_counts_only_chunks_that_carried_content() -> None:
    # role chunk, 5 content chunks, a finish-only chunk, [DONE]: 5 tokens, not 7
    body = sse_body(chunk(delta(role="assistant", content="")),
                    *(chunk(delta(content=f"t{i}")) for i in range(5)), chunk(delta(0, "stop")))
    result = attrs.evolve(parse_stream([body]),
                          timings=Timings(request_sent=0.0, first_content=1.0, last_event=2.0))
    assert (result.events, result.content_events) == (8, 5)
    rate, estimated = tokens_per_second(result)
    assert (rate, estimated) == (4.0, True)  # (5 - 1) tokens after the first, in 1 s


def test_the_record_carries_reason_and_flags() -> None:
    cut = result_record(parse_stream([sse_body(chunk(delta(content="a")))]))
    assert (cut["outcome"], cut["reason"], cut["flags"]) == (
        "truncated", "[DONE] arrived but no choice had a finish reason (the server cut the stream)",
        [])
    empty = result_record(parse_stream([sse_body(chunk(delta(0, "stop")))]))
    assert (empty["outcome"], empty["reason"], empty["flags"]) == (
        "completed", None, ["empty_answer"])


def test_every_record_keeps_its_own_type() -> None:
    from fanout import ErrorReported, StreamError, ToolCallDelta
    from fanout.records import event_record

    call = event_record(ToolCallDelta(0, 1, "c1", "function", "f", "{}", "s"))
    assert (call["type"], call["tool_type"], call["tool_index"]) == ("tool_call", "function", 1)
    error = event_record(ErrorReported(StreamError("boom", "server_error", "x", 500), "s"))
    assert (error["type"], error["error_type"], error["status"]) == ("error", "server_error", 500)


def test_dumps_escapes_what_a_terminal_or_an_encoder_must_not_get() -> None:
    import json

    from fanout.records import dumps, dumps_bytes

    hostile = "\x1b[2J\x9b31m\u202edlrow\u2066x\u2069\u2028\ud800 \udfff\x7f ok é 👍"
    line = dumps({"text": hostile})
    assert json.loads(line) == {"text": hostile}  # exactly the same text comes back
    assert line.isascii() is False and line.encode()  # encodable, é and 👍 kept raw
    for raw in ("\x1b", "\x9b", "\u202e", "\u2066", "\u2028", "\ud800", "\x7f"):
        assert raw not in line
    assert dumps_bytes({"text": hostile}) == (line + "\n").encode()
    assert dumps_bytes({"text": "plain"}) == b'{"text":"plain"}\n'  # the fast path


def test_real_json_output_holds_every_record_type_the_docs_list(tmp_path: Path) -> None:
    # `fanout compare --json` against embedded models that between them produce every
    # kind of event: each line parses, keeps its own type, and every listed type occurs.
    import re
    import subprocess
    import sys

    compare = (Path(__file__).parent.parent / "docs" / "compare.md").read_text()
    listed_line = next(line for line in compare.splitlines() if "`started`, `response`" in line)
    block = compare[compare.index(listed_line):compare.index("each with `stream`", compare.index(
        listed_line))]
    listed = set(re.findall(r"`([a-z_]+)`", block)) | {"result"}
    models = ["mock/reasoning", "mock/tools", "mock/refusal", "fault/garbage", "fault/429:1",
              "fault/error-event", "mock/reasoning"]
    apis = {6: "anthropic"}  # its thinking block, with its signature: a thinking_block record
    config = tmp_path / "all.toml"
    config.write_text('[endpoint]\nbase_url = "embedded"\n' + "".join(
        f'[[models]]\nname = "m{i}"\nid = "{model}"\napi = "{apis.get(i, "chat")}"\n'
        for i, model in enumerate(models)))
    picks = [arg for i in range(len(models)) for arg in ("-m", f"m{i}")]
    out = subprocess.run([sys.executable, "-m", "fanout.cli.main", "compare", "hi", "--json",
                          "--config", str(config), *picks],
                         capture_output=True, text=True, timeout=120, check=False)
    records = [json.loads(line) for line in out.stdout.splitlines()]
    seen = {record["type"] for record in records}
    assert listed <= seen, listed - seen
    assert seen <= listed, seen - listed  # no record type docs/compare.md does not name
    assert all(record["stream"] for record in records)
    assert {r["stream"] for r in records if r["type"] == "result"} == {
        f"m{i}" for i in range(len(models))}
