"""Hostile input to the Responses and Anthropic interpreters, and the SSE decoder's
shortcut for their `event:` + `data:` blocks."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fanout import Outcome, ServerSentEvent, SSEDecoder, parse_stream
from fanout.core.sse import _events
from tests.helpers import split_at
from tests.strategies import dialect_streams

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

TYPES = {
    "responses": ["response.created", "response.in_progress", "response.output_item.added",
                  "response.output_item.done", "response.output_text.delta",
                  "response.refusal.delta", "response.reasoning_text.delta",
                  "response.reasoning_summary_text.delta",
                  "response.function_call_arguments.delta",
                  "response.function_call_arguments.done", "response.completed",
                  "response.incomplete", "response.failed", "error", "response.future"],
    "anthropic": ["message_start", "content_block_start", "content_block_delta",
                  "content_block_stop", "message_delta", "message_stop", "ping", "error",
                  "message_future"],
}
FIELDS = ["item", "item_id", "output_index", "content_index", "delta", "arguments",
          "response", "index", "content_block", "message", "usage", "error", "type", "id",
          "name", "call_id", "input", "partial_json", "text", "thinking", "signature",
          "stop_reason", "status", "incomplete_details", "reason", "output", "role", "model"]
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                    st.floats(allow_nan=False), st.text(max_size=6),
                    st.sampled_from(["fc_0", "msg_0", "function_call", "message", "tool_use",
                                     "text", "thinking", "text_delta", "input_json_delta",
                                     "thinking_delta", "signature_delta", "redacted_thinking"]))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3),
    st.dictionaries(st.sampled_from(FIELDS), inner, max_size=5)), max_leaves=12)


@st.composite
def hostile_bodies(draw: st.DrawFn, api: str) -> bytes:
    frames = []
    for _ in range(draw(st.integers(0, 12))):
        frame = draw(st.dictionaries(st.sampled_from(FIELDS), values, max_size=6))
        frame["type"] = draw(st.sampled_from(TYPES[api]))
        name = draw(st.sampled_from(["", frame["type"], "error", "ping"]))
        head = f"event: {name}\n" if name else ""
        frames.append(head + "data: " + json.dumps(frame) + "\n\n")
    return "".join(frames).encode()


@SETTINGS
@pytest.mark.parametrize("api", ["responses", "anthropic"])
@given(data=st.data())
def test_any_shape_of_event_is_read_without_raising(api: str, data: st.DataObject) -> None:
    body = data.draw(hostile_bodies(api))
    result = parse_stream([body], api=api)
    assert result.outcome in (Outcome.COMPLETED, Outcome.TRUNCATED, Outcome.ERROR)
    assert (result.reason is None) is (result.outcome is Outcome.COMPLETED)
    assert len(result.choices) <= 1
    offsets = data.draw(st.lists(st.integers(0, len(body)), max_size=8))
    assert parse_stream(split_at(body, offsets), api=api) == result


def decode_items(chunks: list[bytes], pairs: bool) -> list[ServerSentEvent]:
    decoder = SSEDecoder()
    decoder._pairs = pairs
    items: list[Any] = []
    for chunk in chunks:
        items.extend(decoder._feed_items(chunk))
    return _events(items) + decoder.close()


@SETTINGS
@pytest.mark.parametrize("api", ["responses", "anthropic"])
@given(data=st.data())
def test_the_pair_shortcut_gives_the_events_the_standard_gives(api: str,
                                                              data: st.DataObject) -> None:
    body = data.draw(dialect_streams(api)).body
    offsets = data.draw(st.lists(st.integers(0, len(body)), max_size=10))
    decoder = SSEDecoder()
    standard = [e for chunk in split_at(body, offsets) for e in decoder.feed(chunk)]
    standard += decoder.close()
    assert decode_items(split_at(body, offsets), pairs=True) == standard
    assert decode_items([body], pairs=False) == standard


@pytest.mark.parametrize(("block", "expected"), [
    ("event: a\ndata: x", [ServerSentEvent("x", "a")]),
    ("event:  a\ndata: x", [ServerSentEvent("x", " a")]),  # one leading space is dropped
    ("event: \ndata: x", [ServerSentEvent("x", "message")]),  # an empty type is message
    ("event: a:b\ndata: x", [ServerSentEvent("x", "a:b")]),
    ("event: a\ndata: ", [ServerSentEvent("", "a")]),
    ("event: a\ndata: x\ndata: y", [ServerSentEvent("x\ny", "a")]),
    ("event: a\ndata:x", [ServerSentEvent("x", "a")]),
    ("event: a\nid: 7\ndata: x", [ServerSentEvent("x", "a", "7")]),
    ("event: a\ndata: x\nevent: b", [ServerSentEvent("x", "b")]),
    ("event: a", []),
    ("event: a\n: comment", []),
])
def test_named_blocks_follow_the_standard(block: str, expected: list[ServerSentEvent]) -> None:
    raw = (block + "\n\n").encode()
    for pairs in (True, False):
        assert decode_items([raw], pairs) == expected
    decoder = SSEDecoder()
    assert decoder.feed(raw) == expected


def test_an_id_in_force_is_kept_on_named_events() -> None:
    raw = b"id: 3\ndata: a\n\nevent: b\ndata: c\n\n"
    assert decode_items([raw], pairs=True) == [ServerSentEvent("a", "message", "3"),
                                               ServerSentEvent("c", "b", "3")]


@pytest.mark.parametrize("api", ["responses", "anthropic"])
def test_an_event_too_large_stops_the_stream_with_the_output_before_it(api: str) -> None:
    first = {"responses": {"type": "response.output_text.delta", "item_id": "m", "delta": "ok"},
             "anthropic": {"type": "message_start", "message": {"id": "m", "role": "assistant"}}}
    body = (f"event: {first[api]['type']}\ndata: {json.dumps(first[api])}\n\n"
            f"event: x\ndata: {'y' * 500}\n\n").encode()
    for chunks in ([body], [body[:150], body[150:]]):
        result = parse_stream(chunks, api=api, max_event_size=400)
        assert result.outcome is Outcome.ERROR
        assert result.error is not None and result.error.code == "event_too_large"
        assert result.events == 1
        assert result.text == ("ok" if api == "responses" else "")
