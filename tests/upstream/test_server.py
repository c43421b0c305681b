"""Every model and fault of the embedded upstream, through httpx over loopback."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import attrs
import httpx
import pytest
import trio
from trio.testing import MockClock

from fanout import (
    ChoiceFinished,
    Outcome,
    ReasoningDelta,
    StreamParser,
    StreamResult,
    TextDelta,
    parse_stream,
)
from fanout.upstream import MODELS, RunningUpstream, open_upstream
from tests.captures import load, names
from tests.upstream.virtual import VirtualClient, virtual_upstream
from tests.upstream.wire import dechunk, payloads

MESSAGES = [{"role": "user", "content": "Tell me something about rivers."}]
WEATHER_TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"place": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["place", "days"], "additionalProperties": False}}}


@attrs.frozen
class Reply:
    status: int
    headers: httpx.Headers
    reads: list[bytes]
    error: Exception | None  # a transport error that ended the body early

    @property
    def body(self) -> bytes:
        return b"".join(self.reads)

    def result(self, **options: Any) -> StreamResult:
        return parse_stream(self.reads, status=self.status, **options)


async def chat(client: httpx.AsyncClient, model: str, *, headers: dict[str, str] | None = None,
               until: Callable[[bytes], bool] | None = None, **body: Any) -> Reply:
    payload = {"model": model, "messages": MESSAGES, "stream": True, **body}
    reads: list[bytes] = []
    error: Exception | None = None
    async with client.stream("POST", "/chat/completions", json=payload,
                             headers=headers or {}) as response:
        try:
            with trio.CancelScope() as enough:  # cancelled inside httpx's read: it unwinds
                async for data in response.aiter_raw():
                    reads.append(data)
                    if until is not None and until(b"".join(reads)):
                        enough.cancel()  # the body need not end
        except httpx.TransportError as exc:
            error = exc
    return Reply(response.status_code, response.headers, reads, error)


async def test_models_lists_every_model_and_capture(client: httpx.AsyncClient) -> None:
    response = await client.get("/models")
    ids = {m["id"] for m in response.json()["data"]}
    assert set(MODELS) <= ids
    assert {f"replay/{name}" for name in names()} <= ids


async def test_mock_fast_streams_a_complete_answer(client: httpx.AsyncClient) -> None:
    reply = await chat(client, "mock/fast", seed=3)
    assert reply.status == 200
    assert reply.headers["content-type"].startswith("text/event-stream")
    result = reply.result(strict=True)
    assert (result.outcome, result.choices[0].finish_reason) == (Outcome.COMPLETED, "stop")
    assert result.choices[0].role == "assistant" and len(result.text) > 20
    again = await chat(client, "mock/fast", seed=3)
    assert again.result().text == result.text


async def test_non_streaming_completion_matches_the_stream(client: httpx.AsyncClient) -> None:
    streamed = (await chat(client, "mock/fast", seed=8, n=2)).result()
    response = await client.post("/chat/completions", json={
        "model": "mock/fast", "messages": MESSAGES, "seed": 8, "n": 2})
    completion = response.json()
    assert completion["object"] == "chat.completion"
    assert [c["message"]["content"] for c in completion["choices"]] == [
        c.text for c in streamed.choices]
    assert completion["usage"]["completion_tokens"] > 0


async def test_usage_chunk_has_empty_choices(client: httpx.AsyncClient) -> None:
    reply = await chat(client, "mock/fast", stream_options={"include_usage": True}, max_tokens=7)
    events = [json.loads(e[6:]) for e in reply.body.decode().split("\n\n")
              if e.startswith("data: {")]
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 7
    result = reply.result()
    assert result.choices[0].finish_reason == "length"
    assert result.usage is not None and result.usage.total_tokens == (
        result.usage.prompt_tokens or 0) + 7


async def test_mock_echo_repeats_the_prompt(client: httpx.AsyncClient) -> None:
    assert (await chat(client, "mock/echo")).result().text == MESSAGES[0]["content"]


async def test_mock_reasoning_sends_reasoning_first(client: httpx.AsyncClient) -> None:
    reply = await chat(client, "mock/reasoning")
    parser = StreamParser()
    kinds = [type(e) for data in reply.reads for e in parser.feed(data)
             if isinstance(e, ReasoningDelta | TextDelta)]
    assert kinds.index(TextDelta) > 0 and ReasoningDelta not in kinds[kinds.index(TextDelta):]
    result = parser.result()
    assert result.choices[0].reasoning and result.text


async def test_mock_tools_sends_two_interleaved_calls(client: httpx.AsyncClient) -> None:
    reply = await chat(client, "mock/tools", tools=[WEATHER_TOOL])
    parser = StreamParser(tools=[WEATHER_TOOL])
    order = []
    for data in reply.reads:
        for event in parser.feed(data):
            if type(event).__name__ == "ToolCallDelta":
                order.append(event.tool_index)  # type: ignore[union-attr]
    result = parser.result()
    assert result.choices[0].finish_reason == "tool_calls"
    calls = result.choices[0].tool_calls
    assert [c.name for c in calls] == ["lookup", "get_weather"]
    assert calls[0].schema_errors == () and isinstance(calls[1].parsed, dict)
    assert order[:4] == [0, 1, 0, 1]  # the fragments interleave


async def test_forced_tool_choice(client: httpx.AsyncClient) -> None:
    reply = await chat(client, "mock/fast", tools=[WEATHER_TOOL],
                       tool_choice={"type": "function", "function": {"name": "lookup"}})
    [call] = reply.result(tools=[WEATHER_TOOL]).choices[0].tool_calls
    assert (call.name, call.schema_errors) == ("lookup", ())


async def test_mock_length(client: httpx.AsyncClient) -> None:
    result = (await chat(client, "mock/length")).result()
    assert result.choices[0].finish_reason == "length"
    assert (await chat(client, "mock/length", max_tokens=4, stream_options={
        "include_usage": True})).result().usage.completion_tokens == 4  # type: ignore[union-attr]


async def test_cadence_header_spaces_the_chunks(autojump_clock: MockClock) -> None:
    async with virtual_upstream() as upstream:
        client = upstream.connect("mock/fast", max_tokens=5,
                                  headers={"x-fanout-cadence": "0.05"})
        await client.wait_for(lambda c: c.body.complete)
    head, *writes = client.writes
    assert head[0] == 0 and b" 200 " in head[1]
    # the role chunk at once, then each delta 0.05 s after the one before, in a write of
    # its own (the last with the finish and [DONE])
    assert [round(at, 6) for at, _ in writes] == [0, 0.05, 0.1, 0.15, 0.2, 0.25]
    deltas = [[c["choices"][0]["delta"].get("content") for c in payloads(dechunk(data).body)
               if c["choices"]] for _, data in writes]
    assert deltas[0] == [""] and all(len(d) == 1 and d[0] for d in deltas[1:-1])
    assert deltas[-1][0] and b"[DONE]" in writes[-1][1]


async def test_truncate_closes_mid_event(client: httpx.AsyncClient) -> None:
    reply = await chat(client, "fault/truncate")
    assert isinstance(reply.error, httpx.RemoteProtocolError)
    result = reply.result()
    assert (result.outcome, result.pending_event) == (Outcome.TRUNCATED, True)
    assert result.text  # the partial output is there


async def test_no_done_closes_cleanly_without_done(client: httpx.AsyncClient) -> None:
    reply = await chat(client, "fault/no-done")
    assert reply.error is None
    result = reply.result()
    assert (result.outcome, result.all_choices_finished, result.pending_event) == (
        Outcome.TRUNCATED, True, False)


async def test_drop_chunked_dies_inside_an_http_chunk(client: httpx.AsyncClient) -> None:
    reply = await chat(client, "fault/drop-chunked:3")
    assert isinstance(reply.error, httpx.RemoteProtocolError)
    assert reply.result().outcome is Outcome.TRUNCATED


async def test_stall_keeps_the_socket_open(client: httpx.AsyncClient) -> None:
    reply = await chat(client, "fault/stall:3", until=lambda body: body.count(b"\n\n") >= 3)
    assert reply.error is None  # nothing closed: we stopped reading
    result = reply.result()
    assert result.outcome is Outcome.TRUNCATED and result.events == 3


async def test_stall_sends_nothing_more_and_notices_the_client_leave(
        autojump_clock: MockClock) -> None:
    async with virtual_upstream() as upstream:
        client = upstream.connect("fault/stall:3")
        await trio.sleep(3600)
        assert client.closed_at is None and not client.body.complete
        assert all(at == 0 for at, _ in client.writes)  # all at once, then an hour of nothing
        assert len(payloads(client.body.body)) == 3
        client.leave()
        await client.wait_for(lambda c: c.closed_at is not None)
        assert client.closed_at == 3600  # at once: the hang watches the socket


async def test_heartbeat_stall_sends_only_comments(client: httpx.AsyncClient) -> None:
    reply = await chat(client, "fault/heartbeat-stall:2", headers={"x-fanout-cadence": "0.01"},
                       until=lambda body: body.count(b": ping") >= 3)
    result = reply.result()
    assert result.events == 2 and result.comments >= 3
    assert result.outcome is Outcome.TRUNCATED


async def test_heartbeat_stall_pings_at_the_cadence_for_ever(autojump_clock: MockClock) -> None:
    async with virtual_upstream() as upstream:
        client = upstream.connect("fault/heartbeat-stall:2", headers={"x-fanout-cadence": "0.1"})
        await trio.sleep(60 + 0.05)
        assert client.closed_at is None
    _, *writes = client.writes
    assert [round(at, 6) for at, _ in writes] == [round(0.1 * k, 6) for k in range(601)]
    bodies = [dechunk(data).body for _, data in writes]
    assert [len(payloads(body)) for body in bodies[:2]] == [1, 1]  # the two events
    assert set(bodies[2:]) == {b": ping - fanout keep-alive\n\n"}  # then only comments


async def test_slow_first_token(client: httpx.AsyncClient) -> None:
    parser = StreamParser()
    kinds: list[str] = []
    async with client.stream("POST", "/chat/completions", headers={"x-fanout-delay": "0.05"},
                             json={"model": "fault/slow-first-token", "messages": MESSAGES,
                                   "stream": True}) as response:
        async for data in response.aiter_raw():
            kinds += ["text" if isinstance(e, TextDelta) else "other" for e in parser.feed(data)]
    assert kinds[0] == "other" and "text" in kinds  # the role chunk came before any text
    assert parser.result().outcome is Outcome.COMPLETED


async def test_slow_first_token_waits_the_delay(autojump_clock: MockClock) -> None:
    async with virtual_upstream() as upstream:
        client = upstream.connect("fault/slow-first-token", headers={"x-fanout-delay": "0.3"})
        await client.wait_for(lambda c: c.body.complete)
    _, (role_at, role), (text_at, text) = client.writes
    assert role_at == 0 and [c["choices"][0]["delta"] for c in payloads(dechunk(role).body)] == [
        {"role": "assistant", "content": ""}]
    assert text_at == pytest.approx(0.3)  # the rest, at cadence 0, in one write
    assert payloads(dechunk(text).body)[0]["choices"][0]["delta"]["content"]


async def test_garbage_frames_are_skipped_text_complete(client: httpx.AsyncClient) -> None:
    reply = await chat(client, "fault/garbage")
    result = reply.result()
    data_events = reply.body.count(b"data: ") - 1  # less [DONE]
    assert result.outcome is Outcome.COMPLETED
    assert result.skipped_frames == data_events // 5 and result.skipped_frames >= 3
    with pytest.raises(Exception, match="malformed frame"):
        reply.result(strict=True)


async def test_huge_event_trips_the_limit_and_keeps_earlier_text(
        client: httpx.AsyncClient) -> None:
    reply = await chat(client, "fault/huge-event:655360")
    limited = reply.result(max_event_size=100_000)
    assert limited.outcome is Outcome.ERROR
    assert limited.error is not None and limited.error.code == "event_too_large"
    assert limited.text  # the chunks before it
    assert limited.text == reply.result().text[: len(limited.text)]
    unlimited = reply.result()
    assert unlimited.outcome is Outcome.COMPLETED and "x" * 655360 in unlimited.text


async def test_bad_utf8_becomes_replacement_characters(client: httpx.AsyncClient) -> None:
    result = (await chat(client, "fault/bad-utf8")).result()
    assert result.outcome is Outcome.COMPLETED and " bad \ufffd\ufffd\ufffd( bytes " in result.text


@pytest.mark.parametrize("variant", ["", ":typed"])
async def test_error_event_in_both_shapes(client: httpx.AsyncClient, variant: str) -> None:
    reply = await chat(client, f"fault/error-event{variant}")
    if variant:
        assert b"event: error\n" in reply.body
    result = reply.result()
    assert result.outcome is Outcome.ERROR and result.text
    assert result.error is not None and "crashed mid-stream" in result.error.message
    assert (result.error.type, result.error.code) == ("server_error", "mock_crash")


async def test_429_then_success_with_retry_after(client: httpx.AsyncClient) -> None:
    statuses = []
    for _ in range(4):
        reply = await chat(client, "fault/429:2", headers={"x-fanout-retry-after": "0.25"})
        statuses.append(reply.status)
        if reply.status == 429:
            assert reply.headers["retry-after"] == "0"
            assert reply.headers["retry-after-ms"] == "250"
            error = reply.result().error
            assert error is not None and error.code == "rate_limit_exceeded"
    assert statuses == [429, 429, 200, 200]


async def test_500_then_ok(client: httpx.AsyncClient) -> None:
    first, second = [await chat(client, "fault/500-then-ok") for _ in range(2)]
    assert (first.status, second.status) == (500, 200)
    assert second.result().outcome is Outcome.COMPLETED


async def test_empty_200(client: httpx.AsyncClient) -> None:
    reply = await chat(client, "fault/empty-200")
    assert (reply.status, reply.body, reply.error) == (200, b"", None)
    assert reply.result().outcome is Outcome.TRUNCATED


@pytest.mark.parametrize("name", names())
async def test_replay_serves_each_capture_as_recorded(client: httpx.AsyncClient,
                                                      name: str) -> None:
    capture = load(name)
    reply = await chat(client, f"replay/{name}:x0")
    assert reply.status == capture.status and reply.body == capture.body
    expected = parse_stream([capture.body], status=capture.status)
    assert reply.result() == expected


@pytest.mark.parametrize("scale", [1.0, 0.5])
async def test_replay_keeps_the_recorded_timing(autojump_clock: MockClock, scale: float) -> None:
    capture = load("01_plain")
    first = next(at for at, length in capture.reads if length == 0)
    expected: dict[float, bytes] = {}  # virtual second -> the body written then
    for at_ms, piece in capture.pieces():
        at = round(max(at_ms - first, 0) / 1000 * scale, 6)
        expected[at] = expected.get(at, b"") + piece
    async with virtual_upstream() as upstream:
        client = upstream.connect(f"replay/01_plain:x{scale}")
        await client.wait_for(lambda c: c.body.complete)
    assert len(expected) > 5 and written_by_time(client) == expected


def written_by_time(client: VirtualClient) -> dict[float, bytes]:
    """The body bytes each write carried, by the virtual second they were written at."""
    out: dict[float, bytes] = {}
    for at, data in client.writes[1:]:
        out[round(at, 6)] = out.get(round(at, 6), b"") + dechunk(data).body
    return out


async def _read_sizes(client: httpx.AsyncClient, fragment: str) -> tuple[list[bytes], Reply]:
    reply = await chat(client, f"mock/fast@{fragment}", max_tokens=12, seed=1)
    return reply.reads, reply


async def test_fragmentation_really_produces_separate_reads(client: httpx.AsyncClient) -> None:
    whole, whole_reply = await _read_sizes(client, "whole")
    event, _ = await _read_sizes(client, "event")
    byte, _ = await _read_sizes(client, "byte")
    random, _ = await _read_sizes(client, "random:7")
    evil, evil_reply = await _read_sizes(client, "evil")
    events = whole_reply.body.count(b"\n\n")
    assert len(whole) == 1
    assert len(event) == events
    assert len(byte) > len(whole_reply.body) * 0.9
    assert len(random) > events
    assert b"\r\n" in evil_reply.body and b"\n\n" not in evil_reply.body
    assert any(r.endswith(b"\r") for r in evil)
    assert any(r[-1] >= 0xC0 for r in evil)  # a read ended inside a character
    text = whole_reply.result().text
    for reads in (event, byte, random, evil):
        assert parse_stream(reads).text == text


async def test_bad_requests_get_json_errors_naming_the_field(client: httpx.AsyncClient) -> None:
    missing = await client.post("/chat/completions", json={"model": "mock/fast"})
    assert missing.status_code == 400
    assert missing.json()["error"]["param"] == "messages"
    bad_json = await client.post("/chat/completions", content=b"{not json",
                                 headers={"content-type": "application/json"})
    assert bad_json.status_code == 400
    unknown = await client.post("/chat/completions", json={"model": "gpt-9", "messages": MESSAGES})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    assert (await client.get("/chat/completions")).status_code == 405
    assert (await client.get("/nowhere")).status_code == 404


async def test_keep_alive_serves_many_requests_on_one_connection(
        client: httpx.AsyncClient) -> None:
    for _ in range(5):
        assert (await chat(client, "mock/fast", max_tokens=3)).result().outcome is (
            Outcome.COMPLETED)


@pytest.mark.usefixtures("watchdog")
async def test_key_check() -> None:
    payload = {"model": "mock/fast", "messages": MESSAGES}
    async with (open_upstream(key="sk-right-key") as upstream,
                httpx.AsyncClient(base_url=upstream.base_url) as http):
        none = await http.post("/chat/completions", json=payload)
        wrong = await http.post("/chat/completions", json=payload,
                                headers={"authorization": "Bearer sk-wrong"})
        right = await http.post("/chat/completions", json=payload,
                                headers={"authorization": "Bearer sk-right-key"})
    assert (none.status_code, wrong.status_code, right.status_code) == (401, 401, 200)
    assert wrong.json()["error"]["code"] == "invalid_api_key"
    assert b"sk-wrong" not in wrong.content and b"sk-right" not in wrong.content


async def test_upstream_reports_its_bound_port(upstream: RunningUpstream) -> None:
    assert upstream.port > 0
    assert upstream.base_url == f"http://127.0.0.1:{upstream.port}/v1"


async def test_finish_events_arrive_after_content(client: httpx.AsyncClient) -> None:
    parser = StreamParser()
    events = [e for data in (await chat(client, "mock/fast", n=2)).reads for e in parser.feed(data)]
    finished = [i for i, e in enumerate(events) if isinstance(e, ChoiceFinished)]
    texts = [i for i, e in enumerate(events) if isinstance(e, TextDelta)]
    assert len(finished) == 2 and max(texts) < min(finished)
