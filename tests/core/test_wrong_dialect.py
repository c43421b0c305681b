"""A model configured with the wrong ``api`` gets a reason that says so, in every direction;
a stream of the right dialect is untouched by the check."""

from __future__ import annotations

import json

import pytest

from fanout import Outcome, parse_stream

CHAT = [b'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"hi"},'
        b'"finish_reason":"stop"}]}\n\n', b"data: [DONE]\n\n"]


def _event(kind: str, **fields: object) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n".encode()


ANTHROPIC = [
    _event("message_start", message={"id": "m", "model": "c", "role": "assistant",
                                     "usage": {"input_tokens": 1, "output_tokens": 1}}),
    _event("content_block_start", index=0, content_block={"type": "text", "text": ""}),
    _event("content_block_delta", index=0, delta={"type": "text_delta", "text": "hi"}),
    _event("content_block_stop", index=0),
    _event("message_delta", delta={"stop_reason": "end_turn"}, usage={"output_tokens": 2}),
    _event("message_stop"),
]
RESPONSES = [
    _event("response.created", response={"id": "r", "model": "m", "status": "in_progress"}),
    _event("response.output_text.delta", item_id="i", output_index=0, content_index=0,
           delta="hi"),
    _event("response.completed", response={"id": "r", "status": "completed",
                                           "usage": {"input_tokens": 1, "output_tokens": 1}}),
]
STREAMS = {"chat": CHAT, "anthropic": ANTHROPIC, "responses": RESPONSES}
NAMES = {"chat": "a Chat Completions chunk", "anthropic": "an Anthropic Messages event",
         "responses": "a Responses API event"}


@pytest.mark.parametrize("sent", list(STREAMS))
@pytest.mark.parametrize("api", list(STREAMS))
def test_a_stream_of_another_dialect_is_truncated_with_a_hint(sent: str, api: str) -> None:
    result = parse_stream(STREAMS[sent], api=api)
    if sent == api:
        assert (result.outcome, result.text, result.skipped_frames) == (
            Outcome.COMPLETED, "hi", 0)
        return
    assert result.outcome is Outcome.TRUNCATED and result.text == ""
    assert result.reason is not None
    assert NAMES[sent] in result.reason and f'api "{sent}"?' in result.reason


def test_a_chat_stream_with_an_odd_typed_chunk_is_not_flagged() -> None:
    # A relay's own chunk with a `type` no other dialect uses stays ignored, as before.
    odd = b'data: {"type": "ping"}\n\n'
    result = parse_stream([odd, *CHAT])
    assert (result.outcome, result.skipped_frames, result.flags) == (Outcome.COMPLETED, 0, ())


def test_unreadable_frames_say_why_when_nothing_else_came() -> None:
    result = parse_stream([b"data: not json\n\n"])
    assert result.reason == ("the body ended after 1 event without [DONE] (1 frame skipped: "
                             "invalid JSON: Expecting value: line 1 column 1 (char 0))")
    # Once content came, the reason is about the cut, as before.
    cut = parse_stream([b"data: not json\n\n", CHAT[0].replace(b'"stop"', b"null")])
    assert cut.reason == "the body ended after 2 events without [DONE]"
