"""The engine in the three dialects, against the embedded upstream over loopback.

The same scripted answer gives the same result through chat, Responses and
Anthropic Messages; cuts, errors and overloads end the same honest ways; the
requests carry each dialect's URL, headers and body; the key never shows.
Request bodies are checked field by field (``fanout.bodies``).
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from fanout import (
    Deadlines,
    Endpoint,
    Event,
    Outcome,
    RetryPolicy,
    StreamRequest,
    StreamResult,
    open_fanout,
)
from fanout.bodies import DEFAULT_MAX_TOKENS, build_body
from fanout.records import dumps, event_record, result_record
from fanout.request import ANTHROPIC_VERSION
from fanout.upstream import RunningUpstream, open_upstream
from fanout.upstream.models import ECHO_PLACES

APIS = ("chat", "responses", "anthropic")
DIALECTS = ("responses", "anthropic")
USER = [{"role": "user", "content": "Tell me about rivers."}]
TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look it up",
                                           "parameters": {"type": "object", "properties": {
                                               "place": {"type": "string"},
                                               "days": {"type": "integer"}},
                                               "required": ["place", "days"]}}}]
FAST_RETRY = RetryPolicy(initial=0.01, maximum=0.02)
KEY = "sk-dialects-SECRET-0042"


class Recording(httpx.AsyncBaseTransport):
    """A real loopback transport that keeps every request it sent."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.sent: list[httpx.Request] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request)
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def run(upstream: RunningUpstream, *requests: StreamRequest, key: str | None = None,
              client: httpx.AsyncClient | None = None, **options: Any
              ) -> tuple[dict[str, StreamResult], list[Event]]:
    endpoint = Endpoint(upstream.base_url, key)
    events: list[Event] = []
    with trio.fail_after(15):
        async with open_fanout(endpoint, requests, client=client, **options) as fan:
            async for event in fan.events:
                events.append(event)
    return fan.results, events


def ask(model: str, api: str, key: str | None = None, **fields: Any) -> StreamRequest:
    return StreamRequest(key or f"{model}/{api}", model, fields.pop("messages", USER),
                         api=api, **fields)


def summary(result: StreamResult) -> dict[str, Any]:
    """What must not depend on the dialect: outcome, text, reasoning, tools, finish, usage."""
    choice = result.choices[0]
    usage = result.usage
    return {"outcome": result.outcome, "text": choice.text, "reasoning": choice.reasoning,
            "refusal": choice.refusal, "finish": choice.finish_reason,
            "tools": [(t.name, t.arguments, t.parsed) for t in choice.tool_calls],
            "usage": usage and (usage.prompt_tokens, usage.completion_tokens,
                                usage.total_tokens),
            "flags": result.flags}


# ---------------------------------------------------------------- the same result

@pytest.mark.parametrize(("model", "fields"), [
    ("mock/fast", {}),
    ("mock/slow:0", {"params": {"max_tokens": 9}}),
    ("mock/reasoning", {}),
    ("mock/tools", {"tools": TOOLS}),
    ("mock/fast", {"tools": TOOLS, "params": {"tool_choice": "required"}}),
    ("mock/length", {"params": {"max_tokens": 5}}),
    ("mock/echo", {"messages": [{"role": "system", "content": "Be brief."}, *USER]}),
])
async def test_the_same_answer_in_every_dialect(upstream: RunningUpstream, model: str,
                                                fields: dict[str, Any]) -> None:
    results, _ = await run(upstream, *(ask(model, api, **dict(fields)) for api in APIS))
    chat, responses, anthropic = (summary(results[f"{model}/{api}"]) for api in APIS)
    assert chat["outcome"] is Outcome.COMPLETED and not chat["flags"]
    assert chat["text"] or chat["tools"] or chat["reasoning"]
    assert responses == chat
    assert anthropic == chat


async def test_the_native_finish_reason_is_kept(upstream: RunningUpstream) -> None:
    results, _ = await run(upstream, *(ask("mock/length", api, params={"max_tokens": 4})
                                       for api in APIS),
                           *(ask("mock/tools", api, f"tools/{api}", tools=TOOLS)
                             for api in DIALECTS))
    natives = {key: r.choices[0].native_finish_reason for key, r in results.items()}
    assert natives == {"mock/length/chat": None,
                       "mock/length/responses": "max_output_tokens",
                       "mock/length/anthropic": "max_tokens",
                       "tools/responses": "completed", "tools/anthropic": "tool_use"}
    assert {r.choices[0].finish_reason for k, r in results.items()
            if k.startswith("mock/length")} == {"length"}


async def test_anthropic_thinking_keeps_its_signature(upstream: RunningUpstream) -> None:
    results, _ = await run(upstream, ask("mock/reasoning", "anthropic"))
    choice = results["mock/reasoning/anthropic"].choices[0]
    assert len(choice.thinking) == 1
    block = choice.thinking[0]
    assert block.thinking == choice.reasoning and block.signature


# ---------------------------------------------------------------- honest ends

@pytest.mark.parametrize("api", APIS)
async def test_a_cut_stream_is_truncated_with_its_text(upstream: RunningUpstream,
                                                       api: str) -> None:
    results, _ = await run(upstream, ask("fault/truncate", api),
                           ask("fault/no-done", api))
    cut, no_end = results[f"fault/truncate/{api}"], results[f"fault/no-done/{api}"]
    assert cut.outcome is Outcome.TRUNCATED and cut.choices[0].text
    assert no_end.outcome is Outcome.TRUNCATED and no_end.choices[0].text
    terminal = {"chat": "[DONE]", "responses": "response.completed",
                "anthropic": "message_stop"}[api]
    assert terminal in (no_end.reason or "")
    assert len(cut.attempts) == 1  # content had arrived: never retried


@pytest.mark.parametrize("api", APIS)
async def test_an_error_after_content_ends_error_with_the_text(upstream: RunningUpstream,
                                                               api: str) -> None:
    results, _ = await run(upstream, ask("fault/error-event", api), retry=FAST_RETRY)
    result = results[f"fault/error-event/{api}"]
    assert result.outcome is Outcome.ERROR
    assert result.reason == "The model crashed mid-stream (fanout mock)."
    assert result.choices[0].text  # the partial answer is kept
    assert len(result.attempts) == 1 and result.attempts[0].delivered_content


async def test_response_failed_is_an_error(upstream: RunningUpstream) -> None:
    results, _ = await run(upstream, ask("fault/error-event:failed", "responses"))
    result = results["fault/error-event:failed/responses"]
    assert result.outcome is Outcome.ERROR and result.choices[0].text


@pytest.mark.parametrize("api", APIS)
async def test_overloaded_before_content_is_retried(upstream: RunningUpstream,
                                                    api: str) -> None:
    # Three streams at once: an overloaded error is no slot cut, so others running
    # does not stop its retry.
    results, events = await run(upstream, ask("fault/overloaded", api),
                                ask("mock/slow", api, "other-1"), ask("mock/slow", api,
                                                                      "other-2"),
                                retry=FAST_RETRY)
    result = results[f"fault/overloaded/{api}"]
    assert result.outcome is Outcome.COMPLETED and result.choices[0].text
    assert [a.status for a in result.attempts] == [200, 200]
    first = result.attempts[0]
    assert first.error is not None and not first.delivered_content
    assert "overloaded" in f"{first.error.type} {first.error.code} {first.error.message}".lower()
    retrying = [e for e in events if type(e).__name__ == "StreamRetrying"
                and e.stream == f"fault/overloaded/{api}"]
    assert len(retrying) == 1


@pytest.mark.parametrize("api", APIS)
async def test_529_is_retried(upstream: RunningUpstream, api: str) -> None:
    results, _ = await run(upstream, ask("fault/529-then-ok", api), retry=FAST_RETRY)
    result = results[f"fault/529-then-ok/{api}"]
    assert result.outcome is Outcome.COMPLETED
    assert [a.status for a in result.attempts] == [529, 200]


async def test_529_needs_a_retry_policy_that_lists_it(upstream: RunningUpstream) -> None:
    policy = RetryPolicy(initial=0.01, statuses={500})
    results, _ = await run(upstream, ask("fault/529-then-ok", "anthropic"), retry=policy)
    result = results["fault/529-then-ok/anthropic"]
    assert result.outcome is Outcome.ERROR and [a.status for a in result.attempts] == [529]
    assert 529 in RetryPolicy().statuses


async def test_pings_alone_are_no_content(upstream: RunningUpstream) -> None:
    # Before the first content keep-alives (Anthropic's ping events, comments) show the
    # server is alive, so idle never fires; no ping is content: first_token ends the wait.
    waits = Deadlines(idle=0.3, first_token=1.0, total=10)
    results, _ = await run(upstream, ask("fault/pings:0.02", "anthropic", deadlines=waits),
                           ask("fault/pings:0.02", "responses", deadlines=waits))
    for api in DIALECTS:
        result = results[f"fault/pings:0.02/{api}"]
        assert result.outcome is Outcome.TIMED_OUT and result.timed_out == "first_token"
        assert not result.choices or not result.text


@pytest.mark.parametrize("api", DIALECTS)
async def test_garbage_frames_are_skipped(upstream: RunningUpstream, api: str) -> None:
    results, _ = await run(upstream, ask("fault/garbage", api))
    result = results[f"fault/garbage/{api}"]
    assert result.outcome is Outcome.COMPLETED and result.choices[0].text
    assert [f.value for f in result.flags] == ["skipped_frames"]


# ---------------------------------------------------------------- what is sent

async def test_each_dialect_sends_its_url_headers_and_body() -> None:
    recording = Recording()
    async with open_upstream(key=KEY) as upstream, httpx.AsyncClient(
            transport=recording) as client:
        results, _ = await run(upstream, *(ask("mock/fast", api, tools=TOOLS, messages=[
            {"role": "system", "content": "Be brief."}, *USER], params={"max_tokens": 30})
            for api in APIS), key=KEY, client=client)
    assert {r.outcome for r in results.values()} == {Outcome.COMPLETED}
    sent = {request.url.path: request for request in recording.sent}
    assert set(sent) == {"/v1/chat/completions", "/v1/responses", "/v1/messages"}
    for path in ("/v1/chat/completions", "/v1/responses"):
        assert sent[path].headers["authorization"] == f"Bearer {KEY}"
        assert "x-api-key" not in sent[path].headers
    anthropic = sent["/v1/messages"]
    assert "authorization" not in anthropic.headers
    assert anthropic.headers["x-api-key"] == KEY
    assert anthropic.headers["anthropic-version"] == ANTHROPIC_VERSION == "2023-06-01"
    body = json.loads(anthropic.content)
    assert body["system"] == "Be brief." and body["max_tokens"] == 30
    assert body["messages"] == USER and body["stream"] is True
    assert body["tools"][0] == {"name": "lookup", "description": "Look it up",
                                "input_schema": TOOLS[0]["function"]["parameters"]}
    responses = json.loads(sent["/v1/responses"].content)
    assert responses["instructions"] == "Be brief." and responses["max_output_tokens"] == 30
    assert responses["input"] == [{"type": "message", **m} for m in USER]
    assert "stream_options" not in responses
    assert responses["tools"][0]["name"] == "lookup"


async def test_the_endpoint_api_is_the_default_and_a_request_api_wins() -> None:
    recording = Recording()
    async with open_upstream() as upstream, httpx.AsyncClient(transport=recording) as client:
        endpoint = Endpoint(upstream.base_url, KEY, api="anthropic",
                            headers={"anthropic-version": "2024-01-01"})
        requests = [StreamRequest("a", "mock/fast", USER),
                    StreamRequest("c", "mock/fast", USER, api="chat")]
        with trio.fail_after(10):
            async with open_fanout(endpoint, requests, client=client) as fan:
                async for _ in fan.events:
                    pass
    assert {k: r.outcome for k, r in fan.results.items()} == {"a": Outcome.COMPLETED,
                                                                "c": Outcome.COMPLETED}
    paths = sorted(r.url.path for r in recording.sent)
    assert paths == ["/v1/chat/completions", "/v1/messages"]
    messages = next(r for r in recording.sent if r.url.path == "/v1/messages")
    assert messages.headers["anthropic-version"] == "2024-01-01"  # the endpoint's own wins
    assert json.loads(messages.content)["max_tokens"] == DEFAULT_MAX_TOKENS
    chat = next(r for r in recording.sent if r.url.path == "/v1/chat/completions")
    assert "anthropic-version" in chat.headers  # the endpoint's headers go everywhere
    assert "x-api-key" not in chat.headers and chat.headers["authorization"] == f"Bearer {KEY}"


@pytest.mark.parametrize("api", DIALECTS)
@pytest.mark.parametrize("where", ECHO_PLACES)
async def test_the_key_never_shows(upstream: RunningUpstream, api: str, where: str) -> None:
    results, events = await run(upstream, ask(f"fault/echo-key:{where}", api, "echo"),
                                key=KEY, retry=FAST_RETRY)
    result = results["echo"]
    assert result.outcome is not None
    for event in events:
        assert KEY not in repr(event) and KEY not in dumps(event_record(event))
    assert KEY not in repr(result) and KEY not in dumps(result_record(result))
    if where in ("stream-error", "event-error", "escaped", "all", "http", "json-200"):
        assert "***" in (result.reason or "")  # what the server said, with the key blanked


# ---------------------------------------------------------------- refused parameters

@pytest.mark.parametrize(("api", "params", "message"), [
    ("anthropic", {"n": 2}, "stream 's': the anthropic API has no parameter 'n' (one answer "
     "per request: run more samples instead)"),
    ("anthropic", {"presence_penalty": 0.5}, "stream 's': the anthropic API has no parameter "
     "'presence_penalty' (the Messages API has no presence penalty)"),
    ("responses", {"seed": 1}, "stream 's': the responses API has no parameter 'seed' (the "
     "Responses API has no seed)"),
    ("responses", {"input": "x"}, "stream 's': the responses API has no parameter 'input' "
     "(it is set by fanout)"),
])
def test_a_parameter_the_dialect_lacks_is_a_value_error(api: str, params: dict[str, Any],
                                                        message: str) -> None:
    with pytest.raises(ValueError) as caught:
        StreamRequest("s", "m", USER, params, api=api)
    assert str(caught.value) == message


def test_an_unknown_api_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="api must be one of 'chat', 'responses', "
                                         "'anthropic', not 'claude'"):
        StreamRequest("s", "m", USER, api="claude")
    with pytest.raises(ValueError, match="api must be one of"):
        Endpoint("http://relay/v1", api="openai")
    with pytest.raises(ValueError, match="headers must not carry X-Api-Key: pass api_key"):
        Endpoint("http://relay/v1", headers={"X-Api-Key": "sk-x"})
    with pytest.raises(ValueError, match="must not carry x-api-key"):
        StreamRequest("s", "m", USER, headers={"x-api-key": "sk-x"})


async def test_an_endpoint_dialect_refuses_a_parameter_before_sending(
        upstream: RunningUpstream) -> None:
    endpoint = Endpoint(upstream.base_url, api="anthropic")
    with pytest.raises(ValueError, match="stream 's': the anthropic API has no parameter 'n'"):
        async with open_fanout(endpoint, [StreamRequest("s", "mock/fast", USER, {"n": 2})]):
            pass
    assert upstream.stats.requests == {}


def test_content_key_includes_the_dialect() -> None:
    endpoint = Endpoint("http://relay/v1")
    keys = {StreamRequest("s", "m", USER, api=api).content_key(endpoint) for api in APIS}
    assert len(keys) == 3
    # chat's key is what it was before dialects: results files resume without redoing
    assert StreamRequest("s", "m", USER).content_key(endpoint) == StreamRequest(
        "s", "m", USER, api="chat").content_key(endpoint)
    assert StreamRequest("s", "m", USER).content_key(Endpoint(
        "http://relay/v1", api="anthropic")) == StreamRequest(
        "s", "m", USER, api="anthropic").content_key(endpoint)


def test_expected_choices_and_usage_per_dialect() -> None:
    assert StreamRequest("s", "m", USER, {"n": 3}).expected_choices == 3
    for api in DIALECTS:
        request = StreamRequest("s", "m", USER, api=api)
        assert request.expected_choices == 1 and request.expects_usage


# ---------------------------------------------------------------- the body mapping

CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": [{"type": "text", "text": "Weather in Oslo?"},
                                 {"type": "image_url", "image_url": {
                                     "url": "data:image/png;base64,iVBORw0KGgo="}}]},
    {"role": "assistant", "content": "Checking.", "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "lookup", "arguments": "{\"place\": \"Oslo\", \"days\": 1}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "rain"},
    {"role": "user", "content": "And tomorrow?"},
]


def test_the_anthropic_body() -> None:
    body = build_body("anthropic", "claude-x", CONVERSATION,
                      {"temperature": 0.2, "stop": "END", "user": "u-1", "top_k": 5,
                       "parallel_tool_calls": False, "tool_choice": {
                           "type": "function", "function": {"name": "lookup"}}}, TOOLS)
    assert body == {
        "model": "claude-x",
        "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "Weather in Oslo?"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                             "data": "iVBORw0KGgo="}}]},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "call_1", "name": "lookup",
                 "input": {"place": "Oslo", "days": 1}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "call_1", "content": "rain"},
                {"type": "text", "text": "And tomorrow?"}]},
        ],
        "max_tokens": DEFAULT_MAX_TOKENS, "system": "You are terse.",
        "stop_sequences": ["END"], "metadata": {"user_id": "u-1"},
        "tool_choice": {"type": "tool", "name": "lookup", "disable_parallel_tool_use": True},
        "temperature": 0.2, "top_k": 5,
        "tools": [{"name": "lookup", "description": "Look it up",
                   "input_schema": TOOLS[0]["function"]["parameters"]}],
        "stream": True,
    }


def test_the_responses_body() -> None:
    body = build_body("responses", "gpt-x", CONVERSATION,
                      {"max_completion_tokens": 64, "reasoning_effort": "low",
                       "tool_choice": {"type": "function", "function": {"name": "lookup"}},
                       "response_format": {"type": "json_schema", "json_schema": {
                           "name": "w", "schema": {"type": "object"}, "strict": True}},
                       "store": False}, TOOLS)
    assert body == {
        "model": "gpt-x",
        "input": [
            {"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "Weather in Oslo?"},
                {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo=",
                 "detail": "auto"}]},
            {"type": "message", "role": "assistant", "content": "Checking."},
            {"type": "function_call", "call_id": "call_1", "name": "lookup",
             "arguments": "{\"place\": \"Oslo\", \"days\": 1}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "rain"},
            {"type": "message", "role": "user", "content": "And tomorrow?"},
        ],
        "instructions": "You are terse.", "max_output_tokens": 64,
        "reasoning": {"effort": "low"},
        "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"},
                            "strict": True}},
        "tool_choice": {"type": "function", "name": "lookup"}, "store": False,
        "tools": [{"type": "function", "name": "lookup", "description": "Look it up",
                   "parameters": TOOLS[0]["function"]["parameters"], "strict": False}],
        "stream": True,
    }


def test_every_responses_input_item_has_the_form_the_api_reference_gives() -> None:
    # llama.cpp answers 400 "Cannot determine type of 'item'" to an item without its type:
    # every item names it, and each one validates against the openai SDK's input types.
    pydantic = pytest.importorskip("pydantic")
    from openai.types.responses import ResponseInputItemParam
    body = build_body("responses", "gpt-x", CONVERSATION, {}, TOOLS)
    adapter = pydantic.TypeAdapter(ResponseInputItemParam)
    for item in body["input"]:
        assert item["type"] in ("message", "function_call", "function_call_output"), item
        adapter.validate_python(item)
    assistant = [i for i in body["input"] if i.get("role") == "assistant"]
    assert assistant == [{"type": "message", "role": "assistant", "content": "Checking."}]


async def test_a_multi_turn_conversation_is_answered_on_every_route() -> None:
    # The embedded upstream refuses an assistant item without its type on /v1/responses,
    # as llama.cpp does ("Cannot determine type of 'item'"): 20 of 20 conversations failed.
    turns = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello!"},
             {"role": "user", "content": "Tell me about rivers."}]
    async with open_upstream() as upstream:
        results, _ = await run(upstream, *(ask("mock/fast", api, messages=turns)
                                           for api in APIS))
        bare = {"model": "mock/fast", "stream": True, "input": [
            {"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello!"}]}
        async with httpx.AsyncClient() as client:
            refused = await client.post(f"{upstream.base_url}/responses", json=bare)
    assert {r.outcome for r in results.values()} == {Outcome.COMPLETED}, results
    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == "Cannot determine type of 'item'"


def test_the_chat_body_is_unchanged() -> None:
    body = build_body("chat", "m", USER, {"n": 2, "seed": 1}, TOOLS)
    assert body == {"model": "m", "messages": USER, "stream": True,
                    "stream_options": {"include_usage": True}, "n": 2, "seed": 1,
                    "tools": TOOLS}
    assert StreamRequest("s", "m", USER, {"n": 2, "seed": 1}, tools=TOOLS).body() == body


def test_anthropic_tool_arguments_must_be_an_object() -> None:
    bad = [{"role": "assistant", "tool_calls": [{"id": "c", "function": {
        "name": "f", "arguments": "[1, 2]"}}]}, *USER]
    with pytest.raises(ValueError, match=r"stream 's': messages\[0\]\.tool_calls\[0\]: the "
                                         "arguments must be a JSON object"):
        StreamRequest("s", "m", bad, api="anthropic")
    assert StreamRequest("s", "m", bad, api="responses").body()["input"][0]["arguments"] == (
        "[1, 2]")


# ---------------------------------------------------------------- every fault, every dialect

FAULTS = ["fault/truncate", "fault/truncate:0", "fault/no-done", "fault/drop-chunked",
          "fault/stall:3", "fault/heartbeat-stall:3", "fault/slow-first-token:0.05",
          "fault/garbage", "fault/error-event", "fault/429:1", "fault/500-then-ok",
          "fault/503-then-ok", "fault/529-then-ok", "fault/overloaded", "fault/busy:1",
          "fault/empty-200", "fault/empty-stop", "fault/html", "fault/json-body",
          "fault/json-error-200", "fault/validation-500", "fault/400", "fault/gzip",
          "fault/set-cookie", "fault/cut-before-content", "fault/no-response",
          "fault/drip-headers:0.05", "fault/drip-body:0.05", "fault/endless:0.01",
          "fault/pings:0.02", "mock/length"]


@pytest.mark.parametrize("model", FAULTS)
async def test_every_fault_ends_the_same_way_in_every_dialect(upstream: RunningUpstream,
                                                              model: str) -> None:
    """Outcome, deadline, flags, attempts (and their statuses), whether text came, and the
    finish reason: the same whichever dialect carried the fault.  One dialect at a time,
    so no stream's retry depends on the others running."""
    deadlines = Deadlines(first_byte=1, idle=0.4, total=2)
    retry = RetryPolicy(initial=0.01, maximum=0.02, max_retry_after=0.05)

    def ending(result: StreamResult, api: str) -> tuple[Any, ...]:
        choice = result.choices[0] if result.choices else None
        finish = choice.finish_reason if choice else None
        if model == "fault/no-done" and api == "responses":
            assert finish is None  # the Responses API says why only in its terminal event
            finish = "stop"
        return (result.outcome, result.timed_out, result.flags, len(result.attempts),
                [a.status for a in result.attempts], bool(choice and choice.text), finish)

    endings = []
    for api in APIS:
        results, _ = await run(upstream, ask(model, api, deadlines=deadlines), retry=retry)
        endings.append(ending(results[f"{model}/{api}"], api))
    chat, responses, anthropic = endings
    assert responses == chat
    assert anthropic == chat


async def test_a_refusal_in_each_dialect(upstream: RunningUpstream) -> None:
    """Chat and Responses stream a refusal as its own field; Anthropic has none: its model
    writes the refusal as text and stops with ``refusal`` (content_filter)."""
    results, _ = await run(upstream, *(ask("mock/refusal", api) for api in APIS))
    chat, responses, anthropic = (results[f"mock/refusal/{api}"].choices[0] for api in APIS)
    assert chat.refusal and responses.refusal == chat.refusal and not chat.text
    assert (chat.finish_reason, responses.finish_reason) == ("stop", "stop")
    assert anthropic.text == chat.refusal and not anthropic.refusal
    assert (anthropic.finish_reason, anthropic.native_finish_reason) == ("content_filter",
                                                                         "refusal")


# ---------------------------------------------------------------- any input: a body or a ValueError

_scalars = st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=8)
_json = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.sampled_from(
                         ["type", "text", "function", "name", "arguments", "id", "image_url",
                          "url", "content", "role"]), inner, max_size=4), max_leaves=12)
_messages = st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant", "tool", "x"])},
    optional={"content": _json, "tool_calls": _json, "tool_call_id": _json}), min_size=1,
    max_size=4)
_params = st.dictionaries(st.sampled_from(
    ["temperature", "max_tokens", "max_completion_tokens", "stop", "user", "metadata",
     "tool_choice", "parallel_tool_calls", "reasoning_effort", "reasoning", "response_format",
     "text", "instructions", "system", "top_k"]), _json, max_size=4)


@settings(max_examples=300, deadline=None)
@given(api=st.sampled_from(DIALECTS), messages=_messages, params=_params)
def test_any_request_builds_a_body_or_says_why(api: str, messages: list[dict[str, Any]],
                                               params: dict[str, Any]) -> None:
    """Untrusted messages and params (a service's clients send them): a JSON body in the
    dialect's shape, or a ValueError, never another exception."""
    try:
        body = build_body(api, "m", messages, params, TOOLS)
    except ValueError:
        return
    json.dumps(body)
    assert body["stream"] is True and body["model"] == "m"
    if api == "anthropic":  # only the two roles the Messages API takes
        assert {turn["role"] for turn in body["messages"]} <= {"user", "assistant"}
        assert "max_tokens" in body
    else:
        assert "messages" not in body and isinstance(body["input"], list)
