"""What real servers send on /v1/messages and /v1/responses that the vendors' docs do not.

Each test is one behaviour seen in a real server or relay (LiteLLM's proxy,
llama.cpp, vLLM, SGLang, GitHub Copilot through LiteLLM, OpenRouter-style
relays), cited in its docstring, written as the bytes such a server sends.
Each checks that fanout gets it right: an honest outcome, the partial output
kept, a clear reason, never an exception; and that any split of the bytes
parses to the same result.
"""

from __future__ import annotations

import json
from typing import Any

from fanout import Flag, Outcome, StreamParser, StreamResult, parse_stream
from tests.helpers import byte_at_a_time


def sse(body: Any, name: str | None = None) -> bytes:
    """One server-sent event; ``name`` defaults to the JSON ``type`` (as the vendors send)."""
    data = body if isinstance(body, str) else json.dumps(body, separators=(",", ":"))
    if name is None and isinstance(body, dict) and isinstance(body.get("type"), str):
        name = body["type"]
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {data}\n\n".encode()


def bare(body: Any) -> bytes:
    """A ``data:`` line only, no ``event:`` line (LiteLLM's proxy, some relays)."""
    data = body if isinstance(body, str) else json.dumps(body, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def parse(api: str, *frames: bytes, **options: Any) -> StreamResult:
    """Parse the frames whole, then byte at a time and at every frame boundary: the same."""
    body = b"".join(frames)
    whole = parse_stream([body], api=api, **options)
    for pieces in (byte_at_a_time(body), list(frames)):
        again = parse_stream(pieces, api=api, **options)
        assert (again.outcome, again.reason, again.choices, again.usage, again.skip_reasons,
                again.ignored_events) == (whole.outcome, whole.reason, whole.choices,
                                          whole.usage, whole.skip_reasons,
                                          whole.ignored_events)
    return whole


# ---------------------------------------------------------------- Anthropic Messages

def message_start(input_tokens: int = 12, **extra: Any) -> dict[str, Any]:
    return {"type": "message_start", "message": {
        "id": "msg_real", "type": "message", "role": "assistant", "model": "qwen3.5:4b",
        "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": 0}, **extra}}


def block_start(index: int, kind: str = "text", **fields: Any) -> dict[str, Any]:
    block: dict[str, Any] = {"type": kind, **({"text": ""} if kind == "text" else {})}
    block.update(fields)
    return {"type": "content_block_start", "index": index, "content_block": block}


def delta(index: int, kind: str, **fields: Any) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": {"type": kind, **fields}}


def block_stop(index: int) -> dict[str, Any]:
    return {"type": "content_block_stop", "index": index}


def message_delta(stop_reason: str | None, usage: dict[str, Any] | None = None,
                  **fields: Any) -> dict[str, Any]:
    frame: dict[str, Any] = {"type": "message_delta", "delta": {"stop_reason": stop_reason,
                                                                **fields}}
    if usage is not None:
        frame["usage"] = usage
    return frame


STOP = {"type": "message_stop"}


def test_litellm_ollama_tool_call_with_end_turn_and_an_empty_leading_text_block() -> None:
    """LiteLLM #34692 (``ollama_chat`` behind ``/v1/messages``, 1.93 to 1.96): a tool call
    closed by ``stop_reason: "end_turn"`` (not ``tool_use``), an empty text block
    before it, ``message_delta`` without ``usage``.  The stream is complete: the call
    is kept whole, the finish reason is what was sent (``stop``, native ``end_turn``),
    the usage is ``message_start``'s."""
    result = parse("anthropic",
                   sse(message_start()),
                   sse(block_start(0)), sse(block_stop(0)),
                   sse(block_start(1, "tool_use", id="8a359e89-1", name="Write", input={})),
                   sse(delta(1, "input_json_delta",
                             partial_json='{"file_path": "test.txt", "content": "hello"}')),
                   sse(block_stop(1)),
                   sse(message_delta("end_turn")), sse(STOP))
    assert result.outcome is Outcome.COMPLETED
    choice = result.choices[0]
    assert (choice.finish_reason, choice.native_finish_reason, choice.text) == (
        "stop", "end_turn", "")
    (call,) = choice.tool_calls
    assert (call.id, call.name, call.parsed, call.parse_error) == (
        "8a359e89-1", "Write", {"file_path": "test.txt", "content": "hello"}, None)
    assert result.usage is not None and result.usage.prompt_tokens == 12
    assert (result.skipped_frames, result.flags) == (0, ())


def test_litellm_bedrock_empty_deltas_inside_a_thinking_block() -> None:
    """LiteLLM #29441 / PR #33315 (Bedrock Converse behind ``/v1/messages``): an
    empty ``thinking_delta`` (and an empty ``text_delta``) in the middle of a
    block.  They carry nothing: no skipped frame, no empty fragment, and the
    thinking block keeps its text and signature."""
    result = parse("anthropic",
                   sse(message_start()),
                   sse(block_start(0, "thinking", thinking="", signature="")),
                   sse(delta(0, "thinking_delta", thinking="Let me ")),
                   sse(delta(0, "thinking_delta", thinking="")),
                   sse(delta(0, "thinking_delta", thinking=None)),
                   sse(delta(0, "thinking_delta", thinking="check.")),
                   sse(delta(0, "signature_delta", signature="c2lnbmF0dXJl")),
                   sse(block_stop(0)),
                   sse(block_start(1)), sse(delta(1, "text_delta", text="")),
                   sse(delta(1, "text_delta", text="Done.")), sse(block_stop(1)),
                   sse(message_delta("end_turn", {"output_tokens": 9})), sse(STOP))
    assert (result.outcome, result.text, result.choices[0].reasoning) == (
        Outcome.COMPLETED, "Done.", "Let me check.")
    (block,) = result.choices[0].thinking
    assert (block.thinking, block.signature) == ("Let me check.", "c2lnbmF0dXJl")
    assert (result.skipped_frames, result.content_events) == (0, 3)


def test_litellm_error_event_when_the_provider_stream_ends_without_message_stop() -> None:
    """LiteLLM PR #32159: when a provider's Messages stream ends before
    ``message_stop``, the proxy sends ``event: error`` saying so, and a provider's
    own error may come just before it (the review notes two consecutive errors).
    The outcome is ``error`` with the first error as its reason; the text and the
    tool arguments received so far are kept."""
    result = parse("anthropic",
                   sse(message_start()),
                   sse(block_start(0)), sse(delta(0, "text_delta", text="Writing the ")),
                   sse(block_start(1, "tool_use", id="toolu_1", name="Write", input={})),
                   sse(delta(1, "input_json_delta", partial_json='{"file_path": "a')),
                   sse({"type": "error", "error": {"type": "api_error",
                                                   "message": "ThrottlingException"}}),
                   sse({"type": "error", "error": {
                       "type": "api_error",
                       "message": "Provider stream ended before emitting a message_stop event; "
                                  "the response is incomplete"}}))
    assert result.outcome is Outcome.ERROR
    assert result.reason == "ThrottlingException"
    assert result.error is not None and result.error.type == "api_error"
    assert result.text == "Writing the "
    (call,) = result.choices[0].tool_calls
    assert call.arguments == '{"file_path": "a' and call.parse_error is not None


def test_sglang_text_delta_on_an_open_tool_use_block_is_skipped_not_merged() -> None:
    """SGLang #24293 / PR #24294: between two tool calls the ``qwen3_coder`` parser's
    ``\\n`` went out as a ``text_delta`` stamped with the still-open ``tool_use``
    block's index (the official SDKs crash: ``Content block is not a text block``).
    fanout skips that frame, says why, and keeps both calls' arguments intact."""
    result = parse("anthropic",
                   sse(message_start()),
                   sse(block_start(0, "tool_use", id="toolu_a", name="lookup", input={})),
                   sse(delta(0, "input_json_delta", partial_json='{"place": "Oslo"}')),
                   sse(delta(0, "text_delta", text="\n")),
                   sse(block_stop(0)),
                   sse(block_start(1, "tool_use", id="toolu_b", name="lookup", input={})),
                   sse(delta(1, "input_json_delta", partial_json='{"place": "Rome"}')),
                   sse(block_stop(1)),
                   sse(message_delta("tool_use", {"output_tokens": 20})), sse(STOP))
    assert result.outcome is Outcome.COMPLETED
    assert [c.parsed for c in result.choices[0].tool_calls] == [{"place": "Oslo"},
                                                                {"place": "Rome"}]
    assert result.text == ""
    assert result.skip_reasons == ("text_delta for block 0, a tool_use block",)
    assert Flag.SKIPPED_FRAMES in result.flags


def test_a_later_message_delta_without_stop_reason_keeps_the_first() -> None:
    """anthropic-sdk-python #1940 / anthropic-sdk-typescript PR #1204: a second
    ``message_delta`` whose ``stop_reason`` is ``null`` (only usage) resets the
    SDKs' accumulated ``stop_reason`` to ``None``.  fanout keeps ``max_tokens``."""
    result = parse("anthropic",
                   sse(message_start()), sse(block_start(0)),
                   sse(delta(0, "text_delta", text="The Nile")), sse(block_stop(0)),
                   sse(message_delta("max_tokens", {"output_tokens": 4})),
                   sse(message_delta(None, {"output_tokens": 5}, stop_sequence=None)),
                   sse(STOP))
    choice = result.choices[0]
    assert (result.outcome, choice.finish_reason, choice.native_finish_reason) == (
        Outcome.COMPLETED, "length", "max_tokens")
    assert result.usage is not None and result.usage.completion_tokens == 5


def test_vllm_message_delta_without_stop_sequence_or_usage() -> None:
    """vLLM #55324: ``/v1/messages`` streaming serialized ``message_delta`` with
    ``exclude_unset``, so ``stop_sequence`` (and, with no usage asked, ``usage``) is
    absent.  Nothing is missing that fanout needs: completed, usage from
    ``message_start``."""
    result = parse("anthropic",
                   sse(message_start(7)), sse(block_start(0)),
                   sse(delta(0, "text_delta", text="Hi.")), sse(block_stop(0)),
                   sse({"type": "message_delta", "delta": {"stop_reason": "end_turn"}}),
                   sse(STOP))
    assert (result.outcome, result.text, result.choices[0].finish_reason) == (
        Outcome.COMPLETED, "Hi.", "stop")
    assert result.usage is not None and result.usage.prompt_tokens == 7


def test_litellm_deltas_without_content_block_start_keep_their_text() -> None:
    """LiteLLM #27442 / PR #30115: bridging a Responses stream that omits
    ``output_item.added`` onto ``/v1/messages``, the proxy sent
    ``content_block_delta`` events for blocks it never started (and stopped them).
    The text and thinking are kept (a block is opened for them: the stream said
    what they are); the stops match those blocks; nothing is skipped."""
    result = parse("anthropic",
                   sse(message_start()),
                   sse(delta(0, "thinking_delta", thinking="Hm.")),
                   sse(delta(0, "signature_delta", signature="c2ln")),
                   sse(block_stop(0)),
                   sse(delta(1, "text_delta", text="Paris")),
                   sse(delta(1, "text_delta", text=" it is.")),
                   sse(block_stop(1)),
                   sse(message_delta("end_turn", {"output_tokens": 6})), sse(STOP))
    assert (result.outcome, result.text, result.choices[0].reasoning) == (
        Outcome.COMPLETED, "Paris it is.", "Hm.")
    (block,) = result.choices[0].thinking
    assert (block.index, block.thinking, block.signature) == (0, "Hm.", "c2ln")
    assert (result.skipped_frames, result.flags) == (0, ())


def test_a_tool_delta_without_content_block_start_is_still_skipped() -> None:
    """The same relay bug for a tool's ``input_json_delta``: without its start there
    is no tool name or id, so no call is invented; the frame is skipped with its
    reason and the text around it is kept."""
    result = parse("anthropic",
                   sse(message_start()), sse(delta(0, "text_delta", text="Calling.")),
                   sse(delta(1, "input_json_delta", partial_json='{"a": 1}')),
                   sse(message_delta("tool_use")), sse(STOP))
    assert (result.outcome, result.text, result.choices[0].tool_calls) == (
        Outcome.COMPLETED, "Calling.", ())
    assert result.skip_reasons == ("content_block_delta for block 1, which was never started",)


def test_stop_reason_null_then_message_stop_is_not_complete() -> None:
    """llmgateway PR #1994 (an Anthropic-compatible gateway answers a content-filtered
    turn with ``stop_reason: null``, then ``message_stop``).  Without a stop reason
    fanout does not call the answer complete: truncated, the reason says
    ``message_stop`` came without one, the text is kept."""
    result = parse("anthropic",
                   sse(message_start()), sse(block_start(0)),
                   sse(delta(0, "text_delta", text="I can tell you")), sse(block_stop(0)),
                   sse(message_delta(None, {"output_tokens": 4})), sse(STOP))
    assert result.outcome is Outcome.TRUNCATED
    assert result.reason == ("message_stop arrived but no choice had a finish reason "
                             "(the server cut the stream)")
    assert result.text == "I can tell you"


def test_events_without_event_lines_and_a_trailing_done() -> None:
    """LiteLLM's proxy and OpenRouter-style relays write Messages events as bare
    ``data:`` lines, keep-alive comments between them, and append ``data: [DONE]``
    after ``message_stop``.  Read by their JSON ``type``; the ``[DONE]`` after the
    end is counted in ``ignored_after_done``; the comments are keep-alives."""
    result = parse("anthropic",
                   b": OPENROUTER PROCESSING\n\n",
                   bare(message_start()), bare(block_start(0)),
                   b": OPENROUTER PROCESSING\n\n",
                   bare(delta(0, "text_delta", text="Yes.")), bare(block_stop(0)),
                   bare(message_delta("end_turn", {"output_tokens": 2})), bare(STOP),
                   b"data: [DONE]\n\n")
    assert (result.outcome, result.text, result.comments, result.ignored_after_done) == (
        Outcome.COMPLETED, "Yes.", 2, 1)


def test_done_instead_of_message_stop_is_truncated_with_the_text() -> None:
    """A relay that ends every stream the chat way writes ``data: [DONE]`` where
    ``message_stop`` belongs.  ``[DONE]`` ends no Messages stream: truncated, the
    reason names ``message_stop``, the text and stop reason kept."""
    result = parse("anthropic",
                   bare(message_start()), bare(block_start(0)),
                   bare(delta(0, "text_delta", text="Half")), bare(block_stop(0)),
                   bare(message_delta("end_turn")), b"data: [DONE]\n\n")
    assert result.outcome is Outcome.TRUNCATED
    assert result.reason == "the body ended after 6 events without message_stop"
    assert (result.text, result.choices[0].finish_reason, result.ignored_events) == (
        "Half", "stop", 1)


def test_a_duplicated_message_start_changes_nothing() -> None:
    """Relays that re-emit ``message_start`` when they retry the upstream internally
    (LiteLLM's fallbacks, before any content): one role, one response id, the
    latest input usage; the text after it is read as usual."""
    result = parse("anthropic",
                   sse(message_start(12)), sse(message_start(12)),
                   sse(block_start(0)), sse(delta(0, "text_delta", text="Ok")),
                   sse(block_stop(0)), sse(message_delta("end_turn", {"output_tokens": 1})),
                   sse(STOP))
    assert (result.outcome, result.text, result.response_id) == (
        Outcome.COMPLETED, "Ok", "msg_real")
    assert result.choices[0].role == "assistant"
    assert result.usage is not None and (result.usage.prompt_tokens,
                                         result.usage.completion_tokens) == (12, 1)


def test_an_openai_shaped_error_on_the_messages_route() -> None:
    """vLLM's and llama.cpp's streaming errors are OpenAI-shaped whatever the route
    (vLLM ``create_streaming_error_response``: ``{"error": {"message", "type":
    "BadRequestError", "param", "code": 400}}``, no top-level ``type``, no
    ``event:`` line).  An error, with its message, type and code; the text kept."""
    error = {"error": {"message": "The decoder prompt is too long", "type": "BadRequestError",
                       "param": None, "code": 400}}
    result = parse("anthropic", bare(message_start()), bare(block_start(0)),
                   bare(delta(0, "text_delta", text="Par")), bare(error))
    assert result.outcome is Outcome.ERROR
    assert result.reason == "The decoder prompt is too long"
    assert result.error is not None and (result.error.type, result.error.code) == (
        "BadRequestError", "400")
    assert result.text == "Par"


def test_a_chat_stream_on_the_messages_route_says_the_api_is_wrong() -> None:
    """A relay that answers ``/v1/messages`` with Chat Completions chunks (LiteLLM
    before its Messages adapter, or a route mapped to the wrong handler): the
    stream is truncated and the reason says which api the chunks belong to."""
    chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk",
             "choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}]}
    result = parse("anthropic", bare(chunk), bare(chunk), b"data: [DONE]\n\n")
    assert result.outcome is Outcome.TRUNCATED
    assert result.reason is not None and 'is this model\'s api "chat"?' in result.reason


def test_a_200_json_error_body_on_the_messages_route() -> None:
    """A proxy that fails before streaming but has already sent 200 (LiteLLM's
    ``/v1/messages`` with a provider error it could not map, as
    ``fault/json-error-200`` models): one JSON error body.  An error, never a
    completed empty answer."""
    parser = StreamParser(api="anthropic")
    parser.status = 200
    parser.feed_completion(json.dumps({"type": "error", "error": {
        "type": "overloaded_error", "message": "Overloaded"}}).encode())
    result = parser.result()
    assert (result.outcome, result.reason) == (Outcome.ERROR, "Overloaded")
    assert result.error is not None and result.error.code == "overloaded_error"


# ---------------------------------------------------------------- Responses

def created(**response: Any) -> dict[str, Any]:
    return {"type": "response.created", "response": {
        "id": "resp_real", "object": "response", "status": "in_progress", "model": "gpt-x",
        "output": [], "usage": None, **response}}


def completed(output: list[Any] | None = None, usage: Any = "default",
              **response: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"id": "resp_real", "object": "response", "status": "completed",
                            "model": "gpt-x", **response}
    if output is not None:
        body["output"] = output
    if usage == "default":
        body["usage"] = {"input_tokens": 9, "output_tokens": 3, "total_tokens": 12}
    elif usage is not None:
        body["usage"] = usage
    return {"type": "response.completed", "response": body}


def text_delta(piece: Any, item_id: str = "msg_1", output_index: int = 0) -> dict[str, Any]:
    return {"type": "response.output_text.delta", "item_id": item_id,
            "output_index": output_index, "content_index": 0, "delta": piece}


def message_item(item_id: str = "msg_1", text: str = "") -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": []}] if text else []
    return {"id": item_id, "type": "message", "status": "completed", "role": "assistant",
            "content": content}


def test_litellm_deltas_before_any_output_item_then_completed_and_done() -> None:
    """LiteLLM #22102 (gpt-5.3-codex through ``/responses``): no ``response.created``,
    no ``output_item.added``, no ``event:`` lines; ``output_text.delta`` events,
    ``response.completed`` whose output repeats the text, then ``data: [DONE]``.
    The text is read once (the output is not replayed over the deltas), completed,
    the ``[DONE]`` counted after the end."""
    result = parse("responses",
                   bare(text_delta("Pong")), bare(text_delta(".")),
                   bare(completed([message_item(text="Pong.")])), b"data: [DONE]\n\n")
    assert (result.outcome, result.text, result.ignored_after_done) == (
        Outcome.COMPLETED, "Pong.", 1)
    assert result.choices[0].role is None and result.usage is not None
    assert (result.skipped_frames, result.flags) == (0, ())


def test_litellm_a_message_item_only_ever_closed_beside_a_tool_call() -> None:
    """LiteLLM #37852 (an Anthropic model's tool call with no text, through
    ``/v1/responses``): ``output_item.done``, ``content_part.done`` and
    ``output_text.done`` for a message item (``chatcmpl-…``) that was never
    added.  They carry nothing: one call, finish ``tool_calls``, no skipped frame."""
    call = {"id": "fc_1", "type": "function_call", "call_id": "call_1", "name": "lookup",
            "arguments": "", "status": "in_progress"}
    ghost = "chatcmpl-5b2e"
    result = parse("responses",
                   sse(created()),
                   sse({"type": "response.output_item.added", "output_index": 0, "item": call}),
                   sse({"type": "response.function_call_arguments.delta", "item_id": "fc_1",
                        "output_index": 0, "delta": '{"place": "Oslo"}'}),
                   sse({"type": "response.output_item.done", "output_index": 0,
                        "item": {**call, "arguments": '{"place": "Oslo"}'}}),
                   sse({"type": "response.output_text.done", "item_id": ghost,
                        "output_index": 1, "content_index": 0, "text": ""}),
                   sse({"type": "response.content_part.done", "item_id": ghost,
                        "output_index": 1, "content_index": 0,
                        "part": {"type": "output_text", "text": ""}}),
                   sse({"type": "response.output_item.done", "output_index": 1,
                        "item": message_item(ghost)}),
                   sse(completed()))
    assert result.outcome is Outcome.COMPLETED
    (tool,) = result.choices[0].tool_calls
    assert (tool.id, tool.name, tool.parsed) == ("call_1", "lookup", {"place": "Oslo"})
    assert (result.choices[0].finish_reason, result.skipped_frames) == ("tool_calls", 0)


def test_litellm_text_of_an_item_never_announced_after_a_reasoning_item() -> None:
    """LiteLLM #41185 (the chat-to-Responses bridge, a reasoning-first Anthropic
    model): a reasoning item is added and done, then ``output_text.delta`` events
    name a ``msg_…`` item never added (and the reasoning item's ``output_index``,
    LiteLLM PR #36375).  The text is kept, never skipped as a late delta of the
    finished reasoning item."""
    reasoning = {"id": "rs_1", "type": "reasoning", "summary": []}
    result = parse("responses",
                   sse(created()),
                   sse({"type": "response.output_item.added", "output_index": 0,
                        "item": reasoning}),
                   sse({"type": "response.reasoning_summary_text.delta", "item_id": "rs_1",
                        "output_index": 0, "summary_index": 0, "delta": "Think."}),
                   sse({"type": "response.output_item.done", "output_index": 0,
                        "item": reasoning}),
                   sse(text_delta("Answer", "msg_9", 0)), sse(text_delta(".", "msg_9", 0)),
                   sse(completed()))
    assert (result.outcome, result.choices[0].reasoning, result.text) == (
        Outcome.COMPLETED, "Think.", "Answer.")
    assert result.skipped_frames == 0


def test_copilot_a_fresh_item_id_on_every_event_of_one_item() -> None:
    """LiteLLM #30071 / PR #30072: GitHub Copilot's ``/responses`` stream gives every
    event of one output item a different ``item_id``.  The text and reasoning are
    kept; a function call's argument deltas and its ``output_item.done`` go to the
    call their ``output_index`` / ``call_id`` names: one call, its arguments once."""
    call = {"id": "fc_A", "type": "function_call", "call_id": "call_7", "name": "lookup",
            "arguments": ""}
    result = parse("responses",
                   sse(created()),
                   sse({"type": "response.output_item.added", "output_index": 0,
                        "item": {"id": "rs_A", "type": "reasoning", "summary": []}}),
                   sse({"type": "response.reasoning_summary_text.delta", "item_id": "rs_B",
                        "output_index": 0, "summary_index": 0, "delta": "Plan."}),
                   sse({"type": "response.output_item.done", "output_index": 0,
                        "item": {"id": "rs_C", "type": "reasoning", "summary": []}}),
                   sse({"type": "response.output_item.added", "output_index": 1,
                        "item": message_item("msg_A")}),
                   sse(text_delta("Looking", "msg_B", 1)), sse(text_delta(" up.", "msg_C", 1)),
                   sse({"type": "response.output_item.done", "output_index": 1,
                        "item": message_item("msg_D", "Looking up.")}),
                   sse({"type": "response.output_item.added", "output_index": 2, "item": call}),
                   sse({"type": "response.function_call_arguments.delta", "item_id": "fc_B",
                        "output_index": 2, "delta": '{"place": '}),
                   sse({"type": "response.function_call_arguments.delta", "item_id": "fc_C",
                        "output_index": 2, "delta": '"Oslo"}'}),
                   sse({"type": "response.function_call_arguments.done", "item_id": "fc_D",
                        "output_index": 2, "arguments": '{"place": "Oslo"}'}),
                   sse({"type": "response.output_item.done", "output_index": 2,
                        "item": {**call, "id": "fc_E", "arguments": '{"place": "Oslo"}'}}),
                   sse(completed()))
    assert (result.outcome, result.choices[0].reasoning, result.text) == (
        Outcome.COMPLETED, "Plan.", "Looking up.")
    (tool,) = result.choices[0].tool_calls
    assert (tool.id, tool.arguments, tool.parsed) == (
        "call_7", '{"place": "Oslo"}', {"place": "Oslo"})
    assert result.skipped_frames == 0


def test_a_call_done_under_a_new_id_is_matched_by_its_call_id() -> None:
    """The same upstream when the ``output_item.done`` of a call carries neither its
    first ``item_id`` nor an ``output_index``: its ``call_id`` names the call, so
    no second call is opened."""
    call = {"id": "fc_A", "type": "function_call", "call_id": "call_9", "name": "f",
            "arguments": ""}
    result = parse("responses", sse(created()),
                   sse({"type": "response.output_item.added", "output_index": 0, "item": call}),
                   sse({"type": "response.output_item.done",
                        "item": {**call, "id": "fc_Z", "arguments": '{"x": 1}'}}),
                   sse(completed()))
    (tool,) = result.choices[0].tool_calls
    assert (tool.id, tool.parsed, result.outcome) == ("call_9", {"x": 1}, Outcome.COMPLETED)


def test_events_without_sequence_numbers() -> None:
    """Effect-TS PR #8037, sub2api PR #7129, onyx PR #13624: gateways that bridge other
    APIs onto ``/v1/responses`` send no ``sequence_number`` (strict SDK schemas
    reject the stream).  fanout never needed it: the events in arrival order."""
    result = parse("responses", sse(created()),
                   sse({"type": "response.output_item.added", "output_index": 0,
                        "item": message_item()}),
                   sse(text_delta("One")), sse(text_delta(" two")), sse(completed()))
    assert (result.outcome, result.text) == (Outcome.COMPLETED, "One two")


def test_completed_without_usage_or_output() -> None:
    """LiteLLM PR #28899 (usage details missing from the bridged stream) and relays
    that close with a bare ``response.completed``: no ``usage``, no ``output``.
    Completed with the streamed text; ``usage`` is ``None``, and a caller who
    expects usage gets the ``missing_usage`` flag, not invented counts."""
    frames = (sse(created()), sse(text_delta("Hello")), sse(completed(usage=None)))
    result = parse("responses", *frames)
    assert (result.outcome, result.text, result.usage, result.flags) == (
        Outcome.COMPLETED, "Hello", None, ())
    flagged = parse("responses", *frames, expect_usage=True)
    assert flagged.flags == (Flag.MISSING_USAGE,)


def test_completed_with_nothing_at_all_is_an_empty_answer() -> None:
    """A bridge that lost every delta (LiteLLM #36375: "the loss is silent") and
    closes with ``response.completed`` whose output is empty: completed, flagged
    ``empty_answer`` so no front end counts it as an answer."""
    result = parse("responses", sse(created()), sse(completed([])))
    assert (result.outcome, result.text, result.flags) == (
        Outcome.COMPLETED, "", (Flag.EMPTY_ANSWER,))


def test_empty_and_null_text_deltas_carry_nothing() -> None:
    """vLLM's Responses stream and LiteLLM's bridge send ``"delta": ""`` (a token that
    decodes to nothing yet) and ``"delta": null``: neither is a fragment nor a
    skipped frame."""
    result = parse("responses", sse(created()), sse(text_delta("")), sse(text_delta(None)),
                   sse(text_delta("Yes")), sse(completed()))
    assert (result.outcome, result.text, result.content_events, result.skipped_frames) == (
        Outcome.COMPLETED, "Yes", 1, 0)


def test_vllm_error_frame_in_a_responses_stream() -> None:
    """vLLM's streaming error (``create_streaming_error_response``) is a bare
    ``data: {"error": {...}}`` frame on every route, the Responses one included:
    an error with its message and code, the text so far kept."""
    error = {"error": {"message": "Engine loop has died", "type": "InternalServerError",
                       "param": None, "code": 500}}
    result = parse("responses", sse(created()), sse(text_delta("Partial")), bare(error))
    assert (result.outcome, result.reason, result.text) == (
        Outcome.ERROR, "Engine loop has died", "Partial")
    assert result.error is not None and result.error.code == "500"


def test_llama_cpp_reasoning_text_and_completed_usage_of_its_own() -> None:
    """llama.cpp's ``/v1/responses`` streams reasoning as ``response.reasoning_text``
    (not the summary events), and vLLM's adds ``response.reasoning_part.added`` /
    ``.done`` markers that OpenAI does not define; ``usage`` may carry extra
    counters.  Reasoning is read, the unknown markers are counted in
    ``ignored_events``, the usage's extra keys kept in ``raw``."""
    usage = {"input_tokens": 5, "output_tokens": 2, "total_tokens": 7,
             "input_tokens_details": {"cached_tokens": 0},
             "output_tokens_details": {"reasoning_tokens": 1}, "timings": {"predicted_n": 2}}
    result = parse("responses", sse(created()),
                   sse({"type": "response.reasoning_part.added", "item_id": "rs_1",
                        "output_index": 0, "content_index": 0,
                        "part": {"type": "reasoning_text", "text": ""}}),
                   sse({"type": "response.reasoning_text.delta", "item_id": "rs_1",
                        "output_index": 0, "content_index": 0, "delta": "Hmm"}),
                   sse({"type": "response.reasoning_part.done", "item_id": "rs_1",
                        "output_index": 0, "content_index": 0,
                        "part": {"type": "reasoning_text", "text": "Hmm"}}),
                   sse(text_delta("Hi", "msg_2", 1)), sse(completed(usage=usage)))
    assert (result.outcome, result.choices[0].reasoning, result.text, result.ignored_events) == (
        Outcome.COMPLETED, "Hmm", "Hi", 2)
    assert result.usage is not None and result.usage.raw["timings"] == {"predicted_n": 2}


def test_a_call_listed_only_in_response_completed_is_read_from_it() -> None:
    """LiteLLM PR #36375 ("``response.completed`` arrives listing an item whose id
    never appeared in any ``output_item.added``"): text streamed, the function call
    only in the final output.  The call is read from the output (finish
    ``tool_calls`` never comes without its call); the text is not read twice."""
    call = {"id": "fc_9", "type": "function_call", "call_id": "call_9", "name": "lookup",
            "arguments": '{"place": "Oslo"}', "status": "completed"}
    result = parse("responses", sse(created()),
                   sse({"type": "response.output_item.added", "output_index": 0,
                        "item": message_item()}),
                   sse(text_delta("Checking.")),
                   sse(completed([message_item(text="Checking."), call])))
    assert (result.outcome, result.text, result.choices[0].finish_reason) == (
        Outcome.COMPLETED, "Checking.", "tool_calls")
    (tool,) = result.choices[0].tool_calls
    assert (tool.id, tool.name, tool.parsed) == ("call_9", "lookup", {"place": "Oslo"})


def test_a_streamed_call_is_not_read_again_from_the_output() -> None:
    """The converse: a call streamed under its ids and listed again in
    ``response.completed`` (every conforming server) stays one call."""
    call = {"id": "fc_1", "type": "function_call", "call_id": "call_1", "name": "f",
            "arguments": ""}
    result = parse("responses", sse(created()),
                   sse({"type": "response.output_item.added", "output_index": 0, "item": call}),
                   sse({"type": "response.function_call_arguments.delta", "item_id": "fc_1",
                        "output_index": 0, "delta": "{}"}),
                   sse(completed([{**call, "arguments": "{}"}])))
    assert [t.arguments for t in result.choices[0].tool_calls] == ["{}"]


def test_litellm_nim_thinking_delta_into_a_text_block_is_skipped_and_said() -> None:
    """LiteLLM #33224 (NVIDIA NIM Nemotron behind ``/v1/messages``): a block opened as
    ``text`` receives ``thinking_delta`` events (Claude Code: ``Content block is not
    a thinking block``).  fanout never puts them into the text: each is a skipped
    frame naming the mismatch, the answer text is kept, the result flagged
    ``skipped_frames`` (so reasoning may be missing, and it says so)."""
    result = parse("anthropic", sse(message_start()), sse(block_start(0)),
                   sse(delta(0, "thinking_delta", thinking="Reason.")),
                   sse(delta(0, "text_delta", text="Answer.")), sse(block_stop(0)),
                   sse(message_delta("end_turn", {"output_tokens": 3})), sse(STOP))
    assert (result.outcome, result.text, result.choices[0].reasoning) == (
        Outcome.COMPLETED, "Answer.", "")
    assert result.skip_reasons == ("thinking_delta for block 0, a text block",)
    assert Flag.SKIPPED_FRAMES in result.flags


def test_llama_cpp_responses_stream_with_a_tool_call() -> None:
    """llama.cpp's ``/v1/responses`` (``server-task.cpp``, ``to_json_oaicompat_resp`` and
    ``to_json_oaicompat_resp_stream``): no ``output_index`` and no ``sequence_number``
    on any event, ``response.created`` without a model, reasoning as
    ``reasoning_text``; a call announced as ``{"id": "fc_X", "call_id": "call_X"}``
    but closed by ``output_item.done`` (and listed in ``response.completed``) as
    ``{"call_id": "fc_X"}`` with no ``id``.  One call, its arguments once, named by
    the id it was announced with; the text and reasoning once."""
    announced = {"id": "fc_abc", "arguments": "", "call_id": "call_abc", "name": "lookup",
                 "type": "function_call", "status": "in_progress"}
    closed = {"type": "function_call", "status": "completed",
              "arguments": '{"place":"Oslo"}', "call_id": "fc_abc", "name": "lookup"}
    reasoning = {"id": "rs_1", "summary": [], "type": "reasoning", "encrypted_content": "",
                 "content": [{"text": "Use the tool.", "type": "reasoning_text"}]}
    message = {"type": "message", "status": "completed", "id": "msg_1", "role": "assistant",
               "content": [{"type": "output_text", "annotations": [], "logprobs": [],
                            "text": "Checking."}]}
    lifecycle = {"id": "resp_l", "object": "response", "status": "in_progress"}
    result = parse("responses",
                   sse({"type": "response.created", "response": lifecycle}),
                   sse({"type": "response.in_progress", "response": lifecycle}),
                   sse({"type": "response.output_item.added", "item": {
                       "id": "rs_1", "summary": [], "type": "reasoning", "content": [],
                       "encrypted_content": "", "status": "in_progress"}}),
                   sse({"type": "response.reasoning_text.delta", "delta": "Use the tool.",
                        "item_id": "rs_1"}),
                   sse({"type": "response.output_item.added", "item": {
                       "content": [], "id": "msg_1", "role": "assistant",
                       "status": "in_progress", "type": "message"}}),
                   sse({"type": "response.content_part.added", "item_id": "msg_1",
                        "part": {"type": "output_text", "text": ""}}),
                   sse({"type": "response.output_text.delta", "item_id": "msg_1",
                        "delta": "Checking."}),
                   sse({"type": "response.output_item.added", "item": announced}),
                   sse({"type": "response.function_call_arguments.delta",
                        "delta": '{"place":', "item_id": "fc_abc"}),
                   sse({"type": "response.function_call_arguments.delta",
                        "delta": '"Oslo"}', "item_id": "fc_abc",
                        "timings": {"predicted_n": 9}}),
                   sse({"type": "response.output_item.done", "item": reasoning}),
                   sse({"type": "response.output_text.done", "item_id": "msg_1",
                        "text": "Checking."}),
                   sse({"type": "response.content_part.done", "item_id": "msg_1",
                        "part": message["content"][0]}),
                   sse({"type": "response.output_item.done", "item": message}),
                   sse({"type": "response.output_item.done", "item": closed}),
                   sse({"type": "response.completed", "response": {
                       "id": "resp_l", "object": "response", "status": "completed",
                       "model": "qwen3", "output": [reasoning, message, closed],
                       "usage": {"input_tokens": 20, "output_tokens": 9, "total_tokens": 29,
                                 "input_tokens_details": {"cached_tokens": 0}}}}))
    assert (result.outcome, result.text, result.choices[0].reasoning, result.model) == (
        Outcome.COMPLETED, "Checking.", "Use the tool.", "qwen3")
    (tool,) = result.choices[0].tool_calls
    assert (tool.id, tool.name, tool.arguments, tool.parsed) == (
        "call_abc", "lookup", '{"place":"Oslo"}', {"place": "Oslo"})
    assert (result.choices[0].finish_reason, result.skipped_frames) == ("tool_calls", 0)
    assert result.usage is not None and result.usage.total_tokens == 29


def test_llama_cpp_messages_stream_with_thinking() -> None:
    """llama.cpp's ``/v1/messages`` (``to_json_anthropic`` / ``to_json_anthropic_stream``):
    the thinking block starts without a ``signature``, stays open while the text
    streams on index 1, the final chunk starts the blocks it has diffs for again,
    every block is stopped at the end, the thinking with an empty
    ``signature_delta``; usage as ``input_tokens`` + ``cache_read_input_tokens``.
    Completed; the repeats counted, not read twice; the signature kept as sent
    (``""``); the prompt counted whole."""
    start = message_start(0)
    start["message"]["usage"] = {"cache_read_input_tokens": 30, "input_tokens": 8,
                                 "output_tokens": 0}
    result = parse("anthropic",
                   sse(start),
                   sse(block_start(0, "thinking", thinking="")),
                   sse(delta(0, "thinking_delta", thinking="Short.")),
                   sse(block_start(1)), sse(delta(1, "text_delta", text="Hello")),
                   sse(block_start(1)), sse(delta(1, "text_delta", text=" there.")),
                   sse(delta(0, "signature_delta", signature="")), sse(block_stop(0)),
                   sse(block_stop(1)),
                   sse(message_delta("end_turn", {"output_tokens": 5}, stop_sequence=None)),
                   sse(STOP))
    assert (result.outcome, result.text, result.choices[0].reasoning) == (
        Outcome.COMPLETED, "Hello there.", "Short.")
    (block,) = result.choices[0].thinking
    assert (block.index, block.thinking, block.signature) == (0, "Short.", "")
    assert (result.ignored_events, result.skipped_frames) == (1, 0)
    assert result.usage is not None and (result.usage.prompt_tokens,
                                         result.usage.completion_tokens) == (38, 5)


def test_vllm_a_streamed_call_renamed_in_response_completed_stays_one_call() -> None:
    """vLLM PR #47916: the non-Harmony path streams a call under one ``id`` /
    ``call_id`` and lists it in ``response.completed`` under another (separate
    identity paths); PR #44608: the Harmony path closed a call with ``id: null``.
    The same name and arguments under new ids are the same call: one call, the
    streamed identity kept."""
    call = {"id": "fc_s", "type": "function_call", "call_id": "call_s", "name": "lookup",
            "arguments": ""}
    renamed = {**call, "id": "fc_other", "call_id": "call_other",
               "arguments": '{"place": "Oslo"}', "status": "completed"}
    result = parse("responses", sse(created()),
                   sse({"type": "response.output_item.added", "output_index": 0, "item": call}),
                   sse({"type": "response.function_call_arguments.delta", "item_id": "fc_s",
                        "output_index": 0, "delta": '{"place": "Oslo"}'}),
                   sse({"type": "response.output_item.done", "output_index": 0,
                        "item": {**call, "id": None, "arguments": '{"place": "Oslo"}'}}),
                   sse(completed([renamed])))
    (tool,) = result.choices[0].tool_calls
    assert (tool.id, tool.parsed, result.skipped_frames) == ("call_s", {"place": "Oslo"}, 0)


def test_the_interpreter_counts_the_blocks_it_opened_for_a_delta() -> None:
    """``AnthropicInterpreter.implicit_blocks`` says how many blocks a delta had to open
    (a relay that sends no ``content_block_start``), so a caller can tell."""
    from fanout.core.anthropic import AnthropicInterpreter
    from fanout.core.sse import ServerSentEvent

    interpreter = AnthropicInterpreter()
    for frame in (message_start(), delta(0, "thinking_delta", thinking="a"),
                  delta(1, "text_delta", text="b"), delta(1, "text_delta", text="c"),
                  block_start(2), delta(2, "text_delta", text="d")):
        interpreter.interpret(ServerSentEvent(json.dumps(frame)))
    assert interpreter.implicit_blocks == 2


def test_blocks_numbered_from_one() -> None:
    """Not from one cited server: Anthropic numbers blocks from 0, and a relay that drops a
    leading empty block (LiteLLM #34692 sends one; a filter that removes it) leaves the
    rest numbered from 1.  Blocks are read by their index, whatever it starts at."""
    result = parse("anthropic", sse(message_start()),
                   sse(block_start(1)), sse(delta(1, "text_delta", text="One")),
                   sse(block_stop(1)),
                   sse(block_start(2, "tool_use", id="toolu_2", name="f", input={})),
                   sse(delta(2, "input_json_delta", partial_json="{}")), sse(block_stop(2)),
                   sse(message_delta("tool_use")), sse(STOP))
    assert (result.outcome, result.text, [c.parsed for c in result.choices[0].tool_calls]) == (
        Outcome.COMPLETED, "One", [{}])


def test_an_error_with_only_a_message() -> None:
    """The OpenAI error shape at its barest, ``{"error": {"message": ...}}`` with no
    ``type`` or ``code`` (vLLM's and llama.cpp's streaming errors are this shape with
    more fields), on either route, with or without ``event: error``: an error with
    that message, the text kept."""
    for api, frames in (("responses", (sse(created()), sse(text_delta("So far")))),
                        ("anthropic", (sse(message_start()),
                                       sse(delta(0, "text_delta", text="So far"))))):
        for error in (bare({"error": {"message": "upstream exploded"}}),
                      sse({"error": {"message": "upstream exploded"}}, "error")):
            result = parse(api, *frames, error)
            assert (result.outcome, result.reason, result.text) == (
                Outcome.ERROR, "upstream exploded", "So far"), api
            assert result.error is not None and result.error.type is None


def test_an_error_event_then_response_failed() -> None:
    """OpenAI's own Responses stream on a mid-stream failure (vercel/ai PR #13480): an
    ``error`` event, then ``response.failed``; the ``error`` event's details sit at the
    top level or nested under ``error`` (ailoy PR #434 found ``/message`` absent and the
    message at ``/error/message``).  Either way: ``error``, the first error's message
    and code as the cause, the text so far kept."""
    failed = {"type": "response.failed", "response": {
        "id": "resp_real", "status": "failed", "output": [],
        "error": {"code": "server_error", "message": "later echo"}}}
    for error in ({"type": "error", "code": "insufficient_quota", "param": None,
                   "message": "You exceeded your current quota"},
                  {"type": "error", "error": {"type": "insufficient_quota",
                                              "code": "insufficient_quota",
                                              "message": "You exceeded your current quota"}}):
        result = parse("responses", sse(created()), sse(text_delta("Hal")), sse(error),
                       sse(failed))
        assert (result.outcome, result.reason, result.text) == (
            Outcome.ERROR, "You exceeded your current quota", "Hal")
        assert result.error is not None and result.error.code == "insufficient_quota"
