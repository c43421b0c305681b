"""fanout against the official SDKs' own stream accumulation, on the same bytes, offline.

``anthropic``'s ``messages.stream()`` (``MessageStream.get_final_message``) and
``openai``'s ``responses.stream()`` (``ResponseStream.get_final_response``) are
driven by an ``httpx2.MockTransport`` serving generated bodies.  Where the SDKs
are right (a whole stream) fanout must agree with them: the same text,
reasoning, tool calls, stop reason and usage.  Where they are wrong, the tests
below record what they do, next to what fanout says.
"""

from __future__ import annotations

import json
import re
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fanout import Outcome, StreamResult, parse_stream
from tests.strategies import (
    DialectStream,
    Rendering,
    Script,
    ScriptedCall,
    anthropic_frames,
    dialect_streams,
    renderings,
    responses_frames,
    serialize,
)

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")
httpx2 = pytest.importorskip("httpx2")  # both SDKs' HTTP client

SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
# What the SDKs' decoders cannot read (recorded below): a BOM, and for Anthropic's,
# events without an `event:` line.  The differential runs on bodies both can read.
sdk_renderings = renderings.map(lambda r: attrs.evolve(r, bom=False))
anthropic_renderings = sdk_renderings.map(lambda r: attrs.evolve(r, named=True))
FINISH = {"end_turn": "stop", "max_tokens": "length", "tool_use": "tool_calls",
          "refusal": "content_filter"}


def _http(body: bytes) -> Any:
    def handler(request: Any) -> Any:
        return httpx2.Response(200, headers={"content-type": "text/event-stream"},
                               content=body)

    return httpx2.Client(transport=httpx2.MockTransport(handler))


def sdk_message(body: bytes) -> Any:
    """What ``anthropic``'s ``messages.stream()`` accumulates from ``body``."""
    client = anthropic.Anthropic(api_key="k", base_url="http://relay.invalid",
                                 http_client=_http(body), max_retries=0)
    with client.messages.stream(model="m", max_tokens=64,
                                messages=[{"role": "user", "content": "hi"}]) as stream:
        return stream.get_final_message()


def sdk_response(body: bytes) -> Any:
    """What ``openai``'s ``responses.stream()`` accumulates from ``body``."""
    client = openai.OpenAI(api_key="k", base_url="http://relay.invalid/v1",
                           http_client=_http(body), max_retries=0)
    with client.responses.stream(model="m", input="hi") as stream:
        return stream.get_final_response()


def agrees_with_anthropic(result: StreamResult, message: Any) -> None:
    choice = result.choices[0]
    blocks = message.content
    assert choice.text == "".join(b.text for b in blocks if b.type == "text")
    assert choice.reasoning == "".join(b.thinking for b in blocks if b.type == "thinking")
    assert [(t.thinking, t.signature) for t in choice.thinking] == [
        (b.thinking, b.signature) for b in blocks if b.type == "thinking"]
    assert [(c.id, c.name, c.parsed) for c in choice.tool_calls] == [
        (b.id, b.name, b.input) for b in blocks if b.type == "tool_use"]
    assert choice.native_finish_reason == message.stop_reason
    assert choice.finish_reason == FINISH[message.stop_reason]
    usage = message.usage
    assert result.usage is not None
    assert result.usage.prompt_tokens == (usage.input_tokens + usage.cache_read_input_tokens
                                          + usage.cache_creation_input_tokens)
    assert result.usage.completion_tokens == usage.output_tokens


def agrees_with_openai(result: StreamResult, response: Any) -> None:
    choice = result.choices[0]
    assert response.status == "completed"
    assert choice.text == response.output_text
    summaries = [s.text for item in response.output if item.type == "reasoning"
                 for s in item.summary]
    assert choice.reasoning == "".join(summaries)
    calls = [item for item in response.output if item.type == "function_call"]
    assert [(c.id, c.name, c.arguments) for c in choice.tool_calls] == [
        (c.call_id, c.name, c.arguments) for c in calls]
    assert choice.finish_reason == ("tool_calls" if calls else "stop")
    assert result.usage is not None and response.usage is not None
    assert (result.usage.prompt_tokens, result.usage.completion_tokens,
            result.usage.total_tokens) == (response.usage.input_tokens,
                                           response.usage.output_tokens,
                                           response.usage.total_tokens)


@SETTINGS
@given(stream=dialect_streams("anthropic", anthropic_renderings))
def test_whole_anthropic_streams_agree_with_message_stream(stream: DialectStream) -> None:
    if not stream.terminal:
        stream = attrs.evolve(stream, terminal=True, body=stream.body + serialize(
            [{"type": "message_stop"}], Rendering()))
    result = parse_stream([stream.body], api="anthropic")
    assert result.outcome is Outcome.COMPLETED
    agrees_with_anthropic(result, sdk_message(stream.body))


@SETTINGS
@given(stream=dialect_streams("responses", sdk_renderings), data=st.data())
def test_completed_responses_streams_agree_with_response_stream(stream: DialectStream,
                                                               data: st.DataObject) -> None:
    script = stream.script
    if not stream.terminal or script.finish != "natural":
        script = attrs.evolve(script, finish="natural")
        frames = responses_frames(script)
        stream = attrs.evolve(stream, script=script, terminal=True,
                              body=serialize(frames, data.draw(sdk_renderings)))
    result = parse_stream([stream.body], api="responses")
    assert result.outcome is Outcome.COMPLETED
    agrees_with_openai(result, sdk_response(stream.body))


# -- Where the SDKs are wrong ---------------------------------------------------------------

NOT_COMPLETED = re.escape("Didn't receive a `response.completed` event")

ARGUMENTS = json.dumps({"city": "Paris", "days": 3})
SCRIPT = Script(reasoning=("Let me ", "think."), text=("The weather", " in Paris"),
                calls=(ScriptedCall("call_0", "get_weather", ARGUMENTS,
                                    (ARGUMENTS[:12], ARGUMENTS[12:])),),
                finish="natural", prompt_tokens=20, cached_tokens=5, completion_tokens=9,
                signature="EqQBCkYIARgC")


def test_anthropic_cut_before_message_stop_looks_complete_to_the_sdk() -> None:
    body = serialize(anthropic_frames(SCRIPT, terminal=False))
    message = sdk_message(body)  # no error: a whole-looking message
    assert message.stop_reason == "tool_use"
    assert message.content[-1].input == {"city": "Paris", "days": 3}
    result = parse_stream([body], api="anthropic")
    assert result.outcome is Outcome.TRUNCATED
    assert result.reason == "the body ended after 15 events without message_stop"
    assert result.choices[0].tool_calls[0].parsed == {"city": "Paris", "days": 3}  # kept


def test_anthropic_cut_inside_tool_arguments_gives_the_sdk_an_empty_input() -> None:
    frames = anthropic_frames(SCRIPT, terminal=False)
    body = serialize(frames[:frames.index(frames[-3])])  # after the first arguments fragment
    message = sdk_message(body)  # no error, no stop reason, and the input silently {}
    assert (message.stop_reason, message.content[-1].input) == (None, {})
    result = parse_stream([body], api="anthropic")
    [call] = result.choices[0].tool_calls
    assert (result.outcome, call.arguments, call.parsed) == (
        Outcome.TRUNCATED, ARGUMENTS[:12], None)
    assert call.parse_error is not None and call.parse_error.startswith("arguments are not valid")


def test_anthropic_events_without_event_lines_are_dropped_by_the_sdk() -> None:
    body = serialize(anthropic_frames(SCRIPT), Rendering(named=False))
    with pytest.raises(AssertionError):  # the SDK skips every event that has no `event:` line
        sdk_message(body)
    result = parse_stream([body], api="anthropic")
    assert (result.outcome, result.text) == (Outcome.COMPLETED, "The weather in Paris")


def test_a_bom_hides_the_first_event_from_the_sdks() -> None:
    body = serialize(anthropic_frames(SCRIPT), Rendering(bom=True))
    with pytest.raises(AssertionError):  # message_start unseen: the SDK has no snapshot
        sdk_message(body)
    assert parse_stream([body], api="anthropic").outcome is Outcome.COMPLETED
    # Without `event:` lines the BOM sits on the first `data:` line, and that event is lost.
    responses = serialize(responses_frames(SCRIPT), Rendering(bom=True, named=False))
    with pytest.raises(RuntimeError, match=re.escape("received `response.created` before")):
        sdk_response(responses)
    assert parse_stream([responses], api="responses").outcome is Outcome.COMPLETED


def test_responses_cut_before_its_terminal_event_raises_in_the_sdk() -> None:
    body = serialize(responses_frames(SCRIPT, terminal=False))
    with pytest.raises(RuntimeError, match=NOT_COMPLETED):
        sdk_response(body)  # and the text it had streamed is not in the error
    result = parse_stream([body], api="responses")
    assert (result.outcome, result.text) == (Outcome.TRUNCATED, "The weather in Paris")
    assert result.reason is not None and result.reason.endswith(
        "without response.completed or response.incomplete")


def test_an_incomplete_response_raises_in_the_sdk_but_is_a_length_finish() -> None:
    body = serialize(responses_frames(attrs.evolve(SCRIPT, finish="length")))
    with pytest.raises(RuntimeError, match=NOT_COMPLETED):
        sdk_response(body)
    result = parse_stream([body], api="responses")
    assert (result.outcome, result.choices[0].finish_reason,
            result.choices[0].native_finish_reason) == (Outcome.COMPLETED, "length",
                                                        "max_output_tokens")


def test_responses_text_before_its_item_is_fatal_to_the_sdk() -> None:
    frames = responses_frames(attrs.evolve(SCRIPT, calls=()))
    added = next(f for f in frames if f["type"] == "response.output_item.added"
                 and f["item"]["type"] == "message")
    frames.remove(added)  # a relay that never announces its message item
    body = serialize(frames)
    with pytest.raises(RuntimeError, match="before receiving its output item"):
        sdk_response(body)
    result = parse_stream([body], api="responses")
    assert (result.outcome, result.text) == (Outcome.COMPLETED, "The weather in Paris")


def _anthropic_events(*frames: dict[str, Any]) -> bytes:
    return serialize([{"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": [],
        "stop_reason": None, "usage": {"input_tokens": 1, "output_tokens": 1}}}, *frames,
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"},
         "usage": {"output_tokens": 2}}, {"type": "message_stop"}])


def _start(index: int, block: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": block}


def _delta(index: int, delta: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": delta}


TEXT_BLOCK = {"type": "text", "text": ""}
TOOL_BLOCK = {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}


def test_anthropic_blocks_out_of_order_lose_everything_in_the_sdk() -> None:
    # The SDK appends blocks in arrival order and then addresses them by index.
    body = _anthropic_events(
        _start(1, TEXT_BLOCK), _start(0, TOOL_BLOCK),
        _delta(1, {"type": "text_delta", "text": "xy"}),
        _delta(0, {"type": "input_json_delta", "partial_json": '{"a": 1}'}),
        {"type": "content_block_stop", "index": 1}, {"type": "content_block_stop", "index": 0})
    message = sdk_message(body)  # no error, a complete-looking message, and nothing in it
    assert (message.content[0].text, message.content[1].input, message.stop_reason) == (
        "", {}, "tool_use")
    result = parse_stream([body], api="anthropic")
    assert (result.outcome, result.text, result.choices[0].tool_calls[0].parsed) == (
        Outcome.COMPLETED, "xy", {"a": 1})


def test_a_repeated_tool_start_is_a_second_call_in_the_sdk() -> None:
    arguments = _delta(0, {"type": "input_json_delta", "partial_json": "[1]"})
    stop = {"type": "content_block_stop", "index": 0}
    body = _anthropic_events(_start(0, TOOL_BLOCK), arguments, stop,
                             _start(0, TOOL_BLOCK), arguments, stop)
    message = sdk_message(body)  # the same tool twice: a runner would call it twice
    assert [(b.id, b.input) for b in message.content] == [("toolu_1", [1]), ("toolu_1", {})]
    result = parse_stream([body], api="anthropic")
    assert [(c.id, c.parsed) for c in result.choices[0].tool_calls] == [("toolu_1", [1])]
