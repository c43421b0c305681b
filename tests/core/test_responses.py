"""The OpenAI Responses dialect: each event type, each end-of-stream rule, each fault."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fanout import (
    ErrorReported,
    Flag,
    MalformedFrame,
    Outcome,
    StreamError,
    StreamParser,
    StreamResult,
    TextDelta,
    ToolCallDelta,
    parse_stream,
)
from fanout.core.events import (
    ChoiceFinished,
    ChoiceRole,
    DoneReceived,
    ReasoningDelta,
    RefusalDelta,
    ResponseInfo,
    UsageReported,
)
from fanout.core.responses import ResponsesInterpreter
from fanout.core.result import Usage
from fanout.core.sse import ServerSentEvent
from fanout.records import result_record
from tests.helpers import every_split
from tests.strategies import Rendering, serialize

KEY = "sk-proj-SECRET-0123456789"
RESPONSE = {"id": "resp_1", "object": "response", "model": "gpt-x", "status": "in_progress",
            "output": [], "usage": None}
USAGE = {"input_tokens": 11, "input_tokens_details": {"cached_tokens": 4}, "output_tokens": 7,
         "output_tokens_details": {"reasoning_tokens": 2}, "total_tokens": 18}


def created() -> dict[str, Any]:
    return {"type": "response.created", "response": RESPONSE}


def added(position: int, kind: str = "message", item_id: str | None = None,
          **fields: Any) -> dict[str, Any]:
    item: dict[str, Any] = {"id": item_id or f"{kind[:3]}_{position}", "type": kind, **fields}
    if kind == "message":
        item.setdefault("role", "assistant")
        item.setdefault("content", [])
    return {"type": "response.output_item.added", "output_index": position, "item": item}


def call(position: int, call_id: str = "call_1", name: str = "f") -> dict[str, Any]:
    return added(position, "function_call", f"fc_{position}", call_id=call_id, name=name,
                 arguments="")


def delta(piece: str, position: int = 0, kind: str = "output_text",
          item_id: str | None = None) -> dict[str, Any]:
    return {"type": f"response.{kind}.delta", "item_id": item_id or f"mes_{position}",
            "output_index": position, "content_index": 0, "delta": piece}


def arguments(piece: str, position: int, item_id: str | None = None) -> dict[str, Any]:
    return {"type": "response.function_call_arguments.delta",
            "item_id": item_id or f"fc_{position}", "output_index": position, "delta": piece}


def arguments_done(whole: str, position: int) -> dict[str, Any]:
    return {"type": "response.function_call_arguments.done", "item_id": f"fc_{position}",
            "output_index": position, "arguments": whole}


def item_done(position: int, kind: str = "message", **fields: Any) -> dict[str, Any]:
    frame = added(position, kind, **fields)
    frame["type"] = "response.output_item.done"
    return frame


def completed(output: list[Any] | None = None, **fields: Any) -> dict[str, Any]:
    return {"type": "response.completed", "response": {
        **RESPONSE, "status": "completed", "output": output or [], "usage": USAGE, **fields}}


def incomplete(reason: str | None) -> dict[str, Any]:
    details = {"reason": reason} if reason is not None else None
    return {"type": "response.incomplete", "response": {
        **RESPONSE, "status": "incomplete", "usage": USAGE, "incomplete_details": details}}


def body(*frames: Any, named: bool = True) -> bytes:
    return serialize(list(frames), Rendering(named=named))


def hello(*pieces: str) -> list[Any]:
    return [created(), added(0), *(delta(p) for p in pieces), item_done(0), completed()]


def parse(*frames: Any, named: bool = True, **kwargs: Any) -> StreamResult:
    return parse_stream([body(*frames, named=named)], api="responses", **kwargs)


def test_a_text_stream_gives_every_event_in_order() -> None:
    parser = StreamParser(api="responses", stream="s")
    events = parser.feed(body(*hello("Hel", "lo")))
    assert events == [
        ResponseInfo("resp_1", "gpt-x", None, "s"),
        ChoiceRole(0, "assistant", "s"),
        TextDelta(0, "Hel", "s"),
        TextDelta(0, "lo", "s"),
        UsageReported(Usage(11, 7, 18, USAGE), "s"),
        ChoiceFinished(0, "stop", "s", native_finish_reason="completed"),
        DoneReceived("s"),
    ]
    assert parser.done
    result = parser.result()
    assert (result.outcome, result.text, result.reason, result.flags) == (
        Outcome.COMPLETED, "Hello", None, ())
    assert (result.response_id, result.model) == ("resp_1", "gpt-x")
    assert result.usage is not None and result.usage.raw == USAGE
    assert result_record(result)["choices"][0]["native_finish_reason"] == "completed"


def test_no_terminal_event_is_truncated_with_the_partial_output() -> None:
    result = parse(*hello("par", "tial")[:-1])
    assert (result.outcome, result.text, result.choices[0].finish_reason) == (
        Outcome.TRUNCATED, "partial", None)
    assert result.reason == ("the body ended after 5 events without response.completed or "
                             "response.incomplete")


def test_done_does_not_end_a_responses_stream() -> None:
    result = parse_stream([body(*hello("a")[:-1]) + b"data: [DONE]\n\n"], api="responses")
    assert (result.outcome, result.text, result.ignored_events, result.skipped_frames) == (
        Outcome.TRUNCATED, "a", 1, 0)
    after = parse_stream([body(*hello("a"), delta("more")) + b"data: [DONE]\n\n"],
                         api="responses")
    assert (after.outcome, after.text, after.ignored_after_done) == (Outcome.COMPLETED, "a", 2)


@pytest.mark.parametrize(("reason", "finish", "native"), [
    ("max_output_tokens", "length", "max_output_tokens"),
    ("content_filter", "content_filter", "content_filter"),
    ("a_new_reason", "a_new_reason", "a_new_reason"),
    (None, "incomplete", "incomplete"),
])
def test_incomplete_is_completed_with_its_reason(reason: str | None, finish: str,
                                                 native: str) -> None:
    frames = hello("cut sh")
    frames[-1] = incomplete(reason)
    result = parse(*frames)
    assert (result.outcome, result.text) == (Outcome.COMPLETED, "cut sh")
    assert (result.choices[0].finish_reason, result.choices[0].native_finish_reason) == (
        finish, native)
    assert result.usage is not None and result.usage.total_tokens == 18


def test_function_calls_keyed_by_item_give_tool_calls() -> None:
    frames = [created(), call(0, "call_a", "get_weather"), call(1, "call_b", "get_time"),
              arguments('{"city":', 0), arguments('{"tz": "UTC"}', 1), arguments(' "Paris"}', 0),
              arguments_done('{"city": "Paris"}', 0), arguments_done('{"tz": "UTC"}', 1),
              item_done(0, "function_call", item_id="fc_0", call_id="call_a",
                        arguments='{"city": "Paris"}'),
              item_done(1, "function_call", item_id="fc_1", call_id="call_b",
                        arguments='{"tz": "UTC"}'),
              completed()]
    result = parse(*frames)
    choice = result.choices[0]
    assert [(c.index, c.id, c.type, c.name, c.parsed) for c in choice.tool_calls] == [
        (0, "call_a", "function", "get_weather", {"city": "Paris"}),
        (1, "call_b", "function", "get_time", {"tz": "UTC"})]
    assert (choice.finish_reason, choice.native_finish_reason, choice.role) == (
        "tool_calls", "completed", "assistant")
    assert (result.outcome, result.skipped_frames, result.ignored_events) == (
        Outcome.COMPLETED, 0, 0)


def test_fragments_are_keyed_by_output_index_when_the_item_id_is_missing() -> None:
    frames = [created(), call(0, "call_a"), call(1, "call_b"),
              {"type": "response.function_call_arguments.delta", "output_index": 1, "delta": "[2]"},
              {"type": "response.function_call_arguments.delta", "output_index": 0, "delta": "[1]"},
              completed()]
    calls = parse(*frames).choices[0].tool_calls
    assert [(c.id, c.parsed) for c in calls] == [("call_a", [1]), ("call_b", [2])]


def test_tool_arguments_split_mid_escape_on_every_split() -> None:
    whole = json.dumps({"q": 'caf\u00e9 "x" \\ \U0001f44d'}, ensure_ascii=True)
    cut = whole.index("\\u00e9") + 2
    frames = [created(), call(0), arguments(whole[:cut], 0), arguments(whole[cut:], 0),
              arguments_done(whole, 0), completed()]
    raw = body(*frames)
    results = [parse_stream(chunks, api="responses") for chunks in every_split(raw)]
    assert all(r == results[0] for r in results)
    [tool] = results[0].choices[0].tool_calls
    assert (tool.arguments, tool.parsed, results[0].skipped_frames) == (
        whole, json.loads(whole), 0)


def test_whole_arguments_are_used_when_no_fragment_came_and_checked_when_they_did() -> None:
    frames = [created(), call(0, "call_a"), arguments_done('{"a": 1}', 0),
              call(1, "call_b"), arguments('{"b": 2}', 1), arguments_done('{"b": 3}', 1),
              item_done(2, "function_call", item_id="fc_2", call_id="call_c", name="g",
                        arguments='{"c": 4}'),
              completed()]
    result = parse(*frames)
    assert [(c.id, c.parsed) for c in result.choices[0].tool_calls] == [
        ("call_a", {"a": 1}), ("call_b", {"b": 2}), ("call_c", {"c": 4})]
    assert result.skip_reasons == ("function_call_arguments.done for item 'fc_1' differs from "
                                   "its deltas (the deltas are kept)",)


def test_fragments_for_an_unknown_or_finished_call_are_skipped_not_given_to_another() -> None:
    frames = [created(), call(0, "call_a"), arguments('{"a":', 0),
              arguments('{"stray": 1}', 5, item_id="fc_nope"), arguments(" 1}", 0),
              item_done(0, "function_call", item_id="fc_0", call_id="call_a",
                        arguments='{"a": 1}'),
              arguments("{}", 0), completed()]
    result = parse(*frames)
    [tool] = result.choices[0].tool_calls
    assert tool.parsed == {"a": 1}
    assert result.skip_reasons == (
        "function_call_arguments.delta for item 'fc_nope', which was never added",
        "function_call_arguments.delta for item 'fc_0' after its output_item.done")


def test_text_for_an_item_never_added_is_kept_after_its_end_is_skipped() -> None:
    frames = [created(), delta("kept ", item_id="msg_x"), added(0), delta("a"), item_done(0),
              delta("late"), call(1), delta("text", 1, item_id="fc_1"), completed()]
    result = parse(*frames)
    assert result.text == "kept a"
    assert result.skip_reasons == (
        "output_text.delta for item 'mes_0' after its output_item.done",
        "output_text.delta for function_call item 'fc_1'")


def test_refusal_and_reasoning_deltas() -> None:
    frames = [created(), added(0, "reasoning", "rs_0", summary=[]),
              delta("plan: ", 0, "reasoning_summary_text", "rs_0"),
              delta("think", 0, "reasoning_text", "rs_0"), item_done(0, "reasoning"),
              added(1), delta("I can't", 1, "refusal", "mes_1"), item_done(1), completed()]
    parser = StreamParser(api="responses")
    events = parser.feed(body(*frames))
    assert [e for e in events if isinstance(e, ReasoningDelta | RefusalDelta)] == [
        ReasoningDelta(0, "plan: "), ReasoningDelta(0, "think"), RefusalDelta(0, "I can't")]
    choice = parser.result().choices[0]
    assert (choice.reasoning, choice.refusal, choice.text) == ("plan: think", "I can't", "")
    assert parser.result().flags == ()


def test_failed_is_an_error_with_the_partial_output() -> None:
    failed = {"type": "response.failed", "response": {
        **RESPONSE, "status": "failed",
        "error": {"code": "server_error", "message": f"The model failed ({KEY})"}}}
    result = parse(*hello("half")[:-2], failed, secrets=[KEY])
    assert (result.outcome, result.text) == (Outcome.ERROR, "half")
    assert result.error == StreamError("The model failed (***)", None, "server_error")
    bare = parse(created(), {"type": "response.failed", "response": RESPONSE})
    assert bare.error == StreamError("the response failed (response.failed)", "response.failed")


def test_the_terminal_events_status_outranks_its_type() -> None:
    """A relay bridging another API may close a cut or failed response with
    ``response.completed``: its ``response.status`` says what happened."""
    frames = hello("half")
    frames[-1] = {"type": "response.completed", "response": {
        **RESPONSE, "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"},
        "usage": USAGE}}
    cut = parse(*frames)
    assert (cut.outcome, cut.text, cut.choices[0].finish_reason,
            cut.choices[0].native_finish_reason) == (
        Outcome.COMPLETED, "half", "length", "max_output_tokens")
    frames[-1] = {"type": "response.completed", "response": {
        **RESPONSE, "status": "failed", "error": {"code": "server_error", "message": KEY}}}
    failed = parse(*frames, secrets=[KEY])
    assert (failed.outcome, failed.text, failed.error) == (
        Outcome.ERROR, "half", StreamError("***", None, "server_error"))
    frames[-1] = {"type": "response.completed", "response": {**RESPONSE, "status": "cancelled"}}
    cancelled = parse(*frames)
    assert (cancelled.outcome, cancelled.text) == (Outcome.ERROR, "half")
    assert cancelled.reason is not None and "cancelled" in cancelled.reason
    frames[-1] = {"type": "response.incomplete", "response": {**RESPONSE, "status": "failed"}}
    assert parse(*frames).outcome is Outcome.ERROR
    frames[-1] = {"type": "response.completed", "response": {**RESPONSE, "status": "completed"}}
    assert parse(*frames).outcome is Outcome.COMPLETED


@pytest.mark.parametrize("named", [True, False])
def test_an_error_event_is_an_error_with_the_key_redacted(named: bool) -> None:
    error = {"type": "error", "code": "rate_limit_exceeded", "message": f"slow down {KEY}",
             "param": None, "sequence_number": 3}
    result = parse(*hello("so far")[:3], error, named=named, secrets=[KEY])
    assert (result.outcome, result.text) == (Outcome.ERROR, "so far")
    assert result.error == StreamError("slow down ***", None, "rate_limit_exceeded")
    assert result.reason == "slow down ***"
    nested = parse_stream([b'event: error\ndata: {"error": {"message": "boom", "code": 500}}\n\n'],
                          api="responses")
    assert nested.error == StreamError("boom", None, "500")


def test_malformed_frames_are_skipped_or_raise_in_strict_mode() -> None:
    frames = hello("a")
    raw = body(*frames[:2]) + b"data: {oops\n\n" + b'data: "text"\n\n' + body(*frames[2:])
    result = parse_stream([raw], api="responses")
    assert (result.outcome, result.text, result.skipped_frames) == (Outcome.COMPLETED, "a", 2)
    assert result.flags == (Flag.SKIPPED_FRAMES,)
    assert result.skip_reasons[1] == "JSON str, not an object"
    with pytest.raises(MalformedFrame):
        parse_stream([raw], api="responses", strict=True)


def test_unknown_types_are_counted_known_markers_are_not() -> None:
    frames = [created(), {"type": "response.in_progress", "response": RESPONSE}, added(0),
              {"type": "response.content_part.added", "item_id": "mes_0", "output_index": 0,
               "content_index": 0, "part": {"type": "output_text", "text": ""}},
              {"type": "response.web_search_call.in_progress", "output_index": 1},
              {"type": "response.audio.delta", "delta": "AAAA"},
              delta("x"),
              {"type": "response.output_text.done", "item_id": "mes_0", "output_index": 0,
               "content_index": 0, "text": "x"},
              {"type": "response.output_text.annotation.added", "annotation": {}},
              item_done(0), completed()]
    result = parse(*frames)
    assert (result.outcome, result.text, result.ignored_events, result.skipped_frames) == (
        Outcome.COMPLETED, "x", 2, 0)
    assert result_record(result)["ignored_events"] == 2


def test_a_repeated_item_is_ignored_a_reused_index_opens_a_new_one() -> None:
    frames = [created(), call(0, "call_a"), call(0, "call_a"), arguments("[1]", 0),
              added(0, "function_call", "fc_other", call_id="call_b", name="g", arguments=""),
              arguments("[2]", 0, item_id="fc_other"), completed()]
    result = parse(*frames)
    assert [(c.index, c.id, c.parsed) for c in result.choices[0].tool_calls] == [
        (0, "call_a", [1]), (1, "call_b", [2])]
    assert result.ignored_events == 1


def test_the_json_type_wins_over_the_event_name_which_is_the_fallback() -> None:
    lying = b"event: response.completed\ndata: " + json.dumps(delta("a")).encode() + b"\n\n"
    nameless = (b"event: response.output_text.delta\ndata: "
                + json.dumps({"item_id": "mes_0", "output_index": 0, "delta": "b"}).encode()
                + b"\n\n")
    raw = body(created(), added(0)) + lying + nameless + body(completed(), named=False)
    result = parse_stream([raw], api="responses")
    assert (result.outcome, result.text, result.skipped_frames) == (Outcome.COMPLETED, "ab", 0)


def test_the_incomplete_event_named_only_by_the_sse_field() -> None:
    frame = incomplete("max_output_tokens")
    del frame["type"]
    raw = body(created(), added(0), delta("a")) + (
        b"event: response.incomplete\ndata: " + json.dumps(frame).encode() + b"\n\n")
    result = parse_stream([raw], api="responses")
    assert (result.outcome, result.choices[0].finish_reason) == (Outcome.COMPLETED, "length")


def test_negative_output_index_is_skipped_and_calls_are_capped() -> None:
    result = parse(created(), call(-1))
    assert result.skip_reasons == ("output_index -1 is negative",)
    parser = StreamParser(api="responses", max_tool_calls=2)
    parser.feed(body(created(), *(call(n, f"c{n}") for n in range(3)), completed()))
    capped = parser.result()
    assert [c.id for c in capped.choices[0].tool_calls] == ["c0", "c1"]
    assert capped.skip_reasons == ("function call 'fc_2' would be more than 2 tool calls",)
    items = ResponsesInterpreter(max_blocks=1)
    out: list[Any] = []
    for n in range(2):
        items.interpret_into(ServerSentEvent(json.dumps(added(n))), out)
    assert "would be more than 1 output items" in str(out[-1])


def test_a_whole_response_body() -> None:
    response = {**RESPONSE, "status": "completed", "usage": USAGE, "output": [
        {"id": "rs_1", "type": "reasoning", "summary": [{"type": "summary_text", "text": "hm"}]},
        {"id": "msg_1", "type": "message", "role": "assistant", "content": [
            {"type": "output_text", "text": "Hi", "annotations": []}]},
        {"id": "fc_1", "type": "function_call", "call_id": "call_1", "name": "f",
         "arguments": '{"a": 1}'}]}
    parser = StreamParser(api="responses")
    parser.feed_completion(json.dumps(response).encode())
    result = parser.result()
    choice = result.choices[0]
    assert (result.outcome, result.flags) == (Outcome.COMPLETED, (Flag.NOT_STREAMED,))
    assert (choice.text, choice.reasoning, choice.finish_reason) == ("Hi", "hm", "tool_calls")
    assert [(c.id, c.parsed) for c in choice.tool_calls] == [("call_1", {"a": 1})]
    assert result.usage is not None and result.usage.total_tokens == 18
    cut = StreamParser(api="responses")
    cut.feed_completion(json.dumps({**response, "status": "incomplete",
                                    "incomplete_details": {"reason": "max_output_tokens"}}
                                   ).encode())
    assert cut.result().choices[0].finish_reason == "length"
    failed = StreamParser(api="responses")
    failed.feed_completion(json.dumps({**response, "status": "failed",
                                       "error": {"code": "e", "message": "nope"}}).encode())
    assert failed.result().error == StreamError("nope", None, "e")
    error = StreamParser(api="responses")
    events = error.feed_completion(b'{"error": {"message": "bad model", "type": "invalid"}}')
    assert events == [ErrorReported(StreamError("bad model", "invalid"))]


def test_the_interpreter_alone() -> None:
    interpreter = ResponsesInterpreter(stream="s", content_key="k")
    assert interpreter.interpret(ServerSentEvent(json.dumps(call(0, "c", "f")))) == [
        ChoiceRole(0, "assistant", "s", "k"),
        ToolCallDelta(0, 0, "c", "function", "f", "", "s", "k")]
    assert interpreter.interpret(ServerSentEvent(json.dumps(arguments("{}", 0)))) == [
        ToolCallDelta(0, 0, None, None, None, "{}", "s", "k")]


def test_an_unknown_api_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="unknown api 'gemini': expected one of chat, "
                                         "responses, anthropic"):
        StreamParser(api="gemini")


def test_output_only_in_the_terminal_event_is_read_when_nothing_streamed() -> None:
    output = [{"id": "msg_1", "type": "message", "role": "assistant",
               "content": [{"type": "output_text", "text": "whole answer"}]},
              {"id": "fc_1", "type": "function_call", "call_id": "call_1", "name": "f",
               "arguments": "[1]"}]
    result = parse(created(), added(0), item_done(0), completed(output))
    choice = result.choices[0]
    assert (result.outcome, choice.text, choice.finish_reason, result.flags) == (
        Outcome.COMPLETED, "whole answer", "tool_calls", ())
    assert [(c.index, c.id, c.parsed) for c in choice.tool_calls] == [(0, "call_1", [1])]
    streamed = parse(*hello("streamed")[:-1], completed(output))  # deltas came: no replay
    # ... but of the call never announced (tests/core/test_dialects_real.py, LiteLLM #36375)
    assert (streamed.text, [c.id for c in streamed.choices[0].tool_calls]) == (
        "streamed", ["call_1"])
