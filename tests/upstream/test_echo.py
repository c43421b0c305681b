"""fault/echo-key and fault/empty-stop: what a hostile or careless server sends back."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import trio

from fanout.upstream import RunningUpstream, serve_upstream
from fanout.upstream.models import ECHO_MARKER, ECHO_PLACES
from fanout.upstream.plans import parse_chat_request
from tests.upstream.wire import TIMEOUT, Reply, chat, events, payloads

KEY = "sk-test-Echo-7f3a9c"
AUTH = {"authorization": f"Bearer {KEY}"}
ERROR_FIELDS = ("message", "type", "code", "param")


@pytest.fixture
async def http(upstream: RunningUpstream) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=upstream.base_url, timeout=TIMEOUT,
                                 headers=AUTH) as client:
        yield client


async def echo(http: httpx.AsyncClient, where: str, **body: Any) -> Reply:
    with trio.fail_after(5):
        return await chat(http, f"fault/echo-key:{where}", max_tokens=6, **body)


def contents(body: bytes) -> list[str]:
    return [c["delta"]["content"] for p in payloads(body) if isinstance(p, dict)
            for c in p.get("choices", []) if c["delta"].get("content")]


def assert_keyed_error(error: dict[str, Any], key: str = KEY) -> None:
    assert key in error["message"]
    assert all(error[field] == key for field in ERROR_FIELDS[1:])


async def test_stream_error_after_two_content_chunks(http: httpx.AsyncClient) -> None:
    reply = await echo(http, "stream-error")
    frames = events(reply.body)
    assert reply.status == 200 and frames[-1].startswith('data: {"error"')
    assert len(contents(reply.body)) == 2 and len(frames) == 4  # role, 2 contents, error
    assert_keyed_error(json.loads(frames[-1][6:])["error"])
    assert b"[DONE]" not in reply.body


async def test_event_error_is_the_same_under_event_error(http: httpx.AsyncClient) -> None:
    reply = await echo(http, "event-error")
    last = events(reply.body)[-1]
    assert last.startswith("event: error\ndata: ")
    assert_keyed_error(json.loads(last.split("\n", 1)[1][6:])["error"])
    assert len(contents(reply.body)) == 2


async def test_http_401_has_the_key_in_every_field(http: httpx.AsyncClient) -> None:
    reply = await echo(http, "http")
    assert reply.status == 401 and reply.headers["content-type"] == "application/json"
    assert_keyed_error(json.loads(reply.body)["error"])


async def test_http_text_500(http: httpx.AsyncClient) -> None:
    reply = await echo(http, "http-text")
    assert reply.status == 500 and reply.headers["content-type"].startswith("text/plain")
    assert KEY in reply.body.decode()


async def test_json_200_error(http: httpx.AsyncClient) -> None:
    reply = await echo(http, "json-200")
    assert reply.status == 200 and reply.headers["content-type"] == "application/json"
    assert_keyed_error(json.loads(reply.body)["error"])


async def test_headers_carry_the_key_and_the_body_does_not(http: httpx.AsyncClient) -> None:
    reply = await echo(http, "headers")
    for name in ("x-request-id", "openai-model", "retry-after",
                 "x-ratelimit-remaining-requests", "x-echo"):
        assert reply.headers[name] == KEY, name
    assert reply.headers["set-cookie"] == f"fanout_echo={KEY}; Path=/"
    assert KEY.encode() not in reply.body and reply.body.endswith(b"data: [DONE]\n\n")


async def test_meta_puts_the_key_in_ids_model_fingerprint_and_a_tool_call(
        http: httpx.AsyncClient) -> None:
    reply = await echo(http, "meta")
    chunks = payloads(reply.body)
    assert chunks and all((c["id"], c["model"], c["system_fingerprint"]) == (KEY, KEY, KEY)
                          for c in chunks)
    [call] = [t for c in chunks for ch in c["choices"] for t in ch["delta"].get("tool_calls", [])]
    assert (call["id"], call["function"]["name"]) == (KEY, KEY)
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert reply.body.endswith(b"data: [DONE]\n\n")


async def test_skipped_frames_hold_the_key(http: httpx.AsyncClient) -> None:
    reply = await echo(http, "skipped")
    frames = [e for e in events(reply.body) if KEY in e]
    assert len(frames) == 2
    with pytest.raises(ValueError):
        json.loads(frames[0][6:])  # not JSON at all
    assert isinstance(json.loads(frames[1][6:]), str)  # JSON, but a string, not an object
    assert reply.body.endswith(b"data: [DONE]\n\n")
    assert all(KEY not in json.dumps(p) for p in payloads(reply.body) if isinstance(p, dict))


async def test_escaped_key_is_only_in_the_decoded_message(http: httpx.AsyncClient) -> None:
    reply = await echo(http, "escaped")
    assert KEY.encode() not in reply.body
    assert b"\\u0073\\u006b\\u002d" in reply.body  # "sk-", one escape a character
    error = json.loads(events(reply.body)[-1][6:])["error"]
    assert KEY in error["message"]


async def test_all_in_one_stream(http: httpx.AsyncClient) -> None:
    reply = await echo(http, "all")
    assert reply.status == 200 and reply.headers["x-echo"] == KEY
    frames = events(reply.body)
    assert sum(KEY in f and not f.startswith('data: {"id"') for f in frames) == 3  # 2 skipped
    error = json.loads(frames[-1][6:])["error"]
    assert_keyed_error(error)
    assert error["message"].count(KEY) == 2  # plain and, decoded, escaped
    tools = [p for p in payloads(reply.body) if isinstance(p, dict) and "tool_calls" in str(p)]
    assert tools and tools[0]["choices"][0]["delta"]["tool_calls"][0]["id"] == KEY
    assert all(p["id"] == KEY for p in payloads(reply.body) if isinstance(p, dict) and "id" in p)


async def test_no_authorization_echoes_the_marker(upstream: RunningUpstream) -> None:
    async with httpx.AsyncClient(base_url=upstream.base_url, timeout=TIMEOUT) as client:
        reply = await echo(client, "stream-error")
    assert_keyed_error(json.loads(events(reply.body)[-1][6:])["error"], ECHO_MARKER)


async def test_echo_behind_a_key_check_echoes_the_right_key(nursery: trio.Nursery,
                                                           watchdog: None) -> None:
    running: RunningUpstream = await nursery.start(
        lambda task_status: serve_upstream(key=KEY, task_status=task_status))
    async with httpx.AsyncClient(base_url=running.base_url, timeout=TIMEOUT,
                                 headers=AUTH) as client:
        reply = await echo(client, "json-200")
    assert_keyed_error(json.loads(reply.body)["error"])


async def test_non_streamed_requests_and_unknown_places(http: httpx.AsyncClient) -> None:
    payload = {"messages": [{"role": "user", "content": "hi"}]}
    meta = await http.post("/chat/completions", json={"model": "fault/echo-key:meta", **payload})
    assert meta.status_code == 200
    assert_keyed_error(meta.json()["error"])  # answered as json-200
    headers = await http.post("/chat/completions", json={"model": "fault/echo-key:headers",
                                                         **payload})
    assert headers.json()["object"] == "chat.completion" and headers.headers["x-echo"] == KEY
    unknown = await http.post("/chat/completions", json={"model": "fault/echo-key:nowhere",
                                                         **payload})
    assert unknown.status_code == 400 and "stream-error" in unknown.json()["error"]["message"]
    assert KEY not in unknown.text


def test_every_place_is_documented_and_the_key_is_never_in_a_repr() -> None:
    from pathlib import Path

    upstream = (Path(__file__).parents[2] / "docs" / "mock.md").read_text()
    section = upstream[upstream.index("**Key echo**"):]
    for where in ECHO_PLACES:
        assert f"`{where}`" in section.split("**Observing")[0], where
    request = parse_chat_request(b'{"model": "m", "messages": [{"role": "user"}]}',
                                 {"authorization": f"Bearer {KEY}"})
    assert request.api_key == KEY and KEY not in repr(request)
    assert parse_chat_request(b'{"model": "m", "messages": [{"role": "user"}]}', {
        "authorization": "Basic abc"}).api_key == "Basic abc"


# ---------------------------------------------------------------- fault/empty-stop

async def test_empty_stop_finishes_with_nothing(http: httpx.AsyncClient) -> None:
    reply = await chat(http, "fault/empty-stop", stream_options={"include_usage": True})
    role, finish, usage = payloads(reply.body)
    assert role["choices"] == [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                "logprobs": None, "finish_reason": None}]
    assert finish["choices"] == [{"index": 0, "delta": {}, "logprobs": None,
                                  "finish_reason": "stop"}]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 0
    assert reply.body.endswith(b"data: [DONE]\n\n") and len(events(reply.body)) == 4
    plain = await chat(http, "fault/empty-stop")
    assert len(events(plain.body)) == 3  # no usage unless asked
