"""``POST /v1/chat/completions``: one configured model, an honest pass-through."""

from __future__ import annotations

import json
from typing import Any

import trio

from .helpers import Served, post_sse


def chat(model: str, prompt: str = "hi", **fields: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": prompt}], **fields}


def chunks(events: list[tuple[str, str]]) -> list[dict[str, Any]]:
    return [json.loads(data) for name, data in events if name == "message" and data != "[DONE]"]


async def result_of(served: Served, model: str, **fields: Any) -> dict[str, Any]:
    """The same request through /v1/fanout: what the engine made of the upstream stream."""
    body = {"messages": [{"role": "user", "content": "hi"}], "models": [model], **fields}
    async with served.client() as client:
        with trio.fail_after(20):
            document = (await client.post("/v1/fanout", json=body)).json()
    result: dict[str, Any] = document["results"][0]
    return result


async def test_a_completed_stream_is_re_emitted_and_ends_with_done(served: Served) -> None:
    async with served.client() as client:
        got = await post_sse(client, "/v1/chat/completions", chat("short", stream=True))
    assert got.status == 200 and got.events[-1] == ("message", "[DONE]")
    assert got.raw.endswith(b"data: [DONE]\n\n")
    assert all(name == "message" for name, _ in got.events)  # no named events: OpenAI's shape
    parts = chunks(got.events)
    assert all(c["object"] == "chat.completion.chunk" for c in parts)
    assert len({c["id"] for c in parts}) == 1 and parts[0]["model"] == "mock/length"
    assert parts[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in parts if c["choices"])
    assert text == (await result_of(served, "short"))["text"]
    assert parts[-1]["choices"][0]["finish_reason"] == "length"
    assert not any("usage" in c for c in parts)  # not asked for


async def test_usage_comes_when_asked(served: Served) -> None:
    body = chat("short", stream=True, stream_options={"include_usage": True})
    async with served.client() as client:
        got = await post_sse(client, "/v1/chat/completions", body)
    last = chunks(got.events)[-1]
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 12


async def test_a_truncated_upstream_ends_without_done_and_with_an_error_event(
        served: Served) -> None:
    async with served.client() as client:
        got = await post_sse(client, "/v1/chat/completions", chat("flaky", stream=True))
    assert got.status == 200
    assert all(data != "[DONE]" for _, data in got.events)
    assert b"data: [DONE]" not in got.raw
    name, data = got.events[-1]
    assert name == "error"
    error = json.loads(data)["error"]
    assert error["code"] == "truncated" and error["message"].startswith("truncated: ")
    assert "without [DONE]" in error["message"]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks(got.events))
    assert text and text == (await result_of(served, "flaky"))["text"]  # the partial text


async def test_an_errored_or_timed_out_upstream_ends_with_its_reason(served: Served) -> None:
    async with served.client() as client:
        broken = await post_sse(client, "/v1/chat/completions", chat("broken", stream=True))
        stalled = await post_sse(client, "/v1/chat/completions", chat("stalled", stream=True))
    for got, code in ((broken, "error"), (stalled, "timed_out")):
        assert b"data: [DONE]" not in got.raw
        name, data = got.events[-1]
        assert name == "error" and json.loads(data)["error"]["code"] == code
    assert "no event within 1 s" in json.loads(stalled.events[-1][1])["error"]["message"]


async def test_tool_calls_are_re_emitted_with_their_indexes(served: Served) -> None:
    async with served.client() as client:
        got = await post_sse(client, "/v1/chat/completions", chat("tools", stream=True))
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks(got.events):
        for delta_call in chunk["choices"][0]["delta"].get("tool_calls", []) if chunk[
                "choices"] else []:
            call = calls.setdefault(delta_call["index"], {"name": "", "arguments": ""})
            call["name"] += delta_call["function"].get("name", "")
            call["arguments"] += delta_call["function"]["arguments"]
    result = await result_of(served, "tools")
    expected = {c["index"]: {"name": c["name"], "arguments": c["arguments"]}
                for c in result["choices"][0]["tool_calls"]}
    assert calls == expected and len(calls) == 2
    assert chunks(got.events)[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert got.events[-1][1] == "[DONE]"


async def test_stream_false_is_one_completion_or_an_error_status(served: Served) -> None:
    async with served.client() as client:
        with trio.fail_after(20):
            done = await client.post("/v1/chat/completions", json=chat("echo"))
            cut = await client.post("/v1/chat/completions", json=chat("flaky"))
            late = await client.post("/v1/chat/completions", json=chat("stalled"))
    assert done.status_code == 200
    completion = done.json()
    assert completion["object"] == "chat.completion"
    assert completion["choices"][0]["message"] == {"role": "assistant", "content": "hi",
                                                   "refusal": None}
    assert completion["choices"][0]["finish_reason"] == "stop"
    assert completion["usage"]["completion_tokens"] == 1
    assert cut.status_code == 502 and cut.json()["error"]["message"].startswith("truncated: ")
    assert late.status_code == 504 and "timed_out" in late.json()["error"]["message"]


async def test_the_model_must_be_one_of_the_config(served: Served) -> None:
    async with served.client() as client:
        with trio.fail_after(10):
            missing = await client.post("/v1/chat/completions", json={"messages": []})
            wrong = await client.post("/v1/chat/completions", json=chat("gtp-4o"))
            several = await client.post("/v1/chat/completions",
                                        json={**chat("fast"), "models": ["fast"]})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "model"
    assert wrong.json()["error"] == {
        "message": "model: no model named 'gtp-4o' (did you mean 'gpt-4o'?)",
        "type": "invalid_request_error", "param": "model", "code": "model_not_found"}
    assert several.status_code == 400 and several.json()["error"]["param"] == "models"
