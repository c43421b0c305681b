"""Real servers' stream shapes, served by the embedded upstream, through the engine.

Each ``fault/*`` model of ``fanout/upstream/relays.py`` says a scripted answer
the way a named server got it wrong (the issue is in the model's docstring).
Each test reads the raw bytes once with httpx (what the server sent: the
expected text, reasoning and tool arguments), then runs the same request
through ``open_fanout`` over loopback and checks the honest outcome, that
nothing sent was lost or doubled, and the reason.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import trio

from fanout import Endpoint, Outcome, StreamRequest, StreamResult, open_fanout
from fanout.request import ANTHROPIC_VERSION
from fanout.upstream import RunningUpstream
from fanout.upstream.relays import INCOMPLETE, sse_events

USER = [{"role": "user", "content": "Tell me about rivers."}]
TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look it up",
                                           "parameters": {"type": "object", "properties": {
                                               "place": {"type": "string"}}}}}]


async def engine(upstream: RunningUpstream, model: str, api: str, **fields: Any
                 ) -> StreamResult:
    request = StreamRequest("s", model, USER, api=api, **fields)
    with trio.fail_after(15):
        async with open_fanout(Endpoint(upstream.base_url), [request]) as fan:
            async for _ in fan.events:
                pass
    return fan.results["s"]


async def raw(upstream: RunningUpstream, model: str, api: str, tools: bool = False
              ) -> tuple[bytes, list[tuple[str | None, Any]]]:
    """The body the server sends for this model on this route, and its events."""
    if api == "anthropic":
        url, headers = "/messages", {"anthropic-version": ANTHROPIC_VERSION}
        body: dict[str, Any] = {"model": model, "max_tokens": 4096, "stream": True,
                                "messages": USER}
        if tools:
            body["tools"] = [{"name": "lookup", "description": "Look it up",
                              "input_schema": TOOLS[0]["function"]["parameters"]}]
    else:
        url, headers = "/responses", {}
        body = {"model": model, "input": USER, "stream": True}
        if tools:
            body["tools"] = [{"type": "function", "name": "lookup",
                              "parameters": TOOLS[0]["function"]["parameters"]}]
    with trio.fail_after(15):
        async with httpx.AsyncClient(base_url=upstream.base_url) as client:
            response = await client.post(url, json=body, headers=headers)
    assert response.status_code == 200, response.text
    return response.content, sse_events(response.content)


def sent(events: list[tuple[str | None, Any]], kind: str, field: str) -> str:
    """The concatenated ``field`` of every delta of ``kind`` (Anthropic) or type (Responses)."""
    out = []
    for _, body in events:
        if not isinstance(body, dict):
            continue
        delta = body.get("delta")
        if isinstance(delta, dict) and delta.get("type") == kind:
            out.append(delta.get(field) or "")
        elif body.get("type") == kind and isinstance(delta, str):
            out.append(delta)
    return "".join(out)


def types(events: list[tuple[str | None, Any]]) -> list[str]:
    return [body.get("type") if isinstance(body, dict) else body for _, body in events]


async def test_litellm_bare_responses_stream(upstream: RunningUpstream) -> None:
    """LiteLLM #22102: only deltas and ``response.completed``, no ``event:`` lines,
    then ``data: [DONE]``: completed, the text once, the ``[DONE]`` after the end."""
    body, events = await raw(upstream, "fault/litellm-bare", "responses")
    assert b"event:" not in body and body.endswith(b"data: [DONE]\n\n")
    assert "response.output_item.added" not in types(events)
    result = await engine(upstream, "fault/litellm-bare", "responses")
    assert result.outcome is Outcome.COMPLETED
    assert result.text == sent(events, "response.output_text.delta", "") != ""
    assert (result.ignored_after_done, result.skipped_frames, result.flags) == (1, 0, ())
    assert result.usage is not None and result.usage.completion_tokens


async def test_copilot_fresh_item_ids_keep_one_call_each(upstream: RunningUpstream) -> None:
    """LiteLLM #30071: a fresh ``item_id`` on every event of an item.  Two calls come
    out, each with its arguments once (parsed), none duplicated, no frame skipped."""
    _, events = await raw(upstream, "fault/fresh-item-ids", "responses", tools=True)
    ids = [b.get("item_id") for _, b in events if isinstance(b, dict) and "item_id" in b]
    assert len(ids) == len(set(ids)) > 2
    result = await engine(upstream, "fault/fresh-item-ids", "responses", tools=TOOLS)
    assert result.outcome is Outcome.COMPLETED
    calls = result.choices[0].tool_calls
    assert len(calls) == 2
    assert "".join(c.arguments for c in calls) == sent(
        events, "response.function_call_arguments.delta", "")
    assert all(c.parse_error is None for c in calls)
    assert (result.choices[0].finish_reason, result.skipped_frames) == ("tool_calls", 0)


async def test_deltas_without_content_block_start(upstream: RunningUpstream) -> None:
    """LiteLLM #27442: text and thinking deltas whose blocks were never started: the
    text and the thinking (with its signature) are kept, completed, no skipped frame."""
    _, events = await raw(upstream, "fault/no-block-start", "anthropic")
    assert "content_block_start" not in types(events)
    result = await engine(upstream, "fault/no-block-start", "anthropic")
    assert result.outcome is Outcome.COMPLETED
    choice = result.choices[0]
    assert choice.text == sent(events, "text_delta", "text") != ""
    assert choice.reasoning == sent(events, "thinking_delta", "thinking") != ""
    (block,) = choice.thinking
    assert block.signature == sent(events, "signature_delta", "signature") != ""
    assert (result.skipped_frames, result.flags) == (0, ())


async def test_a_block_start_before_every_delta(upstream: RunningUpstream) -> None:
    """llama.cpp before PR #18551: ``content_block_start`` again before every delta:
    each repeat is counted in ``ignored_events``; the text is whole, once."""
    _, events = await raw(upstream, "fault/block-start-per-token", "anthropic")
    starts = types(events).count("content_block_start")
    result = await engine(upstream, "fault/block-start-per-token", "anthropic")
    assert result.outcome is Outcome.COMPLETED
    assert result.text == sent(events, "text_delta", "text") != ""
    assert result.choices[0].reasoning == sent(events, "thinking_delta", "thinking")
    assert result.ignored_events == starts - 2  # two blocks: thinking, then text
    assert (result.skipped_frames, len(result.choices[0].thinking)) == (0, 1)


async def test_stop_reason_null_then_message_stop(upstream: RunningUpstream) -> None:
    """llmgateway PR #1994: ``stop_reason: null`` then ``message_stop``: truncated, not
    retried (content came), the reason says no finish reason came, the text kept."""
    _, events = await raw(upstream, "fault/stop-reason-null", "anthropic")
    result = await engine(upstream, "fault/stop-reason-null", "anthropic")
    assert result.outcome is Outcome.TRUNCATED
    assert result.reason == ("message_stop arrived but no choice had a finish reason "
                             "(the server cut the stream)")
    assert result.text == sent(events, "text_delta", "text") != ""
    assert len(result.attempts) == 1


async def test_an_error_where_message_stop_belongs(upstream: RunningUpstream) -> None:
    """LiteLLM PR #32159: ``event: error`` saying the provider's stream ended early:
    an error with that message as its reason, the text so far kept."""
    _, events = await raw(upstream, "fault/error-not-stop", "anthropic")
    assert types(events)[-1] == "error"
    result = await engine(upstream, "fault/error-not-stop", "anthropic")
    assert result.outcome is Outcome.ERROR
    assert result.reason == INCOMPLETE
    assert result.error is not None and result.error.type == "api_error"
    assert result.text == sent(events, "text_delta", "text") != ""


async def test_tool_calls_closed_by_end_turn(upstream: RunningUpstream) -> None:
    """LiteLLM #34692: an empty text block, tool calls, ``stop_reason: "end_turn"``,
    ``message_delta`` without usage: completed, both calls whole, the finish reason
    as sent (``stop``, native ``end_turn``), the usage from ``message_start``."""
    _, events = await raw(upstream, "fault/end-turn-tools", "anthropic", tools=True)
    delta = next(b for _, b in events if isinstance(b, dict) and b["type"] == "message_delta")
    assert "usage" not in delta
    result = await engine(upstream, "fault/end-turn-tools", "anthropic", tools=TOOLS)
    assert result.outcome is Outcome.COMPLETED
    choice = result.choices[0]
    assert (choice.finish_reason, choice.native_finish_reason, choice.text) == (
        "stop", "end_turn", "")
    assert len(choice.tool_calls) == 2
    assert [json.loads(c.arguments) for c in choice.tool_calls] == [
        c.parsed for c in choice.tool_calls]
    assert "".join(c.arguments for c in choice.tool_calls) == sent(
        events, "input_json_delta", "partial_json")
    assert result.usage is not None and result.usage.prompt_tokens
    assert result.flags == ()


async def test_the_faults_are_served_on_their_route_only(upstream: RunningUpstream) -> None:
    """Each shape is one dialect's: the other routes answer 404 naming the route."""
    result = await engine(upstream, "fault/no-block-start", "responses")
    assert result.outcome is Outcome.ERROR and result.status == 404
    assert result.reason == ("HTTP 404: The model 'fault/no-block-start' is served on "
                             "/v1/messages only (fanout mock --list).")
    chat = await engine(upstream, "fault/litellm-bare", "chat")
    assert chat.status == 404 and chat.reason is not None and "/v1/responses only" in chat.reason


async def test_llama_cpp_call_ids_give_one_call_each(upstream: RunningUpstream) -> None:
    """llama.cpp's ``/v1/responses``: each call announced as ``{"id": "fc_…",
    "call_id": "call_…"}`` and closed as ``{"call_id": "fc_…"}``: two calls, not four,
    their arguments once, no ``output_index`` anywhere."""
    _, events = await raw(upstream, "fault/llama-call-ids", "responses", tools=True)
    assert not any("output_index" in b for _, b in events if isinstance(b, dict))
    closed = [b["item"] for _, b in events if isinstance(b, dict)
              and b["type"] == "response.output_item.done"
              and b["item"]["type"] == "function_call"]
    assert len(closed) == 2 and all("id" not in item for item in closed)
    result = await engine(upstream, "fault/llama-call-ids", "responses", tools=TOOLS)
    assert result.outcome is Outcome.COMPLETED
    calls = result.choices[0].tool_calls
    assert len(calls) == 2 and all(c.parse_error is None for c in calls)
    assert "".join(c.arguments for c in calls) == sent(
        events, "response.function_call_arguments.delta", "")
    assert result.skipped_frames == 0
