"""A tool call an upstream splits over several blocks (items) reaches the service's clients
as ONE call: on the ``/v1/chat/completions`` pass-through (streamed and whole) and on
``/v1/fanout`` (its records and its results), never the blocks as duplicates."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio

from fanout.upstream import RunningUpstream

from .helpers import Served, ask, make_config, post_sse, serving

SPLIT = """
[[models]]
name = "split-anthropic"
id = "fault/split-tool-call"
api = "anthropic"

[[models]]
name = "split-responses"
id = "fault/split-tool-call"
api = "responses"
"""
MODELS = ["split-anthropic", "split-responses"]


@pytest.fixture
async def split(upstream: RunningUpstream) -> AsyncIterator[Served]:
    async with serving(upstream, make_config(extra=SPLIT)) as running:
        yield running


def chat(model: str, **fields: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], **fields}


def two_calls(calls: list[dict[str, Any]]) -> None:
    """Two calls (mock/tools's get_weather and get_time), each whole: valid JSON arguments."""
    assert [c["name"] for c in calls] == ["get_weather", "get_time"]
    assert len({c["id"] for c in calls}) == 2
    for call in calls:
        assert isinstance(json.loads(call["arguments"]), dict)


@pytest.mark.parametrize("model", MODELS)
async def test_the_chat_pass_through_relays_one_call_per_split_call(split: Served,
                                                                    model: str) -> None:
    async with split.client() as client:
        got = await post_sse(client, "/v1/chat/completions", chat(model, stream=True))
        with trio.fail_after(20):
            whole = (await client.post("/v1/chat/completions", json=chat(model))).json()
    assert got.events[-1] == ("message", "[DONE]")
    calls: dict[int, dict[str, str]] = {}
    for _, data in got.events[:-1]:
        chunk = json.loads(data)
        for part in chunk["choices"][0]["delta"].get("tool_calls", []) if chunk[
                "choices"] else []:
            call = calls.setdefault(part["index"], {"id": "", "name": "", "arguments": ""})
            call["id"] += part.get("id") or ""  # an id or name said twice would show here
            call["name"] += part["function"].get("name") or ""
            call["arguments"] += part["function"].get("arguments") or ""
    assert sorted(calls) == [0, 1]
    two_calls([calls[0], calls[1]])
    message = whole["choices"][0]["message"]
    two_calls([{"id": c["id"], **c["function"]} for c in message["tool_calls"]])
    assert whole["choices"][0]["finish_reason"] == "tool_calls"


async def test_fanout_records_and_results_carry_one_call_per_split_call(split: Served) -> None:
    async with split.client() as client:
        got = await post_sse(client, "/v1/fanout", ask(*MODELS))
        with trio.fail_after(20):
            document = (await client.post("/v1/fanout", json={**ask(*MODELS),
                                                              "stream": False})).json()
    for model in MODELS:
        records = [r for r in got.of(model) if r["type"] == "tool_call"]
        assert {r["tool_index"] for r in records} == {0, 1}  # what the page draws
        assert len([r for r in records if r["id"]]) == 2  # each call announced once
        result = got.results()[model]
        assert result["outcome"] == "completed"
        calls = result["choices"][0]["tool_calls"]
        two_calls(calls)
        assert all(c["parse_error"] is None for c in calls)
        for call in calls:
            assert call["arguments"] == "".join(r["arguments"] for r in records
                                                if r["tool_index"] == call["index"])
    for result in document["results"]:
        two_calls(result["choices"][0]["tool_calls"])
