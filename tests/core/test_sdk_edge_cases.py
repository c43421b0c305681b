"""Inputs where the official SDK's streaming path is known to go wrong, end to end.

Each one goes through parse_stream on every split of its bytes.
"""

from __future__ import annotations

import json

from fanout import Outcome, StreamResult, parse_stream
from tests.helpers import chunk, delta, every_split, sse_body


def parse_every_way(body: bytes) -> StreamResult:
    results = [parse_stream(chunks) for chunks in every_split(body)]
    assert all(r == results[0] for r in results[1:])
    return results[0]


def test_bom_before_the_first_event() -> None:
    result = parse_every_way(b"\xef\xbb\xbf" + sse_body(chunk(delta(0, "stop", content="hi"))))
    assert (result.outcome, result.text, result.skipped_frames) == (Outcome.COMPLETED, "hi", 0)


def test_event_ping_without_data_is_not_a_frame() -> None:
    body = b"event: ping\n\n" + sse_body(chunk(delta(content="a")))
    result = parse_every_way(body)
    assert (result.text, result.skipped_frames, result.events) == ("a", 0, 2)


def test_retry_only_block_is_not_a_frame() -> None:
    result = parse_every_way(b"retry: 3000\n\n" + sse_body(chunk(delta(content="a"))))
    assert (result.text, result.skipped_frames, result.events) == ("a", 0, 2)


def test_id_only_blocks_are_not_frames() -> None:
    body = b"id: 1\n\n" + sse_body(chunk(delta(0, "stop", content="a"))) + b"id: 2\n\n"
    result = parse_every_way(body)
    assert (result.outcome, result.text, result.skipped_frames) == (Outcome.COMPLETED, "a", 0)


def test_invalid_utf8_is_replaced_not_fatal() -> None:
    good = ("data: " + json.dumps(chunk(delta(0, "stop", content="é")), ensure_ascii=False)
            + "\n\ndata: [DONE]\n\n").encode()
    bad = good.replace("é".encode(), b"\xc3\x28")  # a broken two-byte sequence
    assert bad != good
    result = parse_every_way(bad)
    assert (result.outcome, result.text) == (Outcome.COMPLETED, "\ufffd(")


def test_sparse_tool_indexes() -> None:
    calls = [{"index": 0, "id": "a", "function": {"name": "f", "arguments": "{}"}},
             {"index": 2, "id": "c", "function": {"name": "h", "arguments": "[]"}}]
    result = parse_every_way(sse_body(*(chunk(delta(tool_calls=[c])) for c in calls)))
    assert [(t.index, t.id, t.parsed) for t in result.choices[0].tool_calls] == [
        (0, "a", {}), (2, "c", [])]


def test_n2_with_choice_one_first() -> None:
    body = sse_body(chunk(delta(1, content="one")), chunk(delta(0, content="zero")),
                    chunk(delta(1, "stop"), delta(0, "length")))
    result = parse_every_way(body)
    assert [(c.index, c.text, c.finish_reason) for c in result.choices] == [
        (0, "zero", "length"), (1, "one", "stop")]


def test_repeated_tool_call_id_and_name() -> None:
    repeated = {"index": 0, "id": "call_9", "type": "function"}
    frames = [chunk(delta(tool_calls=[{**repeated, "function": {"name": "f", "arguments": a}}]))
              for a in ['{"a"', ": 1", "}"]]
    [call] = parse_every_way(sse_body(*frames)).choices[0].tool_calls
    assert (call.id, call.type, call.name, call.parsed) == ("call_9", "function", "f", {"a": 1})


def test_usage_not_overwritten_by_a_later_null() -> None:
    usage = {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}
    body = sse_body(chunk(delta(content="a"), usage=usage), chunk(delta(0, "stop"), usage=None))
    result = parse_every_way(body)
    assert result.usage is not None and result.usage.total_tokens == 12


def test_usage_chunk_after_finish_reason() -> None:
    usage = {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}
    body = sse_body(chunk(delta(0, "stop", content="a")), chunk(usage=usage))
    result = parse_every_way(body)
    assert (result.choices[0].finish_reason, result.usage and result.usage.total_tokens) == (
        "stop", 12)


def test_content_with_line_separator_characters() -> None:
    # aiter_lines()/str.splitlines() would break this JSON at U+2028 and U+0085.
    text = "a\u2028b\x85c"
    body = ("data: " + json.dumps(chunk(delta(content=text)), ensure_ascii=False)
            + "\n\ndata: [DONE]\n\n").encode()
    assert parse_every_way(body).text == text


def test_stream_without_done_is_never_complete() -> None:
    result = parse_every_way(sse_body(chunk(delta(0, "stop", content="all")), done=False))
    assert (result.outcome, result.text, result.all_choices_finished) == (
        Outcome.TRUNCATED, "all", True)
