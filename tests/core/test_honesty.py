"""The outcome contract: completed only when it was, a reason for everything else,
flags for suspicious answers, the key redacted where server text enters, one JSON
behaviour, and caps against amplification."""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fanout import (
    ChatChunkInterpreter,
    ErrorReported,
    Flag,
    FrameSkipped,
    Outcome,
    ServerSentEvent,
    StreamError,
    StreamParser,
    StreamResult,
    TextDelta,
    parse_stream,
)
from fanout.core import _json
from fanout.core.chat import MAX_CHOICES, MAX_TOOL_CALLS
from fanout.core.redact import Redactor
from fanout.core.result import is_blank
from tests.helpers import chunk, delta, every_split, sse_body

KEY = "sk-live-0123456789abcdef"


def parse_everywhere(body: bytes, **options: Any) -> StreamResult:
    results = [parse_stream(chunks, **options) for chunks in every_split(body)]
    assert all(r == results[0] for r in results[1:])
    return results[0]


# -- completed needs [DONE] and a finish reason --------------------------------------

def test_done_without_finish_reason_is_truncated_with_its_reason() -> None:
    body = sse_body(chunk(delta(role="assistant")), chunk(delta(content="Once upon")))
    result = parse_everywhere(body)
    assert (result.outcome, result.text) == (Outcome.TRUNCATED, "Once upon")
    assert result.reason == ("[DONE] arrived but no choice had a finish reason "
                             "(the server cut the stream)")
    assert result.flags == ()


def test_a_relay_known_to_omit_finish_reasons_can_opt_out() -> None:
    body = sse_body(chunk(delta(content="hi")))
    result = parse_stream([body], require_finish_reason=False)
    assert (result.outcome, result.reason, result.flags) == (
        Outcome.COMPLETED, None, (Flag.NO_FINISH_REASON,))
    # the opt-out never makes a stream without [DONE] complete
    cut = parse_stream([sse_body(chunk(delta(content="hi")), done=False)],
                       require_finish_reason=False)
    assert cut.outcome is Outcome.TRUNCATED


def test_one_finished_choice_is_enough_and_the_other_is_flagged() -> None:
    body = sse_body(chunk(delta(0, content="a")), chunk(delta(1, content="b")),
                    chunk(delta(0, "stop")))
    result = parse_everywhere(body, expect_choices=2)
    assert result.outcome is Outcome.COMPLETED
    assert result.flags == (Flag.UNFINISHED_CHOICE,)
    assert [c.finish_reason for c in result.choices] == ["stop", None]


@pytest.mark.parametrize("text", ["", "  \n", "\u3000\x1c\u2028\x85", None])
def test_a_completed_empty_answer_is_flagged(text: str | None) -> None:
    frames: list[Any] = [chunk(delta(role="assistant"))]
    if text is not None:
        frames.append(chunk(delta(content=text)))
    frames.append(chunk(delta(0, "stop")))
    result = parse_stream([sse_body(*frames)])
    assert (result.outcome, result.flags) == (Outcome.COMPLETED, (Flag.EMPTY_ANSWER,))
    assert not result.has_output


@settings(max_examples=300)
@given(text=st.text(st.sampled_from(" \t\n\r\x0b\x0c\x1c\x1f\x85\xa0\u2028\u3000\u200bxé")))
def test_blank_is_what_strip_empties(text: str) -> None:
    # (tested without a copy of the text: a strip copies a long answer whole)
    assert is_blank(text) is (not text.strip())


@pytest.mark.parametrize("field", ["reasoning_content", "refusal"])
def test_reasoning_or_refusal_alone_is_an_answer(field: str) -> None:
    result = parse_stream([sse_body(chunk(delta(0, "stop", **{field: "because"})))])
    assert (result.outcome, result.flags) == (Outcome.COMPLETED, ())


def test_a_tool_call_alone_is_an_answer() -> None:
    call = {"index": 0, "id": "c", "type": "function",
            "function": {"name": "f", "arguments": "{}"}}
    result = parse_stream([sse_body(chunk(delta(0, "tool_calls", tool_calls=[call])))])
    assert (result.outcome, result.flags) == (Outcome.COMPLETED, ())


def test_asked_for_two_choices_and_usage_and_got_neither() -> None:
    result = parse_stream([sse_body(chunk(delta(0, "stop", content="a")))], expect_choices=2,
                          expect_usage=True)
    assert result.outcome is Outcome.COMPLETED
    assert result.flags == (Flag.MISSING_CHOICES, Flag.MISSING_USAGE)
    usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    with_usage = parse_stream([sse_body(chunk(delta(0, "stop", content="a")),
                                        chunk(usage=usage))], expect_usage=True)
    assert with_usage.flags == ()


# -- a reason for every other outcome -------------------------------------------------

@pytest.mark.parametrize(("body", "reason"), [
    (b"", "the body ended before any event (empty body)"),
    (b": ping\n\n", "the body ended before any event (8 bytes)"),
    (b"data: {\"choices\"", "the body ended before any event (16 bytes)"),
    (sse_body(chunk(delta(content="a")), done=False),
     "the body ended after 1 event without [DONE]"),
    (sse_body(chunk(delta(content="a")), chunk(delta(0, "stop")), done=False)
     + b"data: {\"x\"", "the body ended after 2 events without [DONE], inside an unfinished event"),
])
def test_truncated_says_why(body: bytes, reason: str) -> None:
    result = parse_everywhere(body)
    assert (result.outcome, result.reason) == (Outcome.TRUNCATED, reason)


def test_errors_say_why_in_one_line() -> None:
    result = parse_stream([b'{"error": {"message": "context\\nlength exceeded"}}'], status=400)
    assert (result.outcome, result.reason) == (Outcome.ERROR,
                                               "HTTP 400: context length exceeded")
    in_stream = parse_stream([sse_body(chunk(delta(content="a")),
                                       {"error": {"message": "model crashed"}})])
    assert (in_stream.outcome, in_stream.reason, in_stream.text) == (
        Outcome.ERROR, "model crashed", "a")


def test_a_broken_connection_after_events_says_so() -> None:
    parser = StreamParser()
    parser.feed(sse_body(chunk(delta(content="a")), done=False))
    parser.fail(StreamError("RemoteProtocolError: peer closed connection", "transport_error"))
    result = parser.result(Outcome.TRUNCATED)
    assert result.reason == ("the connection broke after 1 event without [DONE]: "
                             "RemoteProtocolError: peer closed connection")


def test_the_io_layer_gives_its_own_reason_in_one_line() -> None:
    parser = StreamParser()
    result = parser.result(Outcome.TIMED_OUT, timed_out="idle", reason="no event\nwithin 5 s")
    assert result.reason == "no event within 5 s"


def test_the_reason_is_capped() -> None:
    result = parse_stream([b"x" * 5000], status=500)
    assert result.reason is not None and len(result.reason) <= 300


# -- bodies that are not event streams -------------------------------------------------

def test_a_json_completion_where_a_stream_was_asked_is_read_and_flagged() -> None:
    completion = {"id": "x", "object": "chat.completion", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "whole"},
         "finish_reason": "stop"}]}
    parser = StreamParser()
    parser.feed_completion(json.dumps(completion).encode())
    result = parser.result()
    assert (result.outcome, result.text, result.flags) == (
        Outcome.COMPLETED, "whole", (Flag.NOT_STREAMED,))


def test_an_html_page_is_an_error_naming_the_content_type_with_an_excerpt() -> None:
    parser = StreamParser()
    parser.status = 200
    parser.feed_completion(b"<html>\n<body>Please log in</body></html>", "text/html")
    result = parser.result()
    assert result.outcome is Outcome.ERROR
    assert result.error is not None and result.error.type == "not_event_stream"
    assert result.reason == ("not an event stream (content-type text/html): "
                             "'<html> <body>Please log in</body></html>'")


def test_a_json_error_body_sent_with_200_is_an_error() -> None:
    parser = StreamParser()
    parser.feed_completion(b'{"error": {"message": "quota exceeded", "type": "billing"}}')
    result = parser.result()
    assert (result.outcome, result.reason) == (Outcome.ERROR, "quota exceeded")


# -- the key, redacted where server text enters ---------------------------------------

ECHO_ERROR = {"error": {"message": f"bad key {KEY}", "type": KEY, "code": KEY, "param": KEY}}


def echoing_bodies() -> dict[str, tuple[bytes, int]]:
    escaped = "".join(f"\\u{ord(c):04x}" for c in KEY)
    meta = chunk(delta(content="hi"), id=KEY, model=f"m-{KEY}", system_fingerprint=KEY)
    call = {"index": 0, "id": KEY, "type": KEY, "function": {"name": KEY, "arguments": "{}"}}
    return {
        "stream error": (sse_body(chunk(delta(content="a")), ECHO_ERROR), 200),
        "event error": (b"event: error\ndata: " + json.dumps(ECHO_ERROR["error"]).encode()
                        + b"\n\n", 200),
        "event name": (f"event: {KEY}\ndata: {{}}\n\n".encode(), 200),
        "http json": (json.dumps(ECHO_ERROR).encode(), 401),
        "http text": (f"Internal error for key {KEY}".encode(), 500),
        "meta": (sse_body(meta, chunk(delta(0, "stop", tool_calls=[call]))), 200),
        "skipped": (sse_body(f"{{not json {KEY}", json.dumps(KEY),
                             chunk({"index": KEY, "delta": {}})), 200),
        "escaped": (b'data: {"error": {"message": "' + escaped.encode() + b'"}}\n\n', 200),
        "usage": (sse_body(chunk(usage={"prompt_tokens": 1, "note": KEY})), 200),
    }


@pytest.mark.parametrize("name", sorted(echoing_bodies()))
def test_an_echoed_key_never_reaches_events_or_results(name: str) -> None:
    body, status = echoing_bodies()[name]
    parser = StreamParser(secrets=[KEY], tools=[{"type": "function", "function": {
        "name": KEY, "parameters": {"type": "object"}}}])
    if status != 200:
        events: list[Any] = [parser.fail_http(status, body)]
    else:
        parser.status = status
        events = parser.feed(body)
        events += parser.close()
    result = parser.result()
    seen = repr(events) + repr(result) + str(result.reason)
    if result.usage is not None:
        seen += repr(result.usage.raw)
    assert KEY not in seen
    if name != "event name":  # an unknown event name is kept nowhere
        assert "***" in seen  # it was there, and it was replaced


def test_redaction_covers_headers_and_io_errors() -> None:
    parser = StreamParser(secrets=[KEY])
    assert parser.headers({"X-Request-Id": KEY, KEY: "v"}) == {"x-request-id": "***", "***": "v"}
    event = parser.fail(StreamError(f"ConnectError: {KEY}", KEY, KEY))
    assert KEY not in repr(event) and KEY not in repr(parser.result())
    assert KEY not in str(parser.result(Outcome.TIMED_OUT, reason=f"slow {KEY}").reason)


def test_short_secrets_are_not_redacted_and_the_redactor_never_shows_them() -> None:
    assert Redactor(["ab"]).text("abc") == "abc"
    assert KEY not in repr(Redactor([KEY]))
    assert Redactor([KEY, KEY + "-long"]).text(f"{KEY}-long") == "***"


# -- one JSON behaviour ------------------------------------------------------------------

def interpret_with(loads: Any, data: str) -> list[Any]:
    interpreter = ChatChunkInterpreter()
    interpreter._loads = loads
    return interpreter.interpret(ServerSentEvent(data))


# JSON number literals: small, around the 64-bit edges, past the double range, huge.
numbers = st.one_of(
    st.integers().map(str),
    st.integers(min_value=2**63 - 4, max_value=2**64 + 4).map(str),
    st.integers(min_value=-(2**63) - 4, max_value=-(2**63) + 4).map(str),
    st.integers(min_value=10**300, max_value=10**330).map(str),
    st.integers(1, 5000).map(lambda digits: "9" * digits),
    st.floats(allow_nan=False).map(json.dumps),
    st.sampled_from(["1e400", "-1e400", "-0", "1E2"]),
)


@settings(max_examples=300, deadline=None)
@given(index=numbers, tokens=numbers, tool_index=numbers)
def test_orjson_and_the_standard_library_agree_on_every_number(
        index: str, tokens: str, tool_index: str) -> None:
    data = ('{"choices": [{"index": ' + index + ', "delta": {"content": "a", '
            '"tool_calls": [{"index": ' + tool_index + ', "function": {"arguments": ""}}]}}],'
            ' "usage": {"completion_tokens": ' + tokens + '}}')
    orjson_path = interpret_with(_json.loads, data)
    stdlib_path = interpret_with(_json.loads_stdlib, data)
    assert repr(orjson_path) == repr(stdlib_path)


def test_integers_past_64_bits_are_floats_in_both() -> None:
    assert _json.loads_stdlib("18446744073709551616") == 1.8446744073709552e19
    assert _json.loads_stdlib("18446744073709551615") == 2**64 - 1
    assert _json.loads_stdlib("9" * 5000) == float("inf")


@pytest.mark.parametrize("error", ["null", "false", "{}", '""', "0", "[]"])
def test_an_empty_error_field_is_no_error(error: str) -> None:
    data = '{"choices": [{"index": 0, "delta": {"content": "a"}}], "error": ' + error + "}"
    events = ChatChunkInterpreter().interpret(ServerSentEvent(data))
    assert [type(e) for e in events] == [TextDelta]


@pytest.mark.parametrize("error", ['"boom"', '{"message": "boom"}', "true"])
def test_a_present_error_field_is_an_error(error: str) -> None:
    events = ChatChunkInterpreter().interpret(ServerSentEvent('{"error": ' + error + "}"))
    assert [type(e) for e in events] == [ErrorReported]


# -- caps against amplification -----------------------------------------------------------

def test_negative_indexes_are_skipped_frames() -> None:
    body = sse_body(chunk(delta(-1, content="x")), chunk({"index": 0, "delta": {
        "tool_calls": [{"index": -2, "function": {"arguments": "{}"}}]}}),
        chunk(delta(0, "stop", content="ok")))
    result = parse_stream([body])
    assert (result.outcome, [c.index for c in result.choices], result.text) == (
        Outcome.COMPLETED, [0], "ok")
    assert result.skipped_frames == 2
    assert result.skip_reasons == ("choice index -1 is negative", "tool call index -2 is negative")
    assert result.choices[0].tool_calls == ()


def test_distinct_choices_past_the_cap_are_skipped_and_counted() -> None:
    body = sse_body(*(chunk(delta(i, content="x")) for i in range(MAX_CHOICES + 50)))
    result = parse_stream([body])
    assert len(result.choices) == MAX_CHOICES
    assert result.skipped_frames == 50
    assert "more than 128 distinct choices" in result.skip_reasons[0]


def test_distinct_tool_calls_past_the_cap_are_skipped_and_counted() -> None:
    by_index = [chunk({"index": 0, "delta": {"tool_calls": [
        {"index": j, "function": {"arguments": "{}"}}]}}) for j in range(MAX_TOOL_CALLS + 5)]
    by_id = [chunk({"index": 1, "delta": {"tool_calls": [
        {"id": f"call-{j}", "function": {"name": "f", "arguments": "{}"}}]}})
        for j in range(MAX_TOOL_CALLS + 5)]
    parser = StreamParser()
    events = parser.feed(sse_body(*by_index, *by_id))
    result = parser.result()
    assert [len(c.tool_calls) for c in result.choices] == [MAX_TOOL_CALLS, MAX_TOOL_CALLS]
    assert result.skipped_frames == 10
    assert sum(isinstance(e, FrameSkipped) for e in events) == 10


def test_content_events_count_only_content() -> None:
    body = sse_body(chunk(delta(role="assistant", content="")), chunk(delta(content="a")),
                    chunk(delta(reasoning_content="r")), chunk(delta(0, "stop")),
                    chunk(usage={"completion_tokens": 2}))
    result = parse_stream([body])
    assert (result.events, result.content_events) == (6, 2)


def test_a_relays_in_band_connection_error_is_a_cut_and_nothing_else_is() -> None:
    from fanout.core.result import ChoiceResult, Outcome, StreamError, StreamResult, relayed_cut
    text = (ChoiceResult(0, text="The capital of"),)
    litellm = StreamError("litellm.APIConnectionError: APIConnectionError: OpenAIException - "
                          "Connection error.", None, "500")

    def result(error: StreamError | None, outcome: Outcome = Outcome.ERROR,
               status: int | None = 200) -> StreamResult:
        return StreamResult(outcome, choices=text, error=error, status=status)

    assert relayed_cut(result(litellm))
    assert relayed_cut(attrs.evolve(result(litellm), choices=()))  # before any output too
    assert relayed_cut(result(StreamError("upstream connect error or disconnect/reset")))
    assert not relayed_cut(result(litellm, status=500))  # an HTTP error: not in-band
    assert not relayed_cut(result(StreamError("Rate limit reached", "rate_limit_error")))
    assert not relayed_cut(result(StreamError("The model produced invalid content")))
    assert not relayed_cut(result(None, Outcome.TRUNCATED))
    assert not relayed_cut(result(litellm, Outcome.COMPLETED))
