"""SSEDecoder against the WHATWG "event stream interpretation" rules, one rule a test.

Every case is also run over every split of its bytes: the rules must hold on
any read boundary.
"""

from __future__ import annotations

import pytest

from fanout import EventTooLarge, ServerSentEvent, SSEDecoder
from tests.helpers import decode, every_split

E = ServerSentEvent

CASES: list[tuple[str, bytes, list[ServerSentEvent]]] = [
    ("one data line", b"data: hello\n\n", [E("hello")]),
    ("LF, CRLF and CR line ends", b"data: a\r\n\r\ndata: b\r\rdata: c\n\n", [E("a"), E("b"), E("c")]),
    ("mixed ends inside one event", b"data: a\rdata: b\r\ndata: c\n\r\n", [E("a\nb\nc")]),
    ("CR then CRLF is two line ends", b"data: a\r\r\ndata: b\n\n", [E("a"), E("b")]),
    ("several data lines join with LF", b"data: a\ndata: b\ndata:\n\n", [E("a\nb\n")]),
    ("only one leading space is removed", b"data:  two spaces\n\n", [E(" two spaces")]),
    ("no space after the colon", b"data:tight\n\n", [E("tight")]),
    ("tab is not a space", b"data:\tx\n\n", [E("\tx")]),
    ("empty data line dispatches an empty event", b"data:\n\n", [E("")]),
    ("bare field name: empty value", b"data\n\n", [E("")]),
    ("field name ends at the first colon", b"data: a:b: c\n\n", [E("a:b: c")]),
    ("comment lines are ignored", b": ping\n:\ndata: x\n: more\n\n", [E("x")]),
    ("unknown fields are ignored", b"foo: bar\nDATA: no\ndata: x\n\n", [E("x")]),
    ("event type", b"event: delta\ndata: x\n\n", [E("x", "delta")]),
    ("event type resets after dispatch", b"event: a\ndata: 1\n\ndata: 2\n\n", [E("1", "a"), E("2")]),
    ("empty event type means message", b"event:\ndata: x\n\n", [E("x")]),
    ("event-only block dispatches nothing", b"event: ping\n\ndata: x\n\n", [E("x")]),
    ("event type does not leak past an empty block", b"event: ping\n\ndata: x\n\n", [E("x")]),
    ("id is remembered across events", b"id: 7\ndata: a\n\ndata: b\n\n", [E("a", id="7"), E("b", id="7")]),
    ("id-only block sets the id, no event", b"id: 9\n\ndata: a\n\n", [E("a", id="9")]),
    ("empty id resets it", b"id: 1\ndata: a\n\nid\ndata: b\n\n", [E("a", id="1"), E("b")]),
    ("id with NUL is ignored", b"id: 1\ndata: a\n\nid: 2\x003\ndata: b\n\n", [E("a", id="1"), E("b", id="1")]),
    ("retry on its event", b"retry: 1500\ndata: a\n\ndata: b\n\n", [E("a", retry=1500), E("b")]),
    ("retry-only block dispatches nothing", b"retry: 10\n\ndata: a\n\n", [E("a")]),
    ("retry must be all ASCII digits", b"retry: 1.5\ndata: a\n\nretry: \xd9\xa3\ndata: b\n\n", [E("a"), E("b")]),
    ("empty retry is ignored", b"retry:\ndata: a\n\n", [E("a")]),
    ("BOM at the very start is dropped", b"\xef\xbb\xbfdata: a\n\n", [E("a")]),
    ("a second BOM is kept", b"\xef\xbb\xbf\xef\xbb\xbfdata: a\n\n", []),
    ("BOM later is data", b"data: \xef\xbb\xbfa\n\n", [E("\ufeffa")]),
    ("multibyte text", "data: わかる👍\n\n".encode(), [E("わかる👍")]),
    ("invalid UTF-8 becomes U+FFFD", b"data: a\xffb\xc3\n\n", [E("a\ufffdb\ufffd")]),
    ("U+2028 and U+0085 are not line ends", "data: a\u2028b\x85c\x0bd\n\n".encode(), [E("a\u2028b\x85c\x0bd")]),
    ("unterminated event is not dispatched", b"data: a\n\ndata: b\n", [E("a")]),
    ("unterminated line is not dispatched", b"data: a\n\ndata: b", [E("a")]),
    ("blank lines between events", b"\n\n\ndata: a\n\n\n\n", [E("a")]),
]


@pytest.mark.parametrize(("body", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_spec_case_on_every_split(body: bytes, expected: list[ServerSentEvent]) -> None:
    for chunks in every_split(body):
        events, _ = decode(chunks)
        assert events == expected, chunks


def test_split_crlf_is_one_line_end() -> None:
    # CR ends one read, LF starts the next: one line end, so no blank line between.
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\r") == []
    assert decoder.feed(b"\ndata: b\r") == []
    assert decoder.feed(b"\n\r") == [E("a\nb")]
    assert decoder.feed(b"\n") == []  # the pair of the CR above, not another blank line
    assert decoder.feed(b"data: c\n\n") == [E("c")]


def test_cr_then_empty_read_then_lf() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\r") == []
    assert decoder.feed(b"") == []
    assert decoder.feed(b"data: \xe2") == []  # half a character at the end
    assert decoder.feed(b"\x82\xac\n\n") == [E("a\n\u20ac")]


def test_bom_split_across_reads_is_dropped_once() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"\xef") == []
    assert decoder.feed(b"\xbb") == []
    assert decoder.feed(b"\xbfdata: x\n\n\xef\xbb\xbfdata: y\n\n") == [E("x")]
    # The second BOM started a line, so its field name is "\ufeffdata": ignored.


def test_comments_are_counted() -> None:
    events, decoder = decode([b": ping\n\n:\ndata: a\n: x\n\n"])
    assert events == [E("a")]
    assert decoder.comments == 3


def test_retry_sets_reconnection_time() -> None:
    _, decoder = decode([b"retry: 3000\n\nretry: x\n\n"])
    assert decoder.retry == 3000


@pytest.mark.parametrize(
    ("body", "unterminated"),
    [
        (b"data: a\n\n", False),
        (b"data: a\n\n: trailing comment\n", False),
        (b"data: a\n\n: partial comm", False),
        (b"data: a\n\ndata: b\n", True),
        (b"data: a\n\ndata: {\"x", True),
        (b"data: a\n\nevent: x\n", True),
        (b"", False),
    ],
)
def test_close_reports_an_unterminated_event(body: bytes, unterminated: bool) -> None:
    for chunks in every_split(body):
        _, decoder = decode(chunks)
        assert decoder.unterminated is unterminated


def test_incomplete_character_at_end_is_replaced_not_raised() -> None:
    decoder = SSEDecoder()
    decoder.feed(b"data: a\n\ndata: \xe2\x82")
    assert decoder.close() == []
    assert decoder.unterminated


def test_close_is_idempotent_and_feed_after_close_fails() -> None:
    decoder = SSEDecoder()
    decoder.feed(b"data: a")
    assert decoder.close() == []
    assert decoder.close() == []
    with pytest.raises(RuntimeError, match="after close"):
        decoder.feed(b"\n\n")


def test_event_too_large_keeps_earlier_events() -> None:
    decoder = SSEDecoder(max_event_size=100)
    body = b"data: small\n\n" + b"data: " + b"x" * 200 + b"\n\n"
    with pytest.raises(EventTooLarge) as info:
        decoder.feed(body)
    assert info.value.events == [E("small")]
    assert "max_event_size=100" in str(info.value)
    with pytest.raises(EventTooLarge) as again:
        decoder.feed(b"data: more\n\n")
    assert again.value.events == []


def test_event_too_large_without_a_line_end_is_bounded() -> None:
    # A hostile upstream sends one endless line: memory must stay bounded.
    decoder = SSEDecoder(max_event_size=1000)
    with pytest.raises(EventTooLarge):
        for _ in range(100):
            decoder.feed(b"data: " + b"y" * 100)
    assert decoder.bytes_fed <= 1200


def test_event_too_large_across_many_data_lines() -> None:
    decoder = SSEDecoder(max_event_size=1000)
    with pytest.raises(EventTooLarge):
        for _ in range(100):
            decoder.feed(b"data: " + b"z" * 50 + b"\n")


def test_events_under_the_limit_pass() -> None:
    events, _ = decode([b"data: " + b"x" * 90 + b"\n\n"] * 3, max_event_size=100)
    assert len(events) == 3


def test_max_event_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_event_size"):
        SSEDecoder(max_event_size=0)


def test_bytes_fed_counts_every_byte() -> None:
    body = "data: é\n\n".encode()
    _, decoder = decode([body[:7], body[7:]])
    assert decoder.bytes_fed == len(body)
