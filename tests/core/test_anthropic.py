"""The Anthropic Messages dialect: each event type, each end-of-stream rule, each fault."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fanout import (
    ErrorReported,
    Flag,
    FrameSkipped,
    MalformedFrame,
    Outcome,
    StreamError,
    StreamParser,
    StreamResult,
    TextDelta,
    ToolCallDelta,
    parse_stream,
)
from fanout.core.anthropic import STOP_REASONS, AnthropicInterpreter
from fanout.core.events import (
    ChoiceFinished,
    ChoiceRole,
    DoneReceived,
    ReasoningDelta,
    ResponseInfo,
    ThinkingBlockFinished,
    UsageReported,
)
from fanout.core.result import ThinkingBlock, Usage
from fanout.core.sse import ServerSentEvent
from fanout.records import event_record, result_record
from tests.helpers import every_split
from tests.strategies import Rendering, serialize

KEY = "sk-ant-SECRET-0123456789"


def start(input_tokens: int = 10, **usage: int) -> dict[str, Any]:
    return {"type": "message_start", "message": {
        "id": "msg_01", "type": "message", "role": "assistant", "model": "claude-x",
        "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": 1, **usage}}}


def block_start(index: int, kind: str = "text", **fields: Any) -> dict[str, Any]:
    block: dict[str, Any] = {"type": kind}
    block.update({"text": ""} if kind == "text" else {})
    block.update(fields)
    return {"type": "content_block_start", "index": index, "content_block": block}


def text(index: int, piece: str) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index,
            "delta": {"type": "text_delta", "text": piece}}


def json_delta(index: int, piece: str) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index,
            "delta": {"type": "input_json_delta", "partial_json": piece}}


def stop(index: int) -> dict[str, Any]:
    return {"type": "content_block_stop", "index": index}


def message_delta(reason: str | None = "end_turn", output_tokens: int = 5,
                  **usage: int) -> dict[str, Any]:
    return {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": None},
            "usage": {"output_tokens": output_tokens, **usage}}


END = {"type": "message_stop"}
PING = {"type": "ping"}


def body(*frames: Any, named: bool = True) -> bytes:
    return serialize(list(frames), Rendering(named=named))


def hello(*pieces: str) -> list[Any]:
    return [start(), block_start(0), *(text(0, p) for p in pieces), stop(0), message_delta(), END]


def parse(*frames: Any, named: bool = True, **kwargs: Any) -> StreamResult:
    return parse_stream([body(*frames, named=named)], api="anthropic", **kwargs)


def test_a_text_stream_gives_every_event_in_order() -> None:
    parser = StreamParser(api="anthropic", stream="s")
    events = parser.feed(body(*hello("Hel", "lo")))
    assert events == [
        ResponseInfo("msg_01", "claude-x", None, "s"),
        ChoiceRole(0, "assistant", "s"),
        UsageReported(Usage(10, 1, 11, {"input_tokens": 10, "output_tokens": 1}), "s"),
        TextDelta(0, "Hel", "s"),
        TextDelta(0, "lo", "s"),
        ChoiceFinished(0, "stop", "s", native_finish_reason="end_turn"),
        UsageReported(Usage(10, 5, 15, {"input_tokens": 10, "output_tokens": 5}), "s"),
        DoneReceived("s"),
    ]
    assert parser.done and parser.api == "anthropic"
    parser.close()
    result = parser.result()
    assert (result.outcome, result.text, result.reason, result.flags) == (
        Outcome.COMPLETED, "Hello", None, ())
    assert (result.response_id, result.model, result.events) == ("msg_01", "claude-x", 7)
    assert result.choices[0].native_finish_reason == "end_turn"


@pytest.mark.parametrize(("native", "mapped"), [
    ("end_turn", "stop"), ("stop_sequence", "stop"), ("max_tokens", "length"),
    ("tool_use", "tool_calls"), ("refusal", "content_filter"),
    ("model_context_window_exceeded", "length"),
    ("pause_turn", "pause_turn"),  # no chat equivalent: kept as sent
    ("a_new_reason", "a_new_reason"),
])
def test_stop_reasons_map_to_the_chat_vocabulary_with_the_original_kept(native: str,
                                                                        mapped: str) -> None:
    frames = hello("x")
    frames[-2] = message_delta(native)
    result = parse(*frames)
    assert result.outcome is Outcome.COMPLETED
    assert (result.choices[0].finish_reason, result.choices[0].native_finish_reason) == (
        mapped, native)
    assert STOP_REASONS.get(native, native) == mapped


def test_no_message_stop_is_truncated_with_the_partial_output() -> None:
    result = parse(*hello("par", "tial")[:-1])
    assert (result.outcome, result.text) == (Outcome.TRUNCATED, "partial")
    assert result.reason == "the body ended after 6 events without message_stop"
    assert result.choices[0].finish_reason == "stop"  # the stop reason came; the end did not


def test_cut_inside_a_block_is_truncated() -> None:
    raw = body(*hello("abc", "def"))
    cut = raw[: raw.index(b"def") + 1]
    result = parse_stream([cut], api="anthropic")
    assert (result.outcome, result.text, result.pending_event) == (Outcome.TRUNCATED, "abc", True)
    assert result.reason == ("the body ended after 3 events without message_stop, "
                             "inside an unfinished event")


def test_message_stop_without_a_stop_reason_is_truncated() -> None:
    frames = hello("x")
    del frames[-2]
    result = parse(*frames)
    assert result.outcome is Outcome.TRUNCATED
    assert result.reason == ("message_stop arrived but no choice had a finish reason "
                             "(the server cut the stream)")
    relaxed = parse(*frames, require_finish_reason=False)
    assert (relaxed.outcome, relaxed.flags) == (Outcome.COMPLETED, (Flag.NO_FINISH_REASON,))


def test_pings_only_are_keep_alives_not_frames() -> None:
    result = parse(PING, PING, PING)
    assert (result.outcome, result.skipped_frames, result.ignored_events) == (
        Outcome.TRUNCATED, 0, 0)
    assert result.reason == "the body ended after 3 events without message_stop"
    with_pings = parse(*hello("a")[:3], PING, *hello("a")[3:])
    assert (with_pings.outcome, with_pings.text, with_pings.skipped_frames) == (
        Outcome.COMPLETED, "a", 0)


def test_an_empty_answer_completes_flagged() -> None:
    result = parse(start(), message_delta(), END)
    assert (result.outcome, result.flags) == (Outcome.COMPLETED, (Flag.EMPTY_ANSWER,))


OVERLOADED = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}


@pytest.mark.parametrize("named", [True, False])
def test_an_error_after_content_is_an_error_with_the_text_kept(named: bool) -> None:
    frames = [start(), block_start(0), text(0, "half an ans"), OVERLOADED]
    result = parse(*frames, named=named)
    assert (result.outcome, result.text) == (Outcome.ERROR, "half an ans")
    assert result.error == StreamError("Overloaded", "overloaded_error", "overloaded_error")
    assert result.reason == "Overloaded"


def test_an_error_before_content() -> None:
    parser = StreamParser(api="anthropic")
    events = parser.feed(b"event: error\ndata: " + json.dumps(OVERLOADED).encode() + b"\n\n")
    assert events == [ErrorReported(StreamError("Overloaded", "overloaded_error",
                                                "overloaded_error"))]
    assert parser.result().outcome is Outcome.ERROR
    assert not parser.result().has_output


def test_an_error_event_that_is_not_json_keeps_its_text() -> None:
    result = parse_stream([b"event: error\ndata: upstream exploded\n\n"], api="anthropic")
    assert (result.outcome, result.error) == (Outcome.ERROR, StreamError("upstream exploded"))


def test_the_key_is_redacted_from_error_messages_and_text() -> None:
    leaky = {"type": "error", "error": {"type": "api_error", "message": f"bad key {KEY}"}}
    result = parse(start(), block_start(0), text(0, f"echo {KEY}"), leaky, secrets=[KEY])
    assert result.error is not None
    assert result.error.message == "bad key ***"
    assert result.text == "echo ***"
    escaped = body(start(), leaky).replace(b"sk-", b"\\u0073k-")
    hidden = parse_stream([escaped], api="anthropic", secrets=[KEY])
    assert hidden.error is not None and KEY not in hidden.error.message


def test_malformed_frames_are_skipped_or_raise_in_strict_mode() -> None:
    frames = hello("a")
    raw = body(*frames[:3]) + b"data: {not json\n\n" + b"data: [1, 2]\n\n" + body(*frames[3:])
    result = parse_stream([raw], api="anthropic")
    assert (result.outcome, result.text, result.skipped_frames) == (Outcome.COMPLETED, "a", 2)
    assert result.flags == (Flag.SKIPPED_FRAMES,)
    assert result.skip_reasons[1] == "JSON list, not an object"
    with pytest.raises(MalformedFrame):
        parse_stream([raw], api="anthropic", strict=True)


def test_unknown_event_and_delta_types_are_counted_and_ignored() -> None:
    citation = {"type": "content_block_delta", "index": 0,
                "delta": {"type": "citations_delta", "citation": {"cited_text": "x"}}}
    frames = [start(), {"type": "message_future", "x": 1}, block_start(0), citation,
              text(0, "a"), stop(0), message_delta(), END]
    result = parse(*frames)
    assert (result.outcome, result.text, result.skipped_frames, result.ignored_events) == (
        Outcome.COMPLETED, "a", 0, 2)


def test_server_tool_blocks_are_not_client_tool_calls() -> None:
    frames = [start(), block_start(0, "server_tool_use", id="srvtoolu_1", name="web_search",
                                   input={}),
              json_delta(0, '{"query": "x"}'), stop(0),
              block_start(1, "web_search_tool_result", tool_use_id="srvtoolu_1", content=[]),
              stop(1), block_start(2), text(2, "found"), stop(2), message_delta(), END]
    result = parse(*frames)
    assert (result.outcome, result.text, result.choices[0].tool_calls) == (
        Outcome.COMPLETED, "found", ())
    assert (result.ignored_events, result.skipped_frames) == (3, 0)


def test_a_delta_for_a_block_never_started_is_skipped_not_merged() -> None:
    # (a text or thinking delta opens its block: tests/core/test_dialects_real.py)
    lost = {"type": "content_block_delta", "index": 1,
            "delta": {"type": "signature_delta", "signature": "LOST"}}
    frames = [start(), block_start(0), text(0, "a"), lost, json_delta(2, "{}"),
              stop(0), stop(3), message_delta(), END]
    result = parse(*frames)
    assert (result.outcome, result.text, result.choices[0].tool_calls) == (
        Outcome.COMPLETED, "a", ())
    assert result.skip_reasons == (
        "content_block_delta for block 1, which was never started",
        "content_block_delta for block 2, which was never started",
        "content_block_stop for block 3, which was never started",
    )


def test_a_delta_after_its_block_stopped_is_skipped() -> None:
    result = parse(start(), block_start(0), text(0, "a"), stop(0), text(0, "late"), stop(0),
                   message_delta(), END)
    assert (result.text, result.skipped_frames, result.ignored_events) == ("a", 1, 1)
    assert result.skip_reasons == ("content_block_delta for block 0 after its "
                                   "content_block_stop",)


def test_a_delta_of_the_wrong_kind_for_its_block_is_skipped() -> None:
    tool = block_start(0, "tool_use", id="toolu_1", name="f", input={})
    result = parse(start(), tool, text(0, "not args"), json_delta(0, '{"a": 1}'), stop(0),
                   message_delta("tool_use"), END)
    [call] = result.choices[0].tool_calls
    assert (call.arguments, result.text) == ('{"a": 1}', "")
    assert result.skip_reasons == ("text_delta for block 0, a tool_use block",)


def test_blocks_out_of_order_are_kept_per_index() -> None:
    frames = [start(), block_start(1), block_start(0, "tool_use", id="t0", name="f", input={}),
              text(1, "x"), json_delta(0, '{"a":'), text(1, "y"), json_delta(0, "1}"),
              stop(1), stop(0), message_delta("tool_use"), END]
    result = parse(*frames)
    [call] = result.choices[0].tool_calls
    assert (result.text, call.id, call.parsed, result.skipped_frames) == ("xy", "t0", {"a": 1}, 0)


def test_a_repeated_block_start_is_ignored_a_different_one_replaces_without_merging() -> None:
    first = block_start(0, "tool_use", id="t_a", name="a", input={})
    second = block_start(0, "tool_use", id="t_b", name="b", input={})
    frames = [start(), first, json_delta(0, '{"x":'), first, json_delta(0, " 1}"),
              second, json_delta(0, '{"y": 2}'), stop(0), message_delta("tool_use"), END]
    result = parse(*frames)
    calls = result.choices[0].tool_calls
    assert [(c.index, c.id, c.name, c.parsed) for c in calls] == [
        (0, "t_a", "a", {"x": 1}), (1, "t_b", "b", {"y": 2})]
    assert (result.ignored_events, result.skipped_frames) == (1, 0)


def test_an_index_reused_after_its_stop_opens_a_new_block() -> None:
    frames = [start(), block_start(0), text(0, "see: "), stop(0),
              block_start(0, "tool_use", id="t", name="f", input={}), json_delta(0, "[1]"),
              stop(0), block_start(0), text(0, " done"), stop(0),
              message_delta("tool_use"), END]
    result = parse(*frames)
    assert (result.text, [c.parsed for c in result.choices[0].tool_calls]) == (
        "see:  done", [[1]])


def test_the_same_tool_started_again_after_its_stop_is_not_a_second_call() -> None:
    tool = block_start(0, "tool_use", id="t", name="f", input={})
    result = parse(start(), tool, json_delta(0, "[1]"), stop(0), tool, json_delta(0, "[1]"),
                   stop(0), message_delta("tool_use"), END)
    assert [(c.id, c.parsed) for c in result.choices[0].tool_calls] == [("t", [1])]
    # the second block repeats the whole call (its arguments were already JSON): dropped,
    # counted once; a block that continues a call is tests/core/test_split_calls.py's
    assert (result.ignored_events, result.skipped_frames) == (1, 0)


def test_tool_arguments_split_mid_escape_on_every_split() -> None:
    arguments = json.dumps({"q": 'caf\u00e9 "quoted" \\ \U0001f44d\n'}, ensure_ascii=True)
    cut = arguments.index("\\u00e9") + 3  # inside the escape
    frames = [start(), block_start(0, "tool_use", id="t", name="f", input={}),
              json_delta(0, arguments[:cut]), json_delta(0, arguments[cut:]), stop(0),
              message_delta("tool_use"), END]
    raw = body(*frames)
    results = [parse_stream(chunks, api="anthropic") for chunks in every_split(raw)]
    assert all(r == results[0] for r in results)
    [call] = results[0].choices[0].tool_calls
    assert (call.arguments, call.parsed) == (arguments, json.loads(arguments))
    assert results[0].choices[0].finish_reason == "tool_calls"


def test_tool_input_given_whole_in_the_start_or_empty() -> None:
    whole = block_start(0, "tool_use", id="t0", name="f", input={"city": "Paris"})
    empty = block_start(1, "tool_use", id="t1", name="g", input={})
    result = parse(start(), whole, json_delta(0, '{"city": "Rome"}'), stop(0), empty, stop(1),
                   message_delta("tool_use"), END)
    calls = result.choices[0].tool_calls
    assert [(c.id, c.name, c.parsed) for c in calls] == [("t0", "f", {"city": "Paris"}),
                                                          ("t1", "g", {})]
    assert result.skip_reasons == ("input_json_delta for block 0, whose input came whole in "
                                   "content_block_start",)


def test_thinking_with_its_signature_and_redacted_thinking() -> None:
    frames = [start(), block_start(0, "thinking", thinking="", signature=""),
              {"type": "content_block_delta", "index": 0,
               "delta": {"type": "thinking_delta", "thinking": "Let me "}},
              {"type": "content_block_delta", "index": 0,
               "delta": {"type": "thinking_delta", "thinking": "think."}},
              {"type": "content_block_delta", "index": 0,
               "delta": {"type": "signature_delta", "signature": "EqQBCkYIARgC"}},
              stop(0), block_start(1, "redacted_thinking", data="EmwKAhgBEgy3va"), stop(1),
              block_start(2), text(2, "42"), stop(2), message_delta(), END]
    parser = StreamParser(api="anthropic")
    events = parser.feed(body(*frames))
    assert [e.text for e in events if isinstance(e, ReasoningDelta)] == ["Let me ", "think."]
    finished = [e for e in events if isinstance(e, ThinkingBlockFinished)]
    blocks = (ThinkingBlock(0, "Let me think.", "EqQBCkYIARgC"),
              ThinkingBlock(1, "", None, True, "EmwKAhgBEgy3va"))
    assert tuple(e.block for e in finished) == blocks
    result = parser.result()
    choice = result.choices[0]
    assert (result.outcome, choice.text, choice.reasoning, choice.thinking) == (
        Outcome.COMPLETED, "42", "Let me think.", blocks)
    record = result_record(result)["choices"][0]
    assert record["thinking"] == [
        {"index": 0, "thinking": "Let me think.", "signature": "EqQBCkYIARgC", "redacted": False,
         "data": None},
        {"index": 1, "thinking": "", "signature": None, "redacted": True,
         "data": "EmwKAhgBEgy3va"}]
    assert record["native_finish_reason"] == "end_turn"
    assert event_record(finished[0]) == {
        "type": "thinking_block", "stream": "", "choice": 0, "index": 0,
        "thinking": "Let me think.", "signature": "EqQBCkYIARgC", "redacted": False,
        "data": None, "content_key": ""}


def test_usage_counts_cache_tokens_in_the_prompt_and_keeps_them_raw() -> None:
    frames = hello("a")
    frames[0] = start(3, cache_creation_input_tokens=100, cache_read_input_tokens=2000)
    frames[-2] = message_delta(output_tokens=42)
    result = parse(*frames)
    assert result.usage is not None
    assert (result.usage.prompt_tokens, result.usage.completion_tokens,
            result.usage.total_tokens) == (2103, 42, 2145)
    assert result.usage.raw == {"input_tokens": 3, "output_tokens": 42,
                                "cache_creation_input_tokens": 100,
                                "cache_read_input_tokens": 2000}


def test_a_message_delta_may_revise_the_input_usage() -> None:
    frames = hello("a")
    frames[-2] = message_delta(output_tokens=7, input_tokens=12)
    result = parse(*frames)
    assert result.usage is not None
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (12, 7)


def test_the_json_type_wins_over_the_event_name_which_is_the_fallback() -> None:
    # Labels that lie: the JSON type decides.
    lying = (b"event: ping\ndata: " + json.dumps(text(0, "a")).encode() + b"\n\n")
    nameless = b"event: content_block_delta\ndata: " + json.dumps(
        {"index": 0, "delta": {"type": "text_delta", "text": "b"}}).encode() + b"\n\n"
    raw = (body(start(), block_start(0)) + lying + nameless
           + body(stop(0), message_delta(), END, named=False))
    result = parse_stream([raw], api="anthropic")
    assert (result.outcome, result.text, result.skipped_frames) == (Outcome.COMPLETED, "ab", 0)
    untyped = parse_stream([b'data: {"index": 0}\n\n'], api="anthropic")
    assert untyped.skip_reasons == ("an event with neither a type nor an event name",)


def test_done_is_not_the_end_and_events_after_message_stop_are_ignored() -> None:
    result = parse_stream([body(*hello("a")[:-1]) + b"data: [DONE]\n\n"], api="anthropic")
    assert (result.outcome, result.ignored_events, result.skipped_frames) == (
        Outcome.TRUNCATED, 1, 0)
    after = parse_stream([body(*hello("a"), text(0, "more")) + b"data: [DONE]\n\n"],
                         api="anthropic")
    assert (after.outcome, after.text, after.ignored_after_done) == (Outcome.COMPLETED, "a", 2)


def test_negative_and_missing_indexes_are_skipped() -> None:
    result = parse(start(), block_start(-1), {"type": "content_block_delta",
                                              "delta": {"type": "text_delta", "text": "x"}},
                   message_delta(), END)
    assert result.skip_reasons == ("content_block_start index -1 is negative",
                                   "content_block_delta index is missing")


def test_tool_calls_and_blocks_are_capped() -> None:
    frames: list[Any] = [start()]
    for n in range(4):
        frames += [block_start(n, "tool_use", id=f"t{n}", name="f", input={}),
                   json_delta(n, "{}"), stop(n)]
    parser = StreamParser(api="anthropic", max_tool_calls=2)
    parser.feed(body(*frames, message_delta("tool_use"), END))
    result = parser.result()
    assert [c.id for c in result.choices[0].tool_calls] == ["t0", "t1"]
    assert result.skip_reasons[0] == "tool_use block 2 would be more than 2 tool calls"
    interpreter = AnthropicInterpreter(max_blocks=2)
    out: list[Any] = []
    for n in range(3):
        interpreter.interpret_into(ServerSentEvent(json.dumps(block_start(n))), out)
    assert [e.reason for e in out if isinstance(e, FrameSkipped)] == [
        "block 2 would be more than 2 content blocks"]


def test_a_whole_message_body() -> None:
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
               "content": [{"type": "thinking", "thinking": "hm", "signature": "SIG"},
                           {"type": "text", "text": "Hi"},
                           {"type": "tool_use", "id": "t", "name": "f", "input": {"a": 1}}],
               "stop_reason": "tool_use", "stop_sequence": None,
               "usage": {"input_tokens": 5, "output_tokens": 9}}
    parser = StreamParser(api="anthropic")
    parser.feed_completion(json.dumps(message).encode())
    result = parser.result()
    choice = result.choices[0]
    assert (result.outcome, result.flags) == (Outcome.COMPLETED, (Flag.NOT_STREAMED,))
    assert (choice.text, choice.reasoning, choice.finish_reason, choice.native_finish_reason) == (
        "Hi", "hm", "tool_calls", "tool_use")
    assert choice.thinking == (ThinkingBlock(0, "hm", "SIG"),)
    assert [(c.id, c.parsed) for c in choice.tool_calls] == [("t", {"a": 1})]
    assert result.usage is not None and result.usage.total_tokens == 14
    error = StreamParser(api="anthropic")
    error.feed_completion(json.dumps(OVERLOADED).encode())
    assert error.result().error == StreamError("Overloaded", "overloaded_error",
                                               "overloaded_error")
    chat_body = StreamParser(api="anthropic")
    chat_body.feed_completion(b'{"choices": []}')
    assert chat_body.result().outcome is Outcome.ERROR


def test_the_interpreter_alone() -> None:
    interpreter = AnthropicInterpreter(stream="s", content_key="k")
    events = interpreter.interpret(ServerSentEvent(json.dumps(block_start(0)),
                                                   "content_block_start"))
    assert events == []
    assert interpreter.interpret(ServerSentEvent(json.dumps(text(0, "x")))) == [
        TextDelta(0, "x", "s", "k")]
    assert interpreter.interpret(ServerSentEvent(json.dumps(
        block_start(1, "tool_use", id="t", name="f", input={})))) == [
        ToolCallDelta(0, 0, "t", "function", "f", "", "s", "k")]
