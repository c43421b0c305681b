"""The chat-chunk interpreter: one server-sent event in, normalized events out."""

from __future__ import annotations

import json

import pytest

from fanout import (
    ChatChunkInterpreter,
    ChoiceFinished,
    ChoiceRole,
    DoneReceived,
    ErrorReported,
    FrameSkipped,
    MalformedFrame,
    ReasoningDelta,
    RefusalDelta,
    ResponseInfo,
    ServerSentEvent,
    StreamError,
    TextDelta,
    ToolCallDelta,
    Usage,
    UsageReported,
)
from fanout.core.chat import error_from_payload, error_from_response
from tests.helpers import chunk, delta


def interpret(*frames: object, strict: bool = False, event: str = "message") -> list[object]:
    interpreter = ChatChunkInterpreter(strict=strict)
    out: list[object] = []
    for frame in frames:
        data = frame if isinstance(frame, str) else json.dumps(frame)
        out.extend(interpreter.interpret(ServerSentEvent(data, event)))
    return [e for e in out if not isinstance(e, ResponseInfo)]


def test_done_is_checked_before_json() -> None:
    interpreter = ChatChunkInterpreter(strict=True)  # strict: "[DONE]" must not be a bad frame
    assert interpreter.interpret(ServerSentEvent("[DONE]")) == [DoneReceived()]
    assert interpreter.done


def test_done_with_stray_whitespace() -> None:
    assert interpret(" [DONE] ") == [DoneReceived()]


def test_events_after_done_are_ignored_and_counted() -> None:
    interpreter = ChatChunkInterpreter()
    interpreter.interpret(ServerSentEvent("[DONE]"))
    assert interpreter.interpret(ServerSentEvent(json.dumps(chunk(delta(content="x"))))) == []
    assert interpreter.interpret(ServerSentEvent("[DONE]")) == []
    assert interpreter.ignored_after_done == 2


def test_content_is_kept_exactly() -> None:
    texts = ["  lead", "trail  ", "\n", " ", "a\u2028b", "👍", "\x1b[31mred", "[bold]x[/]"]
    events = interpret(*(chunk(delta(content=t)) for t in texts))
    assert events == [TextDelta(0, t) for t in texts]


@pytest.mark.parametrize("content", [None, "", 5, ["x"], {"text": "x"}])
def test_non_string_or_empty_content_renders_nothing(content: object) -> None:
    assert interpret(chunk(delta(content=content))) == []


def test_role_only_delta_reports_the_role_once() -> None:
    events = interpret(
        chunk(delta(role="assistant")), chunk(delta(role="assistant", content="a")),
        chunk(delta(1, role="assistant")),
    )
    assert events == [ChoiceRole(0, "assistant"), TextDelta(0, "a"), ChoiceRole(1, "assistant")]


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_reasoning_fields(field: str) -> None:
    assert interpret(chunk(delta(**{field: "hmm"}))) == [ReasoningDelta(0, "hmm")]


def test_reasoning_content_wins_when_a_relay_sends_both() -> None:
    frame = chunk(delta(reasoning_content="a", reasoning="a"))
    assert interpret(frame) == [ReasoningDelta(0, "a")]


def test_refusal() -> None:
    assert interpret(chunk(delta(refusal="no"))) == [RefusalDelta(0, "no")]


def test_order_within_one_delta() -> None:
    frame = chunk(delta(0, "stop", role="assistant", reasoning="r", content="c", refusal="f"))
    assert interpret(frame) == [
        ChoiceRole(0, "assistant"), ReasoningDelta(0, "r"), TextDelta(0, "c"),
        RefusalDelta(0, "f"), ChoiceFinished(0, "stop"),
    ]


def test_finish_reason_as_given() -> None:
    events = interpret(*(chunk(delta(i, r)) for i, r in enumerate(["length", "content_filter", "x"])))
    assert events == [ChoiceFinished(0, "length"), ChoiceFinished(1, "content_filter"),
                      ChoiceFinished(2, "x")]


def test_tool_call_fragments() -> None:
    calls = [
        {"index": 0, "id": "a", "type": "function", "function": {"name": "f", "arguments": ""}},
        {"index": 0, "function": {"arguments": "{\"x\""}},
        {"function": {"arguments": ":1}"}},  # no index
        {"index": 1, "function": {"arguments": {"y": 2}}},  # arguments as a JSON value
    ]
    events = interpret(*(chunk(delta(tool_calls=[c])) for c in calls))
    assert events == [
        ToolCallDelta(0, 0, "a", "function", "f", ""),
        ToolCallDelta(0, 0, None, None, None, "{\"x\""),
        ToolCallDelta(0, None, None, None, None, ":1}"),
        ToolCallDelta(0, 1, None, None, None, "{\"y\": 2}"),
    ]


def test_usage_null_is_not_reported() -> None:
    usage = {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    events = interpret(chunk(usage=usage), chunk(delta(content="x"), usage=None))
    assert events == [UsageReported(Usage(3, 4, 7, usage)), TextDelta(0, "x")]


def test_usage_chunk_with_empty_choices() -> None:
    usage = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3, "x": {"y": 1}}
    [event] = interpret(chunk(usage=usage))
    assert isinstance(event, UsageReported)
    assert event.usage.raw == usage


@pytest.mark.parametrize(
    "frame",
    [
        {"choices": [{"index": 0, "delta": None}]},
        {"choices": []},
        {"choices": None},
        {},
        {"id": "x", "choices": [{"index": 0, "delta": {}, "logprobs": None, "new": 1}], "z": 2},
    ],
)
def test_normal_chunks_that_carry_nothing(frame: dict[str, object]) -> None:
    assert interpret(frame, strict=True) == []


def test_missing_choice_index_means_zero() -> None:
    assert interpret({"choices": [{"delta": {"content": "x"}}]}) == [TextDelta(0, "x")]


def test_response_info_reported_when_it_changes() -> None:
    interpreter = ChatChunkInterpreter()
    seen = []
    for frame in [chunk(model="m"), chunk(model="m"), chunk(model="m", system_fingerprint="fp")]:
        seen += interpreter.interpret(ServerSentEvent(json.dumps(frame)))
    assert seen == [ResponseInfo("c1", "m", None), ResponseInfo("c1", "m", "fp")]


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        ("{not json", "invalid JSON"),
        ("[1, 2]", "JSON list, not an object"),
        ("\"text\"", "JSON str, not an object"),
        ("null", "JSON NoneType, not an object"),
        ("", "invalid JSON"),
    ],
)
def test_malformed_frames_are_skipped_and_reported(frame: str, reason: str) -> None:
    [event] = interpret(frame)
    assert isinstance(event, FrameSkipped)
    assert event.reason.startswith(reason)
    assert event.data == frame


def test_malformed_frame_raises_in_strict_mode() -> None:
    with pytest.raises(MalformedFrame, match="invalid JSON") as info:
        interpret("{oops", strict=True)
    assert info.value.data == "{oops"


def test_skipped_frame_excerpt_is_bounded() -> None:
    [event] = interpret("x" * 10_000)
    assert isinstance(event, FrameSkipped)
    assert len(event.data) == 200


def test_malformed_choice_is_skipped_but_siblings_kept() -> None:
    frame = {"choices": ["junk", {"index": "one", "delta": {"content": "no"}},
                         {"index": 1, "delta": {"content": "y"}}]}
    events = interpret(frame)
    assert [type(e) for e in events] == [FrameSkipped, FrameSkipped, TextDelta]
    assert events[2] == TextDelta(1, "y")


def test_lone_surrogate_escape_parses_like_the_stdlib() -> None:
    # orjson rejects it; the stdlib accepts it: fanout must agree with the stdlib.
    assert interpret('{"choices":[{"index":0,"delta":{"content":"\\ud83d"}}]}') == [
        TextDelta(0, "\ud83d")
    ]


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        ({"error": {"message": "boom", "type": "server_error", "code": 502}},
         StreamError("boom", "server_error", "502")),
        ({"error": "plain words"}, StreamError("plain words")),
        ({"message": "m", "type": "t", "code": "c"}, StreamError("m", "t", "c")),
        ({"detail": "Not Found"}, StreamError("Not Found")),
        ({"error": {"code": "x"}}, StreamError('{"error":{"code":"x"}}', None, "x")),
        ("  text  ", StreamError("text")),
        ("", StreamError("empty error payload")),
        ([1], StreamError("[1]")),
    ],
)
def test_error_shapes(payload: object, expected: StreamError) -> None:
    assert error_from_payload(payload) == expected


def test_error_key_in_a_data_frame() -> None:
    frame = {"error": {"message": "overloaded", "type": "server_error"}}
    assert interpret(frame) == [ErrorReported(StreamError("overloaded", "server_error"))]


def test_event_error_with_json_and_with_text() -> None:
    assert interpret({"message": "bad"}, event="error") == [ErrorReported(StreamError("bad"))]
    assert interpret("it broke", event="error") == [ErrorReported(StreamError("it broke"))]


def test_error_from_response_json_text_and_empty() -> None:
    body = b'{"error":{"message":"ctx","type":"invalid_request_error","code":"context_length"}}'
    assert error_from_response(400, body) == StreamError(
        "ctx", "invalid_request_error", "context_length", 400
    )
    assert error_from_response(500, b"Internal Server Error") == StreamError(
        "Internal Server Error", None, None, 500
    )
    assert error_from_response(502, b"", "Bad Gateway") == StreamError(
        "HTTP 502 Bad Gateway", None, None, 502
    )


def test_stream_and_content_key_are_on_every_event() -> None:
    interpreter = ChatChunkInterpreter(stream="s", content_key="k")
    frames = [chunk(delta(0, "stop", role="assistant", content="x",
                          tool_calls=[{"index": 0}]), usage={"total_tokens": 1}),
              {"error": "e"}, "bad", "[DONE]"]
    events = []
    for frame in frames:
        data = frame if isinstance(frame, str) else json.dumps(frame)
        events += interpreter.interpret(ServerSentEvent(data))
    assert len(events) == 9
    assert all((e.stream, e.content_key) == ("s", "k") for e in events)


def test_fanout_json_stdlib_forces_the_standard_library() -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "FANOUT_JSON": "stdlib"}
    code = "from fanout.core import _json; print(_json.BACKEND, _json.loads is _json.loads_stdlib)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.split() == ["stdlib", "True"], out.stderr


def test_what_orjson_rejects_the_stdlib_referee_decides() -> None:
    # NaN and integers beyond 64 bits: orjson refuses, json.loads accepts.
    frame = '{"choices":[{"index":0,"delta":{"content":"ok"},"logprobs":NaN}],"n":1' + "0" * 30 + "}"
    assert interpret(frame, strict=True) == [TextDelta(0, "ok")]
