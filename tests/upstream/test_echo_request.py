"""mock/echo-request (what a client sent, seen from the server) and ``models_fault``
(a ``GET /v1/models`` that fails as real endpoints' do)."""

from __future__ import annotations

import json
from functools import partial

import httpx
import pytest
import trio

from fanout.upstream import RunningUpstream, serve_upstream
from fanout.upstream.server import MODELS_FAULTS
from tests.upstream.wire import MESSAGES, TIMEOUT, payloads

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}}}}}]


def streamed_text(body: bytes) -> str:
    return "".join(c["delta"].get("content") or "" for p in payloads(body)
                   if isinstance(p, dict) for c in p.get("choices", []))


async def test_the_answer_is_the_body_received_streamed_or_not(
        client: httpx.AsyncClient) -> None:
    body = {"model": "mock/echo-request", "messages": MESSAGES, "tools": TOOLS,
            "tool_choice": {"type": "function", "function": {"name": "lookup"}},
            "max_tokens": 3, "temperature": 0.5}
    with trio.fail_after(10):
        whole = await client.post("/chat/completions", json=body)
        streamed = await client.post("/chat/completions", json={**body, "stream": True})
    message = whole.json()["choices"][0]
    # Neither the forced tool nor max_tokens changes the answer: it is the body, sorted.
    assert message["finish_reason"] == "stop"
    assert json.loads(message["message"]["content"]) == body
    text = streamed_text(streamed.content)
    assert json.loads(text) == {**body, "stream": True}
    assert text == json.dumps({**body, "stream": True}, sort_keys=True, separators=(",", ":"))


async def _models(fault: str | None) -> httpx.Response:
    async with trio.open_nursery() as nursery:
        upstream: RunningUpstream = await nursery.start(partial(
            serve_upstream, key="sk-list-fault-1", models_fault=fault))
        headers = {"authorization": "Bearer sk-list-fault-1"}
        async with httpx.AsyncClient(base_url=upstream.base_url, timeout=TIMEOUT,
                                     headers=headers) as http:
            with trio.move_on_after(0.5 if fault == "hang" else 10) as waited:
                listed = await http.get("/models")
            chat = await http.post("/chat/completions", json={
                "model": "mock/echo", "messages": MESSAGES})
        nursery.cancel_scope.cancel()
    assert chat.status_code == 200  # the model routes are unchanged
    if fault == "hang":
        assert waited.cancelled_caught
        return httpx.Response(0)
    return listed


async def test_models_fault_makes_the_list_fail_and_nothing_else() -> None:
    assert set(MODELS_FAULTS) == {"404", "401", "hang"}
    listed = await _models(None)
    assert listed.status_code == 200 and listed.json()["data"]
    missing = await _models("404")
    assert missing.status_code == 404 and missing.json()["error"]["message"] == (
        "No route for GET /v1/models.")
    refused = await _models("401")
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "invalid_api_key"
    await _models("hang")
    with pytest.raises(ValueError, match="models_fault: 'nope'"):
        await serve_upstream(models_fault="nope")
