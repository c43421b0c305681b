"""The byte path (SSEDecoder reading whole events without decoding, the interpreters
reading undecoded payloads, parse_stream folding content unbuilt) gives exactly what
the text path gives: on generated bodies mixing every kind of block, on every real
capture, on generated chat and dialect streams, under any split of the reads."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fanout import EventTooLarge, StreamParser, StreamResult, parse_stream
from fanout.core import sse
from fanout.core.sse import ServerSentEvent, SSEDecoder
from tests.captures import load, names, reads
from tests.helpers import split_at
from tests.strategies import chat_streams, dialect_streams

SETTINGS = settings(max_examples=200, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])

_SLOW = SSEDecoder._slow


def _text_only(self: SSEDecoder, data: bytes, items: list[Any]) -> None:
    _SLOW(self, data, items)
    self._clean = False  # never between events: every read takes the text path


class TextPath:
    """``with TextPath():`` every SSEDecoder takes the text path only."""

    def __enter__(self) -> None:
        SSEDecoder._slow = _text_only  # type: ignore[method-assign]

    def __exit__(self, *exc: object) -> None:
        SSEDecoder._slow = _SLOW  # type: ignore[method-assign]


def decode(chunks: list[bytes], *, pairs: bool = False, limit: int = sse.DEFAULT_MAX_EVENT_SIZE
           ) -> tuple[list[ServerSentEvent], tuple[Any, ...]]:
    """The events (through ``_feed_items``, shortcuts expanded), the decoder's counters,
    and the size error if one was raised (with the events it carried)."""
    decoder = SSEDecoder(max_event_size=limit)
    decoder._pairs = pairs
    events: list[ServerSentEvent] = []
    error: tuple[Any, ...] = ()
    try:
        for chunk in chunks:
            events += sse._events(decoder._feed_items(chunk))
    except EventTooLarge as exc:
        error = (exc.size, exc.limit, exc.events)
    events += decoder.close()
    return events, (decoder.comments, decoder.last_event_id, decoder.retry,
                    decoder.unterminated, decoder.bytes_fed, error)


def both_paths(chunks: list[bytes], **kwargs: Any) -> None:
    fast = decode(chunks, **kwargs)
    with TextPath():
        slow = decode(chunks, **kwargs)
    assert fast == slow


def result_paths(chunks: list[bytes], **kwargs: Any) -> StreamResult:
    """parse_stream (byte path, content folded unbuilt) == StreamParser.feed (byte path,
    events built) == the text path; returns the result."""
    folded = parse_stream(chunks, **kwargs)
    parser = StreamParser(**kwargs)
    parser.status = 200
    for chunk in chunks:
        parser.feed(chunk)
    parser.close()
    assert parser.result() == folded
    with TextPath():
        assert parse_stream(chunks, **kwargs) == folded
    return folded


# Blocks of every kind, so a body switches between the byte path and the text path.
_payload = st.builds(lambda text, index: json.dumps(
    {"id": "c", "model": "m", "choices": [{"index": index, "delta": {"content": text},
                                           "finish_reason": None}]}, ensure_ascii=False),
    st.text(max_size=12), st.integers(0, 1))
_line = st.one_of(
    _payload.map(lambda p: "data: " + p),
    _payload.map(lambda p: "data:" + p),  # no space
    st.just("data: [DONE]"),
    st.just("data: "),
    st.just("data"),
    st.just(": keep-alive"),
    st.just(":"),
    st.sampled_from(["event: message", "event: error", "event: response.output_text.delta",
                     "event: ", "event:x"]),
    st.sampled_from(["id: 7", "id: ", "id: a\0b", "retry: 100", "retry: x", "other: 1"]),
    st.text(max_size=8).filter(lambda t: "\n" not in t and "\r" not in t),
)
_block = st.lists(_line, min_size=0, max_size=4)


@st.composite
def mixed_bodies(draw: st.DrawFn) -> bytes:
    blocks = draw(st.lists(_block, max_size=10))
    out = []
    for lines in blocks:
        end = draw(st.sampled_from(["\n", "\n", "\r\n", "\r"]))
        out.append(end.join(lines) + end + end)
    body = "".join(out)
    if draw(st.booleans()):
        body = "\ufeff" + body
    if draw(st.booleans()):  # an unterminated event at the end
        body += draw(st.sampled_from(["data: {", "data: x\n", "event: a\ndata: b", ": c"]))
    raw = body.encode()
    if draw(st.booleans()) and raw:  # invalid UTF-8 somewhere
        at = draw(st.integers(0, len(raw)))
        raw = raw[:at] + draw(st.sampled_from([b"\xff", b"\xe6\x9d", b"\xc3", b"\xed\xa0\x80"])) \
            + raw[at:]
    return raw


@SETTINGS
@given(body=mixed_bodies(), data=st.data())
def test_every_block_kind_decodes_the_same_on_both_paths(body: bytes, data: st.DataObject
                                                         ) -> None:
    offsets = data.draw(st.lists(st.integers(0, len(body)), max_size=8))
    chunks = split_at(body, offsets)
    for pairs in (False, True):
        both_paths(chunks, pairs=pairs)
        both_paths([body], pairs=pairs)
        # small limits: the size error comes at the same read, with the same events
        both_paths(chunks, pairs=pairs, limit=data.draw(st.integers(1, 120)))


def one_event_per_read(body: bytes) -> list[bytes]:
    """Cut after each blank line (LF or CRLF), as servers write one event per send."""
    pieces, start = [], 0
    for at in range(len(body)):
        if body[at : at + 2] == b"\n\n" or body[at : at + 4] == b"\r\n\r\n":
            end = at + (2 if body[at] == 10 else 4)
            pieces.append(body[start:end])
            start = end
    pieces.append(body[start:])
    return [piece for piece in pieces if piece]


@SETTINGS
@given(body=mixed_bodies())
def test_one_event_per_read_decodes_the_same_on_both_paths(body: bytes) -> None:
    for pairs in (False, True):
        both_paths(one_event_per_read(body), pairs=pairs)


@SETTINGS
@given(stream=chat_streams(), data=st.data())
def test_chat_streams_give_the_same_result_on_every_path(stream: Any, data: st.DataObject
                                                         ) -> None:
    body = stream.body
    offsets = data.draw(st.lists(st.integers(0, len(body)), max_size=8))
    for chunks in (split_at(body, offsets), one_event_per_read(body), [body]):
        result_paths(chunks)
        result_paths(chunks, secrets=["sk-secret-key"])


@SETTINGS
@pytest.mark.parametrize("api", ["responses", "anthropic"])
@given(data=st.data())
def test_dialect_streams_give_the_same_result_on_every_path(api: str, data: st.DataObject
                                                            ) -> None:
    body = data.draw(dialect_streams(api)).body
    offsets = data.draw(st.lists(st.integers(0, len(body)), max_size=8))
    for chunks in (split_at(body, offsets), one_event_per_read(body)):
        result_paths(chunks, api=api)
        result_paths(chunks, api=api, secrets=["sk-secret-key"])


@pytest.mark.parametrize("name", names())
def test_every_capture_gives_the_same_result_on_every_path(name: str) -> None:
    capture = load(name)
    if not 200 <= capture.status < 300:
        return
    for chunks in (reads(capture), one_event_per_read(capture.body), [capture.body]):
        result_paths(chunks)
        both_paths(chunks)


KEY = "sk-proj-ABCdef0123456789"


@pytest.mark.parametrize("where", [
    {"id": KEY}, {"model": KEY}, {"system_fingerprint": KEY},
    {"choices": [{"index": 0, "delta": {"content": "a " + KEY}, "finish_reason": None}]},
    {"choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": 0, "function": {"arguments": KEY}}]}, "finish_reason": None}]},
    {"choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": KEY}]},
    {"usage": {"prompt_tokens": 1, KEY: 2}},
    {"error": {"message": "bad key " + KEY}},
])
@pytest.mark.parametrize("escaped", [False, True])
def test_a_key_in_any_field_is_redacted_on_the_byte_path(where: dict[str, Any],
                                                         escaped: bool) -> None:
    opener = {"id": "c", "model": "m", "choices": [{"index": 0, "delta": {
        "role": "assistant", "content": "", "tool_calls": [{
            "index": 0, "id": "call_1", "type": "function",
            "function": {"name": "f", "arguments": ""}}]}, "finish_reason": None}]}
    chunk = {"id": "c", "model": "m", "choices": [{"index": 0, "delta": {"content": "x"},
                                                   "finish_reason": None}], **where}
    text = json.dumps(chunk)
    if escaped:  # the key spelt with JSON escapes: no byte of it in the payload as sent
        text = text.replace("sk-", "\\u0073\\u006b-")
    frames = [b"data: " + json.dumps(opener).encode() + b"\n\n",
              b"data: " + text.encode() + b"\n\n",
              b"data: [DONE]\n\n"]
    for chunks in (frames, [b"".join(frames)]):
        result = parse_stream(chunks, secrets=[KEY])
        assert KEY not in repr(result)
        if "usage" not in where:  # (usage keeps the counts it knows, not the key)
            assert "***" in repr(result)
        parser = StreamParser(secrets=[KEY])
        events = [event for chunk in chunks for event in parser.feed(chunk)]
        assert KEY not in repr(events)


# -- long lines: the byte path crosses them by their line ends, and holds an unfinished
# event as the reads it came in.  Checked against the standard itself (`standard` below),
# which holds on the compiled core too, where TextPath cannot reroute compiled calls.

def standard(body: bytes) -> tuple[list[ServerSentEvent], int, bool]:
    """The WHATWG interpretation of a whole body, line by line: the events, the comment
    lines, and whether it ended inside an event."""
    text = body.decode("utf-8", "replace").removeprefix("\ufeff")
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    partial = lines.pop()
    events, comments = [], 0
    data: list[str] = []
    kind, last_id, retry, fields = "", "", None, False
    for line in lines:
        if not line:
            if data:
                events.append(ServerSentEvent("\n".join(data), kind or "message", last_id,
                                              retry))
            data, kind, retry, fields = [], "", None, False
            continue
        if line[0] == ":":
            comments += 1
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        fields = True
        if name == "data":
            data.append(value)
        elif name == "event":
            kind = value
        elif name == "id" and "\0" not in value:
            last_id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            retry = int(value)
    return events, comments, bool(data or fields or (partial and partial[0] != ":"))


_long_payload = st.builds(lambda text, size: json.dumps({"text": text + "é" * size}),
                          st.text(max_size=8), st.integers(0, 1500))
_long_line = st.one_of(
    _long_payload.map(lambda p: "data: " + p),
    _long_payload.map(lambda p: "data:" + p),
    _long_payload.map(lambda p: ": " + p),
    st.sampled_from(["event: response.output_text.delta", "event: error", "id: 7",
                     "retry: 50", "data: [DONE]", ": ping"]),
)


@st.composite
def long_line_bodies(draw: st.DrawFn) -> bytes:
    blocks = draw(st.lists(st.lists(_long_line, min_size=0, max_size=3), max_size=6))
    end = draw(st.sampled_from(["\n", "\n", "\r\n"]))
    body = "".join(end.join(lines) + end + end for lines in blocks)
    if draw(st.booleans()):  # an unterminated event at the end
        body += draw(_long_line)
    return body.encode()


def as_the_standard_says(body: bytes, offsets: list[int]) -> None:
    events, comments, unterminated = standard(body)
    for chunks in (split_at(body, offsets), one_event_per_read(body), [body]):
        for pairs in (False, True):
            decoder = SSEDecoder()
            decoder._pairs = pairs
            got = [event for chunk in chunks for event in sse._events(
                decoder._feed_items(chunk))]
            got += decoder.close()
            assert (got, decoder.comments, decoder.unterminated) \
                == (events, comments, unterminated), chunks


@SETTINGS
@given(body=long_line_bodies(), data=st.data())
def test_long_lines_decode_as_the_standard_says(body: bytes, data: st.DataObject) -> None:
    as_the_standard_says(body, data.draw(st.lists(st.integers(0, len(body)), max_size=12)))


@SETTINGS
@given(body=mixed_bodies(), data=st.data())
def test_every_block_kind_decodes_as_the_standard_says(body: bytes, data: st.DataObject
                                                       ) -> None:
    as_the_standard_says(body, data.draw(st.lists(st.integers(0, len(body)), max_size=8)))


@pytest.mark.parametrize("lines", [1, 200])
def test_an_unfinished_event_is_held_as_its_reads_not_copied(lines: int) -> None:
    """The reads of an event that has not ended are kept as they came: the held bytes
    are not joined, copied or scanned again before the event's blank line."""
    decoder = SSEDecoder()
    decoder.feed(b"data: {}\n\n")  # the decoder is between events, on the byte path
    start = b"data: {}\n\ndata: " + b"x" * 600
    reads = [b"y" * 600 + b"\ndata: " for _ in range(lines - 1)] + [b"z" * 600]
    for read in [start, *reads]:
        decoder.feed(read)
    held = decoder._raw
    assert len(held) == 1 + len(reads)
    assert bytes(held[0]) == start[10:]
    for piece, read in zip(held[1:], reads, strict=True):
        assert piece is read
    events = decoder.feed(b"\n\n")
    whole = (start[16:] + b"".join(reads)).decode().replace("\ndata: ", "\n")
    assert [event.data for event in events] == [whole]
