"""Real streams from real servers parse to what tests/captures/README.md says."""

from __future__ import annotations

import json
import random
import re
from typing import Any

import attrs
import pytest

from fanout import Flag, Outcome, StreamResult, parse_stream
from tests.captures import CAPTURES, Capture, load, names, reads
from tests.helpers import byte_at_a_time


@attrs.frozen
class Expected:
    outcome: Outcome
    finish_reasons: tuple[str | None, ...] = ()
    text: str = ""  # the first choice's text starts with this
    text_length: int | None = None
    usage_total: int | None = None
    tool: tuple[str, str] | None = None  # (name, arguments) of the first choice's only call
    error: str | None = None  # the error message contains this
    choices: int | None = None
    flags: tuple[Flag, ...] = ()  # as parsed with what the capture's request asked
    reason: str | None = None  # the reason starts with this


C, T, E = Outcome.COMPLETED, Outcome.TRUNCATED, Outcome.ERROR
EMPTY, UNFINISHED, NO_USAGE, FEWER = (Flag.EMPTY_ANSWER, Flag.UNFINISHED_CHOICE,
                                      Flag.MISSING_USAGE, Flag.MISSING_CHOICES)
DONE_NO_FINISH = "[DONE] arrived but no choice had a finish reason"
WEATHER = ("get_weather", '{ "city": "Paris", "unit": "celsius"}')

EXPECTED = {
    "01_plain": Expected(C, ("stop",), "The capital of France is Paris.", 31),
    "02_long": Expected(C, ("length",), "The rainbow, a celestial wonder", 1577),
    "03_max_tokens_length": Expected(C, ("length",), "The waves of the sea", 20),
    "04_include_usage": Expected(C, ("stop",), "The primary colors are:\n- Red (R)", 57,
                                 flags=(NO_USAGE,)),
    "05_n2": Expected(C, ("stop",), "Hello.", 6, flags=(FEWER,)),
    "06_tools_forced": Expected(C, ("tool_calls",), "", 0, tool=WEATHER),
    "07_tools_auto": Expected(C, ("stop",), "", 0, flags=(EMPTY,)),
    "07b_tools_auto_model_picks_tool": Expected(T, (), "", 0, choices=0,
                                                reason="the body ended before any event"),
    "08_bad_request_messages_missing": Expected(C, ("stop",), "Sure, I can provide", 203),
    "09_unknown_model": Expected(C, ("length",), "Hello! How can I help you today", 31),
    "10_context_overflow_stream": Expected(T, (), "", 0, choices=0,
                                           reason="the body ended before any event"),
    "11_context_overflow_nonstream": Expected(E, error="maximum context length is 2048",
                                              reason="HTTP 400: "),
    "12_malformed_json": Expected(E, error="Internal Server Error"),
    "13_bad_type": Expected(E, error="validation error"),
    "14_not_found": Expected(E, error="Not Found"),
    "15_interrupted_first": Expected(T, (None,), "Once upon a time, in the land of Eridori", 170,
                                     reason=DONE_NO_FINISH),
    "15_interrupting_second": Expected(C, ("length",), "I'm ready to assist", 19),
    "16_long_stream_with_ping": Expected(C, ("length",), "Once upon a time", 6220),
    "17_unicode": Expected(C, ("stop",), "わかるバード！👍\n☀️💡", 12),  # noqa: RUF001
    "L01_mock_plain": Expected(C, ("stop",), "Hello! This is a canned reply", 131),
    "L02_mock_include_usage": Expected(C, ("stop",), "Hello! This is a canned reply", 131,
                                       usage_total=38),
    "L03_mock_n2": Expected(C, ("stop", None), "Hello! This is a canned reply", 131,
                            flags=(UNFINISHED,)),
    "L04_smollm2_include_usage": Expected(C, ("stop",), "The primary colors are:", 57,
                                          usage_total=32),
    "L05_smollm2_length": Expected(C, ("length",), "The waves of the sea", 20),
    "L06_smollm2_n2": Expected(C, ("stop",), "Hello, it's me, a helpful AI", flags=(FEWER,)),
    "L07_smollm2_tools_forced": Expected(C, ("tool_calls",), "", 0, tool=WEATHER),
    "L08_unknown_model": Expected(E, error="Invalid model name passed in model=no-such-model"),
    "L09_no_auth": Expected(E, error="Internal Server Error"),
    "L10_context_overflow_stream": Expected(C, ("stop",), "", 0, flags=(EMPTY,)),
    "L11_bad_type": Expected(E, error="litellm.InternalServerError"),
}

STREAMS = [n for n in EXPECTED if load(n).status == 200 and EXPECTED[n].outcome is not E]


def asked(name: str) -> dict[str, Any]:
    """The JSON body of the capture's recorded request."""
    request = (CAPTURES / f"{name}.request").read_bytes()
    body = request.partition(b"\r\n\r\n")[2] or request.partition(b"\n\n")[2]
    try:
        return dict(json.loads(body))
    except ValueError:  # 12_malformed_json sent a broken body on purpose
        return {}


def parse(capture: Capture, chunks: list[bytes] | None = None) -> StreamResult:
    return parse_stream(chunks if chunks is not None else [capture.body], status=capture.status)


def parse_as_asked(name: str) -> StreamResult:
    """Parsed with the expectations its request set: ``n`` and ``include_usage``."""
    capture, body = load(name), asked(name)
    return parse_stream([capture.body], status=capture.status, expect_choices=body.get("n", 1),
                        expect_usage=bool((body.get("stream_options") or {}).get("include_usage")))


def test_every_capture_has_an_expectation() -> None:
    streams = [n for n in names() if not n.startswith("00_")]
    assert sorted(EXPECTED) == streams


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_capture_parses_as_documented(name: str) -> None:
    capture, expected = load(name), EXPECTED[name]
    result = parse_as_asked(name)
    assert result.outcome is expected.outcome
    assert result.flags == expected.flags
    if expected.outcome is C:
        assert result.reason is None
    else:
        assert result.reason is not None and "\n" not in result.reason
        assert result.reason.startswith(expected.reason or "")
    assert result.status == capture.status
    assert tuple(c.finish_reason for c in result.choices) == expected.finish_reasons
    assert result.text.startswith(expected.text)
    if expected.text_length is not None:
        assert len(result.text) == expected.text_length
    if expected.choices is not None:
        assert len(result.choices) == expected.choices
    assert (result.usage.total_tokens if result.usage else None) == expected.usage_total
    calls = [(t.name, t.arguments) for c in result.choices for t in c.tool_calls]
    assert calls == ([expected.tool] if expected.tool else [])
    if expected.error is None:
        assert result.error is None
    else:
        assert result.error is not None and expected.error in result.error.message
        assert result.error.status == capture.status
    assert result.skipped_frames == 0


def test_repeated_tool_call_ids_are_not_concatenated() -> None:
    [call] = parse(load("06_tools_forced")).choices[0].tool_calls
    assert call.id == "call__0_get_weather_cmpl-fd2fc4c1-2ad7-4fd6-a85c-cdf415698e54"
    assert (call.type, call.parsed) == ("function", {"city": "Paris", "unit": "celsius"})


def test_n2_choices_each_keep_their_text() -> None:
    result = parse(load("L03_mock_n2"))
    assert [c.role for c in result.choices] == ["assistant", "assistant"]
    assert result.choices[0].text == result.choices[1].text


def test_keep_alive_comment_is_counted() -> None:
    assert parse(load("16_long_stream_with_ping")).comments == 1


def test_usage_details_are_kept_raw() -> None:
    usage = parse(load("L02_mock_include_usage")).usage
    assert usage is not None
    assert usage.raw["completion_tokens_details"] == {"reasoning_tokens": 0, "text_tokens": 30}


def test_error_details_of_an_openai_style_error() -> None:
    error = parse(load("11_context_overflow_nonstream")).error
    assert error is not None
    assert (error.type, error.code, error.status) == (
        "invalid_request_error", "context_length_exceeded", 400)


@pytest.mark.parametrize("name", STREAMS)
def test_recorded_reads_and_byte_at_a_time_give_the_same_result(name: str) -> None:
    capture = load(name)
    whole = parse(capture)
    assert parse(capture, reads(capture)) == whole
    if len(capture.body) < 20_000:
        assert parse(capture, byte_at_a_time(capture.body)) == whole


def _done_dispatched_at(body: bytes) -> int:
    """The offset where the [DONE] event is complete (its blank line read)."""
    match = re.search(rb"data: ?\[DONE\]\r?\n\r?\n", body)
    return match.end() if match else len(body) + 1


@pytest.mark.parametrize("name", STREAMS)
def test_cut_anywhere_before_done_is_truncated_with_a_prefix(name: str) -> None:
    capture = load(name)
    full = parse(capture)
    done_at = _done_dispatched_at(capture.body)
    boundaries = [m.end() for m in re.finditer(rb"\n\n", capture.body)]
    rng = random.Random(name)
    offsets = boundaries + [rng.randrange(len(capture.body) + 1) for _ in range(40)]
    for cut in offsets:
        result = parse(capture, [capture.body[:cut]])
        if cut >= done_at:
            assert result.outcome is full.outcome
            continue
        assert result.outcome is Outcome.TRUNCATED, cut
        for choice in result.choices:
            assert full.choice(choice.index) is not None
            assert full.choice(choice.index).text.startswith(choice.text)  # type: ignore[union-attr]
        at_boundary = cut in boundaries or cut == 0
        assert result.pending_event is (not at_boundary and capture.body[:cut].strip() != b"")


def test_non_streaming_captures_are_not_mistaken_for_complete_streams() -> None:
    for name in ("00_models", "00_nonstream_plain"):
        result = parse(load(name))
        assert result.outcome is Outcome.TRUNCATED
        assert result.pending_event
