"""Amplification, bodies that are not event streams, error kinds and cookies."""

from __future__ import annotations

import json
import re

import httpx
import trio

from fanout.upstream import RunningUpstream
from fanout.upstream.catalog import plan_chat
from fanout.upstream.models import BIG_COUNT, BIG_INDEX, Context
from fanout.upstream.plans import Send, parse_chat_request
from tests.upstream.wire import MESSAGES, TIMEOUT, chat, dechunk, events, payloads, raw_chat

DONE = b"data: [DONE]\n\n"


async def test_many_choices_opens_a_new_choice_every_chunk(client: httpx.AsyncClient) -> None:
    reply = await chat(client, "fault/many-choices:1000")
    chunks = payloads(reply.body)
    assert [c["choices"][0]["index"] for c in chunks] == list(range(1000))
    assert all(len(c["choices"]) == 1 and len(c["choices"][0]["delta"]["content"]) == 1
               for c in chunks)
    assert reply.body.endswith(DONE) and len(events(reply.body)) == 1001


def test_many_choices_default_is_100000() -> None:
    request = parse_chat_request(json.dumps({"model": "fault/many-choices", "stream": True,
                                             "messages": MESSAGES}).encode(), {})
    steps = plan_chat(request, Context()).steps
    assert steps is not None
    sends = [s for s in steps if isinstance(s, Send)]
    assert len(sends) == 100_001 and sends[-1].data == DONE
    assert b'"index":99999,' in sends[-2].data


async def test_many_tools_opens_a_new_tool_index_every_delta(client: httpx.AsyncClient) -> None:
    reply = await chat(client, "fault/many-tools:500")
    chunks = payloads(reply.body)
    calls = [t for c in chunks for ch in c["choices"] for t in ch["delta"].get("tool_calls", [])]
    assert [t["index"] for t in calls] == list(range(500))
    assert {ch["index"] for c in chunks for ch in c["choices"]} == {0}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls" and reply.body.endswith(DONE)


async def test_negative_indexes(client: httpx.AsyncClient) -> None:
    reply = await chat(client, "fault/negative-index")
    chunks = payloads(reply.body)
    indexes = [ch["index"] for c in chunks for ch in c["choices"]]
    tools = [t["index"] for c in chunks for ch in c["choices"]
             for t in ch["delta"].get("tool_calls", [])]
    assert indexes.count(-1) == 1 and tools == [-1]
    assert chunks[-1]["choices"][0]["finish_reason"] and reply.body.endswith(DONE)


async def test_big_ints_past_64_bits(client: httpx.AsyncClient) -> None:
    reply = await chat(client, "fault/big-int")
    assert b'"index":18446744073709551616,' in reply.body
    assert b'"total_tokens":2000000000000000000000000000000}' in reply.body
    chunks = payloads(reply.body)  # Python's json reads them; most parsers do not
    assert [ch["index"] for c in chunks for ch in c["choices"]].count(BIG_INDEX) == 1
    usage = [c["usage"] for c in chunks if "usage" in c]
    assert usage == [{"prompt_tokens": BIG_COUNT, "completion_tokens": BIG_COUNT,
                      "total_tokens": 2 * BIG_COUNT}]
    assert reply.body.endswith(DONE)


async def test_html_login_page(client: httpx.AsyncClient) -> None:
    reply = await chat(client, "fault/html")
    assert reply.status == 200 and reply.headers["content-type"].startswith("text/html")
    assert reply.body.startswith(b"<!DOCTYPE html>") and b"<form" in reply.body
    assert int(reply.headers["content-length"]) == len(reply.body)


async def test_json_body_answers_a_stream_with_a_completion(client: httpx.AsyncClient) -> None:
    reply = await chat(client, "fault/json-body", max_tokens=4)
    assert reply.status == 200 and reply.headers["content-type"] == "application/json"
    completion = json.loads(reply.body)
    assert completion["object"] == "chat.completion"
    assert completion["choices"][0]["finish_reason"] == "length"
    assert completion["choices"][0]["message"]["content"]


async def test_json_error_200(client: httpx.AsyncClient) -> None:
    reply = await chat(client, "fault/json-error-200")
    assert reply.status == 200 and reply.headers["content-type"] == "application/json"
    error = json.loads(reply.body)["error"]
    assert error["message"] and error["type"] == "upstream_error"


async def test_validation_500_every_time(client: httpx.AsyncClient) -> None:
    replies = [await chat(client, "fault/validation-500") for _ in range(2)]
    assert [r.status for r in replies] == [500, 500]
    error = json.loads(replies[0].body)["error"]
    assert "validation error" in error["message"] and "'loc': ('body', 'temperature')" in (
        error["message"])
    assert (error["type"], error["code"]) == ("internal_server_error", "500")


async def test_400_every_time(client: httpx.AsyncClient) -> None:
    replies = [await chat(client, "fault/400") for _ in range(2)]
    assert [r.status for r in replies] == [400, 400]
    error = json.loads(replies[0].body)["error"]
    assert (error["type"], error["param"], error["code"]) == (
        "invalid_request_error", "messages[0].content", "string_above_max_length")


async def test_503_then_ok(client: httpx.AsyncClient) -> None:
    replies = [await chat(client, "fault/503-then-ok:2") for _ in range(3)]
    assert [r.status for r in replies] == [503, 503, 200]
    assert json.loads(replies[0].body)["error"]["code"] == "overloaded"
    assert replies[2].body.endswith(DONE)


async def test_cut_before_content_then_normal(upstream: RunningUpstream) -> None:
    with trio.fail_after(5):
        raws = [await raw_chat(upstream, "fault/cut-before-content:2", until=b"\r\n0\r\n\r\n")
                for _ in range(3)]
    for raw in raws[:2]:
        body = dechunk(raw.chunked_body)
        assert raw.status == 200 and body.complete  # a clean end of the body...
        [role] = payloads(body.body)  # ...after the role chunk alone: no content, no [DONE]
        assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert body.body.count(b"data: ") == 1
    assert dechunk(raws[2].chunked_body).body.endswith(DONE)


async def test_done_only_then_normal(client: httpx.AsyncClient) -> None:
    first, second = [await chat(client, "fault/done-only") for _ in range(2)]
    assert (first.status, first.body) == (200, DONE)
    assert second.body.endswith(DONE) and len(payloads(second.body)) > 3


async def test_set_cookie_and_the_cookies_seen(upstream: RunningUpstream) -> None:
    async with httpx.AsyncClient(base_url=upstream.base_url, timeout=TIMEOUT) as http:
        first = await chat(http, "fault/set-cookie", max_tokens=2)
        session = first.headers["set-cookie"]
        assert re.fullmatch(r"fanout_session=[0-9a-f]{32}; Path=/", session)
        assert upstream.context.cookies_seen == []  # the first request carried none
        second = await chat(http, "mock/fast", max_tokens=2)  # httpx's jar sends it back
        assert second.body.endswith(DONE)
        assert upstream.context.cookies_seen == [session.split(";")[0]]
        third = await chat(http, "fault/set-cookie", max_tokens=2)
        assert third.headers["set-cookie"] != session  # a new session every time
    assert len(upstream.context.cookies_seen) == 2
    assert sum(upstream.stats.requests.values()) == 3
