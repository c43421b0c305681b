"""The embedded upstream's /v1/responses and /v1/messages, event by event, over loopback.

Every route serves the same planned answer; each dialect's events come in its
order and shapes; each fault means the same thing on every route; Anthropic's
auth, version header and error shape; the non-streamed bodies; replay.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any

import attrs
import httpx
import pytest
import trio

from fanout import SSEDecoder
from fanout.upstream import MODELS, RunningUpstream, open_upstream

USER = [{"role": "user", "content": "Tell me something about rivers."}]
TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"place": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["place", "days"]}}}
ANTHROPIC_HEADERS = {"anthropic-version": "2023-06-01"}


@attrs.frozen
class Got:
    status: int
    headers: httpx.Headers
    body: bytes
    events: list[tuple[str, Any]]  # (SSE event name, parsed data or the raw text)
    comments: int  # keep-alive comment lines
    broken: bool  # the body ended with a transport error (cut)

    @property
    def types(self) -> list[str]:
        return [name for name, _ in self.events]

    def data(self, name: str) -> list[Any]:
        return [data for kind, data in self.events if kind == name]

    def json(self) -> Any:
        return json.loads(self.body)


async def post(client: httpx.AsyncClient, path: str, body: dict[str, Any], *,
               headers: dict[str, str] | None = None,
               until: Callable[[list[tuple[str, Any]], int], bool] | None = None) -> Got:
    """POST ``body``; read to the end of the body (or until ``until(events, comments)``)."""
    decoder = SSEDecoder()
    events: list[tuple[str, Any]] = []
    raw: list[bytes] = []
    comments = 0
    broken = False
    with trio.fail_after(15):
        async with client.stream("POST", path, json=body, headers=headers) as response:
            try:
                with trio.CancelScope() as enough:  # never `break` out of httpx's iterator
                    async for piece in response.aiter_raw():
                        if enough.cancel_called:
                            continue
                        raw.append(piece)
                        comments += piece.count(b"\n:") + piece.startswith(b":")
                        for event in decoder.feed(piece):
                            try:
                                data: Any = json.loads(event.data)
                            except ValueError:
                                data = event.data
                            events.append((event.event, data))
                        if until is not None and until(events, comments):
                            enough.cancel()
            except httpx.RemoteProtocolError:
                broken = True
    return Got(response.status_code, response.headers, b"".join(raw), events, comments, broken)


def responses(model: str, **body: Any) -> dict[str, Any]:
    return {"model": model, "input": USER, "stream": True, **body}


def messages(model: str, **body: Any) -> dict[str, Any]:
    return {"model": model, "messages": USER, "max_tokens": 4096, "stream": True, **body}


async def anthropic(client: httpx.AsyncClient, body: dict[str, Any], **options: Any) -> Got:
    headers = {**ANTHROPIC_HEADERS, **options.pop("headers", {})}
    return await post(client, "/messages", body, headers=headers, **options)


def chat_text(body: bytes) -> str:
    decoder = SSEDecoder()
    text = []
    for event in decoder.feed(body):
        if event.data != "[DONE]":
            for choice in json.loads(event.data).get("choices", []):
                text.append(choice.get("delta", {}).get("content") or "")
    return "".join(text)


# ---------------------------------------------------------------- Responses

async def test_responses_text_events_in_order(client: httpx.AsyncClient) -> None:
    got = await post(client, "/responses", responses("mock/fast"))
    assert got.status == 200 and got.headers["content-type"].startswith("text/event-stream")
    types = got.types
    deltas = types.count("response.output_text.delta")
    assert deltas > 5
    assert types == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", *["response.output_text.delta"] * deltas,
                     "response.output_text.done", "response.content_part.done",
                     "response.output_item.done", "response.completed"]
    # every event: its SSE name is its type, and the sequence numbers count from 0
    assert all(data["type"] == name for name, data in got.events)
    assert [data["sequence_number"] for _, data in got.events] == list(range(len(types)))
    text = "".join(d["delta"] for d in got.data("response.output_text.delta"))
    assert got.data("response.output_text.done")[0]["text"] == text
    final = got.data("response.completed")[0]["response"]
    assert final["status"] == "completed" and final["output"][0]["content"][0]["text"] == text
    usage = final["usage"]
    assert usage["output_tokens"] == deltas and usage["input_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    item_ids = {d["item_id"] for d in got.data("response.output_text.delta")}
    assert item_ids == {got.data("response.output_item.added")[0]["item"]["id"]}


async def test_responses_reasoning_then_message(client: httpx.AsyncClient) -> None:
    got = await post(client, "/responses", responses("mock/reasoning"))
    added = [d["item"]["type"] for d in got.data("response.output_item.added")]
    assert added == ["reasoning", "message"]
    first_text = got.types.index("response.output_text.delta")
    assert got.types.index("response.reasoning_summary_text.delta") < first_text
    summary = "".join(d["delta"] for d in got.data("response.reasoning_summary_text.delta"))
    assert summary.startswith("Let me think")
    output = got.data("response.completed")[0]["response"]["output"]
    assert output[0]["summary"] == [{"type": "summary_text", "text": summary}]
    assert got.data("response.completed")[0]["response"]["usage"]["output_tokens_details"][
        "reasoning_tokens"] == len(got.data("response.reasoning_summary_text.delta"))


async def test_responses_function_calls_one_item_at_a_time(client: httpx.AsyncClient) -> None:
    tool = {"type": "function", "name": "lookup", "parameters": TOOL["function"]["parameters"]}
    got = await post(client, "/responses", responses("mock/tools", tools=[tool]))
    items = [d["item"] for d in got.data("response.output_item.added")]
    assert [i["type"] for i in items] == ["function_call", "function_call"]
    assert [i["name"] for i in items] == ["lookup", "get_weather"]
    for number, item in enumerate(items):
        deltas = [d for d in got.data("response.function_call_arguments.delta")
                  if d["item_id"] == item["id"]]
        assert {d["output_index"] for d in deltas} == {number}
        arguments = "".join(d["delta"] for d in deltas)
        done = [d for d in got.data("response.function_call_arguments.done")
                if d["item_id"] == item["id"]]
        assert done[0]["arguments"] == arguments and isinstance(json.loads(arguments), dict)
        assert item["call_id"].startswith("call_")
    # one item's fragments together: the deltas' item ids change exactly once
    ids = [d["item_id"] for d in got.data("response.function_call_arguments.delta")]
    assert sum(a != b for a, b in itertools.pairwise(ids)) == 1
    assert json.loads(got.data("response.completed")[0]["response"]["output"][0]["arguments"])[
        "place"]


async def test_responses_length_is_incomplete(client: httpx.AsyncClient) -> None:
    got = await post(client, "/responses", responses("mock/fast", max_output_tokens=7))
    assert got.types[-1] == "response.incomplete"
    final = got.data("response.incomplete")[0]["response"]
    assert final["status"] == "incomplete"
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["usage"]["output_tokens"] == 7
    assert got.types.count("response.output_text.delta") == 7


async def test_responses_refusal_part(client: httpx.AsyncClient) -> None:
    got = await post(client, "/responses", responses("mock/refusal"))
    assert got.data("response.content_part.added")[0]["part"]["type"] == "refusal"
    refusal = "".join(d["delta"] for d in got.data("response.refusal.delta"))
    assert got.data("response.refusal.done")[0]["refusal"] == refusal
    assert "can't help" in refusal and "response.output_text.delta" not in got.types


async def test_responses_not_streamed(client: httpx.AsyncClient) -> None:
    got = await post(client, "/responses", responses("mock/tools", stream=False,
                                                     tools=[{"type": "function",
                                                             "name": "lookup"}]))
    body = got.json()
    assert body["object"] == "response" and body["status"] == "completed"
    assert [o["type"] for o in body["output"]] == ["function_call", "function_call"]
    assert all(isinstance(json.loads(o["arguments"]), dict) for o in body["output"])
    assert body["usage"]["total_tokens"] > 0


# ---------------------------------------------------------------- Anthropic

async def test_anthropic_text_events_in_order(client: httpx.AsyncClient) -> None:
    got = await anthropic(client, messages("mock/fast"))
    assert got.status == 200
    deltas = got.types.count("content_block_delta")
    assert got.types == ["message_start", "ping", "content_block_start",
                         *["content_block_delta"] * deltas, "content_block_stop",
                         "message_delta", "message_stop"]
    assert all(data["type"] == name for name, data in got.events)
    start = got.data("message_start")[0]["message"]
    assert start["role"] == "assistant" and start["content"] == [] and start["id"].startswith(
        "msg_")
    assert start["usage"]["input_tokens"] > 0
    assert got.data("content_block_start")[0] == {"type": "content_block_start", "index": 0,
                                                  "content_block": {"type": "text", "text": ""}}
    assert {d["delta"]["type"] for d in got.data("content_block_delta")} == {"text_delta"}
    final = got.data("message_delta")[0]
    assert final["delta"]["stop_reason"] == "end_turn"
    assert final["usage"]["output_tokens"] == deltas


async def test_anthropic_thinking_block_with_signature(client: httpx.AsyncClient) -> None:
    got = await anthropic(client, messages("mock/reasoning"))
    blocks = [d["content_block"]["type"] for d in got.data("content_block_start")]
    assert blocks == ["thinking", "text"]
    thinking = [d for d in got.data("content_block_delta") if d["index"] == 0]
    assert {d["delta"]["type"] for d in thinking[:-1]} == {"thinking_delta"}
    assert thinking[-1]["delta"]["type"] == "signature_delta"  # last, before the stop
    assert thinking[-1]["delta"]["signature"]
    stop_0 = got.events.index(("content_block_stop", {"type": "content_block_stop", "index": 0}))
    assert got.events[stop_0 - 1][1]["delta"]["type"] == "signature_delta"
    assert all(d["delta"]["type"] == "text_delta" for d in got.data("content_block_delta")
               if d["index"] == 1)


async def test_anthropic_tool_use_blocks(client: httpx.AsyncClient) -> None:
    tool = {"name": "lookup", "input_schema": TOOL["function"]["parameters"]}
    got = await anthropic(client, messages("mock/tools", tools=[tool]))
    starts = [d["content_block"] for d in got.data("content_block_start")]
    assert [b["type"] for b in starts] == ["tool_use", "tool_use"]
    assert [b["name"] for b in starts] == ["lookup", "get_weather"]
    assert all(b["id"].startswith("toolu_") and b["input"] == {} for b in starts)
    for index in (0, 1):
        parts = [d["delta"] for d in got.data("content_block_delta") if d["index"] == index]
        assert {p["type"] for p in parts} == {"input_json_delta"}
        arguments = json.loads("".join(p["partial_json"] for p in parts))
        assert isinstance(arguments, dict)
    # blocks are strictly sequential: block 0 stops before block 1 starts
    assert got.types.index("content_block_stop") < [
        i for i, t in enumerate(got.types) if t == "content_block_start"][1]
    assert got.data("message_delta")[0]["delta"]["stop_reason"] == "tool_use"


async def test_anthropic_forced_tool(client: httpx.AsyncClient) -> None:
    tool = {"name": "lookup", "input_schema": TOOL["function"]["parameters"]}
    got = await anthropic(client, messages("mock/fast", tools=[tool],
                                           tool_choice={"type": "tool", "name": "lookup"}))
    assert [d["content_block"]["name"] for d in got.data("content_block_start")] == ["lookup"]
    assert got.data("message_delta")[0]["delta"]["stop_reason"] == "tool_use"


async def test_anthropic_length_and_refusal_stop_reasons(client: httpx.AsyncClient) -> None:
    got = await anthropic(client, messages("mock/fast", max_tokens=5))
    assert got.data("message_delta")[0]["delta"]["stop_reason"] == "max_tokens"
    assert got.types.count("content_block_delta") == 5
    refused = await anthropic(client, messages("mock/refusal"))
    assert refused.data("message_delta")[0]["delta"]["stop_reason"] == "refusal"


async def test_anthropic_not_streamed(client: httpx.AsyncClient) -> None:
    got = await anthropic(client, messages("mock/reasoning", stream=False))
    body = got.json()
    assert body["type"] == "message" and body["stop_reason"] == "end_turn"
    assert [b["type"] for b in body["content"]] == ["thinking", "text"]
    assert body["content"][0]["signature"] and body["content"][1]["text"]
    assert body["usage"]["output_tokens"] > 0


# ---------------------------------------------------------------- one answer, three routes

@pytest.mark.parametrize("model", ["mock/fast", "mock/echo", "mock/slow:0"])
async def test_the_same_text_on_every_route(client: httpx.AsyncClient, model: str) -> None:
    chat = await post(client, "/chat/completions", {"model": model, "messages": USER,
                                                    "stream": True})
    via_responses = await post(client, "/responses", responses(model))
    via_messages = await anthropic(client, messages(model))
    text = chat_text(chat.body)
    assert text
    assert "".join(d["delta"] for d in via_responses.data("response.output_text.delta")) == text
    assert "".join(d["delta"]["text"] for d in via_messages.data("content_block_delta")) == text


async def test_stats_count_requests_by_route(upstream: RunningUpstream,
                                             client: httpx.AsyncClient) -> None:
    await post(client, "/responses", responses("mock/fast"))
    await anthropic(client, messages("mock/fast"))
    await anthropic(client, messages("mock/echo"))
    assert upstream.stats.routes == {"responses": 1, "anthropic": 2}
    assert upstream.stats.requests == {"mock/fast": 2, "mock/echo": 1}


# ---------------------------------------------------------------- requests refused

@pytest.mark.parametrize(("body", "headers", "says"), [
    ({"model": "mock/fast", "messages": USER, "stream": True}, ANTHROPIC_HEADERS,
     "max_tokens: Field required"),
    (messages("mock/fast"), {}, "anthropic-version: header is required"),
    (messages("mock/fast", n=2), ANTHROPIC_HEADERS, "n: Extra inputs are not permitted"),
    ({**messages("mock/fast"), "messages": [{"role": "system", "content": "x"}, *USER]},
     ANTHROPIC_HEADERS, "messages.0.role: Input should be 'user' or 'assistant'"),
    (messages("mock/fast", tools=[{"name": "t"}]), ANTHROPIC_HEADERS,
     "tools.0.input_schema: Field required"),
])
async def test_messages_refuses_what_anthropic_refuses(client: httpx.AsyncClient,
                                                       body: dict[str, Any],
                                                       headers: dict[str, str],
                                                       says: str) -> None:
    got = await post(client, "/messages", body, headers=headers)
    assert got.status == 400
    assert got.json() == {"type": "error", "error": {"type": "invalid_request_error",
                                                     "message": says}}


@pytest.mark.parametrize(("body", "says"), [
    ({"model": "mock/fast", "messages": USER}, "Unknown parameter: 'messages'."),
    ({"model": "mock/fast"}, "Missing required parameter: 'input'."),
    (responses("mock/fast", max_tokens=5), "Unknown parameter: 'max_tokens'."),
    (responses("mock/fast", tools=[TOOL]), "Missing required parameter: 'tools[0].name'."),
])
async def test_responses_refuses_what_openai_refuses(client: httpx.AsyncClient,
                                                     body: dict[str, Any], says: str) -> None:
    got = await post(client, "/responses", body)
    assert got.status == 400
    assert got.json()["error"]["message"] == says


async def test_a_chat_only_model_is_a_404_on_the_other_routes(client: httpx.AsyncClient
                                                              ) -> None:
    chat_only = sorted(m for m, spec in MODELS.items() if spec.apis == ("chat",))
    assert "fault/many-choices" in chat_only and "slot/clean" in chat_only
    got = await anthropic(client, messages("fault/many-choices"))
    assert got.status == 404
    assert got.json()["error"] == {"type": "not_found_error", "message": (
        "The model 'fault/many-choices' is served on /v1/chat/completions only "
        "(fanout mock --list).")}
    unknown = await post(client, "/responses", responses("mock/nope"))
    assert unknown.status == 404 and unknown.json()["error"]["code"] == "model_not_found"


# ---------------------------------------------------------------- auth

async def test_anthropic_auth_is_x_api_key() -> None:
    key = "sk-ant-mock-KEY"
    timeout = httpx.Timeout(5, read=None)
    async with open_upstream(key=key) as upstream, httpx.AsyncClient(
            base_url=upstream.base_url, timeout=timeout) as client:
        missing = await anthropic(client, messages("mock/fast"))
        bearer = await anthropic(client, messages("mock/fast"),
                                 headers={"authorization": f"Bearer {key}"})
        wrong = await anthropic(client, messages("mock/fast"), headers={"x-api-key": "sk-no"})
        right = await anthropic(client, messages("mock/fast"), headers={"x-api-key": key})
        openai = await post(client, "/responses", responses("mock/fast"),
                            headers={"authorization": f"Bearer {key}"})
        openai_none = await post(client, "/responses", responses("mock/fast"),
                                 headers={"x-api-key": key})
    for refused in (missing, bearer, wrong):
        assert refused.status == 401
        assert refused.json() == {"type": "error", "error": {
            "type": "authentication_error", "message": "invalid x-api-key"}}
        assert key.encode() not in refused.body and b"sk-no" not in refused.body
    assert right.status == 200 and right.types[-1] == "message_stop"
    assert openai.status == 200 and openai.types[-1] == "response.completed"
    assert openai_none.status == 401 and openai_none.json()["error"]["code"] == "invalid_api_key"


# ---------------------------------------------------------------- faults, per dialect

TERMINAL = {"responses": "response.completed", "anthropic": "message_stop"}


async def dialect(client: httpx.AsyncClient, api: str, model: str, **options: Any) -> Got:
    if api == "responses":
        return await post(client, "/responses", responses(model), **options)
    return await anthropic(client, messages(model), **options)


@pytest.mark.parametrize("api", ["responses", "anthropic"])
async def test_truncate_cuts_the_sixth_write_and_closes(client: httpx.AsyncClient,
                                                        api: str) -> None:
    got = await dialect(client, api, "fault/truncate")
    assert got.broken  # the connection closed mid-body
    assert TERMINAL[api] not in got.types
    text_type = "response.output_text.delta" if api == "responses" else "content_block_delta"
    assert text_type in got.types  # content came first: a partial answer


@pytest.mark.parametrize("api", ["responses", "anthropic"])
async def test_no_done_leaves_out_only_the_terminal_event(client: httpx.AsyncClient,
                                                          api: str) -> None:
    got = await dialect(client, api, "fault/no-done")
    assert not got.broken and TERMINAL[api] not in got.types  # a clean end, without it
    if api == "anthropic":  # the stop reason still came: only message_stop is missing
        assert got.types[-1] == "message_delta"
        assert got.data("message_delta")[0]["delta"]["stop_reason"] == "end_turn"
    else:  # every item closed, then nothing
        assert got.types[-3:] == ["response.output_text.done", "response.content_part.done",
                                  "response.output_item.done"]


@pytest.mark.parametrize("api", ["responses", "anthropic"])
async def test_error_event_after_content(client: httpx.AsyncClient, api: str) -> None:
    got = await dialect(client, api, "fault/error-event")
    assert got.types[-1] == "error" and TERMINAL[api] not in got.types
    assert len(got.events) > 3
    error = got.data("error")[0]
    if api == "anthropic":
        assert error == {"type": "error", "error": {
            "type": "api_error", "message": "The model crashed mid-stream (fanout mock)."}}
    else:
        assert error["code"] == "mock_crash" and "crashed" in error["message"]


async def test_error_event_failed_is_response_failed(client: httpx.AsyncClient) -> None:
    got = await post(client, "/responses", responses("fault/error-event:failed"))
    assert got.types[-1] == "response.failed"
    failed = got.data("response.failed")[0]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "mock_crash"


@pytest.mark.parametrize("api", ["responses", "anthropic"])
async def test_overloaded_before_content_then_ok(client: httpx.AsyncClient, api: str) -> None:
    first = await dialect(client, api, "fault/overloaded")
    second = await dialect(client, api, "fault/overloaded")
    assert first.types[-1] == "error"
    assert not any("delta" in t for t in first.types)  # nothing of the answer yet
    error = first.data("error")[0]
    if api == "anthropic":
        assert first.types == ["message_start", "ping", "error"]
        assert error["error"] == {"type": "overloaded_error", "message": "Overloaded"}
    else:
        assert error["code"] == "overloaded"
    assert second.types[-1] == TERMINAL[api]


@pytest.mark.parametrize("api", ["responses", "anthropic"])
async def test_529_then_ok(client: httpx.AsyncClient, api: str) -> None:
    first = await dialect(client, api, "fault/529-then-ok")
    second = await dialect(client, api, "fault/529-then-ok")
    assert first.status == 529
    if api == "anthropic":
        assert first.json()["type"] == "error"
        assert first.json()["error"]["type"] == "overloaded_error"
    else:
        assert first.json()["error"]["code"] == "overloaded"
    assert second.status == 200 and second.types[-1] == TERMINAL[api]


async def test_pings_only(client: httpx.AsyncClient) -> None:
    anth = await anthropic(client, messages("fault/pings:0.01"),
                           until=lambda events, _: len(events) >= 8)
    assert anth.types == ["message_start", *["ping"] * 7]
    resp = await post(client, "/responses", responses("fault/pings:0.01"),
                      until=lambda _, comments: comments >= 5)
    assert resp.types == ["response.created", "response.in_progress"]  # no event after them
    assert resp.comments >= 5


async def test_heartbeat_stall_pings_after_content(client: httpx.AsyncClient) -> None:
    got = await anthropic(client, messages("fault/heartbeat-stall:4"),
                          headers={"x-fanout-cadence": "0"},
                          until=lambda events, _: events[-1][0] == "ping" and events.count(
                              ("ping", {"type": "ping"})) >= 4)
    # 4 writes: message_start with its ping, then 3 text deltas (the first opens the block)
    assert got.types[:6] == ["message_start", "ping", "content_block_start",
                             *["content_block_delta"] * 3]
    assert set(got.types[6:]) == {"ping"}


@pytest.mark.parametrize("api", ["responses", "anthropic"])
async def test_garbage_frames_in_the_dialect(client: httpx.AsyncClient, api: str) -> None:
    got = await dialect(client, api, "fault/garbage")
    named = "response.output_text.delta" if api == "responses" else "content_block_delta"
    malformed = [data for name, data in got.events if not isinstance(data, dict)]
    malformed_named = [name for name, data in got.events if not isinstance(data, dict)]
    assert malformed and set(malformed_named) == {named}
    assert got.types[-1] == TERMINAL[api]


@pytest.mark.parametrize("api", ["responses", "anthropic"])
async def test_429_in_the_dialect_shape_with_retry_after(client: httpx.AsyncClient,
                                                         api: str) -> None:
    got = await dialect(client, api, "fault/429:1", headers={"x-fanout-retry-after": "2"}
                        if api == "responses" else {**ANTHROPIC_HEADERS,
                                                    "x-fanout-retry-after": "2"})
    assert got.status == 429 and got.headers["retry-after"] == "2"
    error = got.json()["error"]
    assert error["type"] == "rate_limit_error"
    if api == "anthropic":
        assert set(error) == {"type", "message"} and got.json()["type"] == "error"


@pytest.mark.parametrize("api", ["responses", "anthropic"])
@pytest.mark.parametrize("model", ["fault/html", "fault/empty-200", "fault/gzip",
                                   "fault/validation-500", "fault/json-body"])
async def test_http_level_faults_on_every_route(client: httpx.AsyncClient, api: str,
                                                model: str) -> None:
    got = await dialect(client, api, model)
    if model == "fault/html":
        assert got.status == 200 and got.headers["content-type"].startswith("text/html")
    elif model == "fault/empty-200":
        assert got.status == 200 and got.body == b""
    elif model == "fault/gzip":
        assert got.headers["content-encoding"] == "gzip"
    elif model == "fault/validation-500":
        assert got.status == 500 and "validation error" in got.body.decode()
    else:  # the dialect's whole non-streamed body, though a stream was asked for
        body = got.json()
        assert body["object" if api == "responses" else "type"] == (
            "response" if api == "responses" else "message")


@pytest.mark.parametrize("api", ["responses", "anthropic"])
async def test_echo_key_sends_the_key_back(api: str) -> None:
    key = "sk-echo-DIALECT-42"
    async with open_upstream() as upstream, httpx.AsyncClient(
            base_url=upstream.base_url, timeout=httpx.Timeout(5, read=None)) as client:
        auth = ({"authorization": f"Bearer {key}"} if api == "responses"
                else {**ANTHROPIC_HEADERS, "x-api-key": key})
        places = {}
        for where in ("stream-error", "meta", "skipped", "escaped", "all", "headers", "http"):
            got = await dialect(client, api, f"fault/echo-key:{where}", headers=auth)
            places[where] = got
    for where in ("stream-error", "meta", "skipped", "all", "http"):
        assert key.encode() in places[where].body, where
    assert key.encode() not in places["escaped"].body  # only \\uXXXX escapes of it
    assert "Incorrect API key provided: " + key in json.dumps(
        places["escaped"].data("error")[0], ensure_ascii=False)
    assert places["headers"].headers["x-echo"] == key
    assert places["http"].status == 401
    assert places["meta"].types[-1] == TERMINAL[api]


async def test_replay_is_said_in_each_dialect(client: httpx.AsyncClient) -> None:
    chat = await post(client, "/chat/completions", {"model": "replay/01_plain:x0",
                                                    "messages": USER, "stream": True})
    via_responses = await post(client, "/responses", responses("replay/01_plain:x0"))
    via_messages = await anthropic(client, messages("replay/01_plain:x0"))
    text = chat_text(chat.body)
    assert text
    assert "".join(d["delta"] for d in via_responses.data("response.output_text.delta")) == text
    assert "".join(d["delta"]["text"] for d in via_messages.data("content_block_delta")) == text
    assert via_responses.types[-1] == "response.completed"
    assert via_messages.types[-1] == "message_stop"


async def test_a_cut_capture_stays_cut_in_each_dialect(client: httpx.AsyncClient) -> None:
    # llama.cpp's cut: [DONE] without a finish reason; no dialect can say that, so no
    # terminal event is sent
    via_messages = await anthropic(client, messages("replay/15_interrupted_first:x0"))
    via_responses = await post(client, "/responses", responses("replay/15_interrupted_first:x0"))
    assert "content_block_delta" in via_messages.types
    assert "message_stop" not in via_messages.types and "message_delta" not in via_messages.types
    assert "response.output_text.delta" in via_responses.types
    assert "response.completed" not in via_responses.types
