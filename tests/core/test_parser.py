"""StreamParser and parse_stream: the whole pipeline, its limits and its modes."""

from __future__ import annotations

import pytest

from fanout import (
    ErrorReported,
    EventTooLarge,
    Flag,
    FrameSkipped,
    MalformedFrame,
    Outcome,
    ResponseTooLarge,
    StreamError,
    StreamParser,
    TextDelta,
    parse_stream,
)
from tests.helpers import chunk, delta, sse_body


def text_body(*texts: str, done: bool = True, finish: str | None = "stop") -> bytes:
    frames = [chunk(delta(content=t)) for t in texts]
    if finish is not None:
        frames.append(chunk(delta(0, finish)))
    return sse_body(*frames, done=done)


def test_feed_returns_the_events_already_folded() -> None:
    parser = StreamParser(stream="s")
    body = text_body("a", "b")
    events = parser.feed(body[:60])
    assert events == []
    events = parser.feed(body[60:])
    assert [e for e in events if isinstance(e, TextDelta)] == [
        TextDelta(0, "a", "s"), TextDelta(0, "b", "s")]
    assert parser.accumulator.choices()[0].text == "ab"
    assert parser.done
    parser.close()
    result = parser.result()
    assert (result.outcome, result.text, result.events, result.bytes_received) == (
        Outcome.COMPLETED, "ab", 4, len(body))  # a, b, the finish chunk, [DONE]


def test_truncated_result_reports_the_pending_event() -> None:
    body = text_body("a", "b", done=False, finish=None)
    cut = body[: body.rindex(b"\n\n")]  # the last event lost its blank line
    result = parse_stream([cut])
    assert (result.outcome, result.text, result.pending_event) == (Outcome.TRUNCATED, "a", True)
    assert result.reason == ("the body ended after 1 event without [DONE], "
                             "inside an unfinished event")
    clean = parse_stream([body])
    assert (clean.outcome, clean.text, clean.pending_event) == (Outcome.TRUNCATED, "ab", False)
    assert clean.reason == "the body ended after 2 events without [DONE]"


def test_malformed_frames_skipped_and_counted_in_resilient_mode() -> None:
    body = sse_body(chunk(delta(content="a")), "{bad", "[1]", chunk(delta(0, "stop", content="b")))
    result = parse_stream([body])
    assert (result.outcome, result.text, result.skipped_frames) == (Outcome.COMPLETED, "ab", 2)
    assert result.skip_reasons[0].startswith("invalid JSON")
    assert result.flags == (Flag.SKIPPED_FRAMES,)  # output may be missing: say so


def test_strict_mode_raises_and_keeps_what_came_before() -> None:
    parser = StreamParser(strict=True)
    with pytest.raises(MalformedFrame):
        parser.feed(sse_body(chunk(delta(content="a")), "{bad", chunk(delta(content="b"))))
    assert parser.stopped
    assert parser.feed(text_body("c")) == []
    result = parser.result()
    assert (result.outcome, result.text) == (Outcome.ERROR, "a")
    assert result.error is not None and result.error.code == "malformed_frame"
    assert "{bad" in result.error.message


def test_event_too_large_resilient_is_an_error_outcome_with_partial_text() -> None:
    parser = StreamParser(max_event_size=1000)
    events = parser.feed(text_body("ok") + b"data: " + b"x" * 5000)
    assert isinstance(events[-1], ErrorReported)
    assert events[-1].error.code == "event_too_large"
    assert parser.feed(text_body("more")) == []
    result = parser.result()
    assert (result.outcome, result.text) == (Outcome.ERROR, "ok")


def test_event_too_large_strict_raises() -> None:
    parser = StreamParser(strict=True, max_event_size=100)
    with pytest.raises(EventTooLarge):
        parser.feed(b"data: " + b"x" * 500 + b"\n\n")
    assert parser.result().outcome is Outcome.ERROR


def test_response_too_large_keeps_what_fit() -> None:
    body = text_body(*"abcdefghij")
    limit = body.index(b"\n\n", 200) + 2  # a whole number of events fits
    parser = StreamParser(max_response_bytes=limit)
    events = []
    for i in range(0, len(body), 7):
        events += parser.feed(body[i : i + 7])
    assert isinstance(events[-1], ErrorReported)
    result = parser.result()
    assert result.error is not None and result.error.code == "response_too_large"
    assert result.bytes_received == limit
    assert result.text == parse_stream([body[:limit]]).text != ""


def test_response_too_large_strict_raises() -> None:
    parser = StreamParser(strict=True, max_response_bytes=10)
    with pytest.raises(ResponseTooLarge):
        parser.feed(b"data: 12345678901234567890\n\n")


def test_http_error_status() -> None:
    body = b'{"error":{"message":"nope","type":"invalid_request_error","code":"bad"}}'
    result = parse_stream([body[:10], body[10:]], status=400)
    assert (result.outcome, result.status) == (Outcome.ERROR, 400)
    assert result.error == StreamError("nope", "invalid_request_error", "bad", 400)


def test_fail_records_the_first_error_and_stops() -> None:
    parser = StreamParser()
    parser.feed(text_body("partial", done=False))
    parser.fail(StreamError("connection reset"))
    parser.feed(text_body("late"))
    result = parser.result()
    assert (result.outcome, result.text, result.error) == (
        Outcome.ERROR, "partial", StreamError("connection reset"))


def test_close_is_idempotent() -> None:
    parser = StreamParser()
    parser.feed(text_body("a"))
    assert parser.close() == []
    assert parser.close() == []


def test_result_outcome_override() -> None:
    parser = StreamParser()
    parser.feed(text_body("a", done=False))
    assert parser.result(Outcome.TIMED_OUT).outcome is Outcome.TIMED_OUT


def test_comments_and_ignored_after_done_are_counted() -> None:
    body = b": ping\n\n" + text_body("a") + b": late\n\n" + text_body("b")
    result = parse_stream([body])
    assert (result.text, result.comments, result.ignored_after_done) == ("a", 2, 3)


def test_frame_skipped_event_is_returned() -> None:
    events = StreamParser().feed(b"data: {\n\n")
    assert [type(e) for e in events] == [FrameSkipped]


def test_json_split_over_several_data_lines() -> None:
    body = b'data: {"choices":[{"index":0,\ndata: "delta":{"content":"x"}}]}\n\ndata: [DONE]\n\n'
    assert parse_stream([body], strict=True).text == "x"
