"""The upstream's protocol logic without sockets: requests, plans, fragments, captures."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest

from fanout import Outcome, parse_stream
from fanout.upstream.capture import Capture, CaptureError, find_captures
from fanout.upstream.catalog import MODELS, plan_chat
from fanout.upstream.fragment import Fragmenter, split_evil
from fanout.upstream.models import Context
from fanout.upstream.plans import (
    Abort,
    ChatRequest,
    Hang,
    Pause,
    Plan,
    RequestError,
    Send,
    parse_chat_request,
)
from tests.captures import CAPTURES


def request(model: str = "mock/fast", headers: dict[str, str] | None = None, **body: object
            ) -> ChatRequest:
    payload = {"model": model, "messages": [{"role": "user", "content": "hello there"}],
               "stream": True, **body}
    return parse_chat_request(json.dumps(payload).encode(), headers or {})


def plan(model: str = "mock/fast", **body: object) -> Plan:
    return plan_chat(request(model, **body), Context())


def body_of(p: Plan, limit: int = 10_000) -> bytes:
    assert p.steps is not None
    out = []
    for step, _ in zip(p.steps, range(limit), strict=False):
        if isinstance(step, Send):
            out.append(step.data)
    return b"".join(out)


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        (b"{nope", None, "could not parse the JSON body"),
        (b"[]", None, "must be a JSON object"),
        (b'{"messages": [{"role": "user", "content": "x"}]}', "model", "provide a model"),
        (b'{"model": "mock/fast"}', "messages", "Missing required parameter: 'messages'"),
        (b'{"model": "mock/fast", "messages": []}', "messages", "non-empty array"),
        (b'{"model": "mock/fast", "messages": ["hi"]}', "messages[0]", "with a 'role'"),
        (b'{"model": "m", "messages": [{"role": "user"}], "stream": "yes"}', "stream", "boolean"),
        (b'{"model": "m", "messages": [{"role": "user"}], "n": 0}', "n", "between 1 and 16"),
        (b'{"model": "m", "messages": [{"role": "user"}], "max_tokens": -1}', "max_tokens", "at least 1"),
        (b'{"model": "m", "messages": [{"role": "user"}], "temperature": "hot"}', "temperature", "number"),
        (b'{"model": "m", "messages": [{"role": "user"}], "tools": {}}', "tools", "array"),
    ],
)
def test_bad_requests_name_the_field(body: bytes, param: str | None, message: str) -> None:
    with pytest.raises(RequestError) as info:
        parse_chat_request(body, {})
    assert info.value.param == param
    assert message in info.value.message


def test_model_arguments_and_fragment_suffix() -> None:
    parsed = request("fault/429:3@byte")
    assert (parsed.name, parsed.args, parsed.fragment) == ("fault/429", ("3",), "byte")
    assert request("mock/fast", {"x-fanout-fragment": "evil"}).fragment == "evil"


def test_bad_control_headers_are_refused() -> None:
    with pytest.raises(RequestError, match="x-fanout-cadence"):
        request(headers={"x-fanout-cadence": "fast"})
    with pytest.raises(RequestError, match="negative"):
        request(headers={"x-fanout-delay": "-1"})


def test_answers_are_deterministic_and_depend_on_seed_and_prompt() -> None:
    first = parse_stream([body_of(plan(seed=1))]).text
    assert first == parse_stream([body_of(plan(seed=1))]).text
    assert first != parse_stream([body_of(plan(seed=2))]).text
    assert len(first) > 20


def test_fragments_are_one_to_eight_characters() -> None:
    events = [json.loads(line[6:]) for line in body_of(plan(seed=5)).decode().split("\n\n")
              if line.startswith("data: {")]
    pieces = [e["choices"][0]["delta"].get("content") for e in events if e["choices"]]
    pieces = [p for p in pieces if p]
    assert pieces and all(1 <= len(p) <= 8 for p in pieces)


def test_multibyte_text_is_sent_raw() -> None:
    bodies = b"".join(body_of(plan(seed=s)) for s in range(20))
    assert any(b >= 0x80 for b in bodies)  # UTF-8 on the wire, not \\u escapes


def test_mock_slow_pauses_20_to_60_ms_per_token() -> None:
    p = plan("mock/slow")
    assert p.steps is not None
    pauses = [s.seconds for s in p.steps if isinstance(s, Pause)]
    assert len(pauses) > 10 and all(0.02 <= s <= 0.06 for s in pauses)


def test_cadence_request_header_beats_server_and_model() -> None:
    slow = plan_chat(request("mock/slow", {"x-fanout-cadence": "0"}), Context(cadence=0.5))
    assert slow.steps is not None and not any(isinstance(s, Pause) for s in slow.steps)
    fast = plan_chat(request("mock/fast"), Context(cadence=0.01))
    assert fast.steps is not None
    assert {s.seconds for s in fast.steps if isinstance(s, Pause)} == {0.01}


def test_a_scripted_models_argument_is_its_cadence() -> None:
    def pauses(model: str, headers: dict[str, str] | None = None,
               context: Context | None = None) -> set[float]:
        p = plan_chat(request(model, headers or {}), context or Context())
        assert p.steps is not None
        return {s.seconds for s in p.steps if isinstance(s, Pause)}

    assert pauses("mock/reasoning:0.04") == {0.04}
    assert pauses("mock/slow:0.01", context=Context(cadence=0.5)) == {0.01}  # over --cadence
    assert pauses("mock/fast:0.01", {"x-fanout-cadence": "0.2"}) == {0.2}  # the header wins
    assert pauses("mock/fast:0") == set()
    assert pauses("fault/truncate:3") == set()  # a fault's argument is not a cadence


def test_max_tokens_gives_length_and_usage_counts() -> None:
    result = parse_stream([body_of(plan(max_tokens=3, stream_options={"include_usage": True}))])
    assert result.choices[0].finish_reason == "length"
    assert result.usage is not None and result.usage.completion_tokens == 3


def test_n_choices_are_interleaved() -> None:
    result = parse_stream([body_of(plan(n=3, seed=4))])
    assert [c.index for c in result.choices] == [0, 1, 2]
    assert len({c.text for c in result.choices}) == 3


def test_every_model_has_a_plan_and_a_description() -> None:
    for name, spec in MODELS.items():
        assert spec.description
        p = plan_chat(attrs.evolve(request(name), api=spec.apis[0]), Context())
        assert p.status in (200, 400, 429, 500, 503, 529)


def test_unknown_model_is_404() -> None:
    p = plan("nope/nothing")
    assert p.status == 404 and b"model_not_found" in p.body


def test_truncate_and_drop_chunked_end_in_abort() -> None:
    for model, partial in (("fault/truncate", None), ("fault/drop-chunked", bytes)):
        p = plan(model)
        assert p.steps is not None
        steps = list(p.steps)
        assert isinstance(steps[-1], Abort)
        assert (steps[-1].partial_chunk is None) is (partial is None)
        assert sum(isinstance(s, Send) for s in steps) == (6 if partial is None else 5)


def test_stall_hangs_after_n_chunks() -> None:
    p = plan("fault/stall:2")
    assert p.steps is not None
    steps = list(p.steps)
    assert isinstance(steps[-1], Hang) and sum(isinstance(s, Send) for s in steps) == 2


def test_fails_first_counts_per_conversation() -> None:
    context = Context()
    statuses = [plan_chat(request("fault/429:2"), context).status for _ in range(3)]
    assert statuses == [429, 429, 200]
    other = plan_chat(request("fault/429:2", seed=9), context)
    assert other.status == 429  # another conversation has its own count


def test_fragmenter_modes_rejoin_to_the_original() -> None:
    data = "data: {\"a\": \"é☀️👍\"}\n\n".encode()
    for mode in ("event", "whole", "byte", "random:3", "random:4", "evil"):
        pieces = Fragmenter(mode).split(data)
        joined = b"".join(pieces)
        assert joined == (data.replace(b"\n", b"\r\n") if mode == "evil" else data), mode
    assert len(Fragmenter("byte").split(data)) == len(data)
    assert Fragmenter("random:3").split(data) == Fragmenter("random:3").split(data)


def test_evil_splits_crlf_and_every_multibyte_character() -> None:
    pieces = split_evil("x: é👍\n\n".encode())
    assert all(p.decode("utf-8", "strict") for p in pieces if p.isascii())
    assert sum(1 for p in pieces if p.endswith(b"\r")) == 2
    with pytest.raises(UnicodeDecodeError):
        [p.decode("utf-8", "strict") for p in pieces]  # some character was cut


def test_auto_fragment_coalesces() -> None:
    assert Fragmenter("auto").coalesce and not Fragmenter("event").coalesce
    with pytest.raises(ValueError, match="unknown fragment mode 'chunky'"):
        Fragmenter("chunky")


def test_capture_roundtrip_in_our_format(tmp_path: Path) -> None:
    original = Capture.load(CAPTURES / "01_plain.body")
    original.dump(tmp_path / "again.capture.json")
    copy = Capture.load(tmp_path / "again.capture.json")
    assert (copy.status, copy.body, copy.reads, copy.headers) == (
        original.status, original.body, original.reads, original.headers)
    assert find_captures([tmp_path]) == {"again": tmp_path / "again.capture.json"}
    assert b"".join(p for _, p in copy.pieces()) == original.body
    assert parse_stream([p for _, p in copy.pieces()]).outcome is Outcome.COMPLETED


def test_capture_errors_name_the_file_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.capture.json"
    bad.write_text(json.dumps({"format": "fanout-capture/1", "status": 200}))
    with pytest.raises(CaptureError, match=r"bad.capture.json: missing field 'body_base64'"):
        Capture.load(bad)
    bad.write_text(json.dumps({"format": "other"}))
    with pytest.raises(CaptureError, match="field 'format' is 'other'"):
        Capture.load(bad)
    lonely = tmp_path / "lonely.body"
    lonely.write_bytes(b"data: x\n\n")
    with pytest.raises(CaptureError, match=r"lonely.headers.txt: missing"):
        Capture.load(lonely)


def test_busy_refuses_past_its_concurrency_and_frees_on_close() -> None:
    context = Context()
    first = plan_chat(request("fault/busy:2"), context)
    second = plan_chat(request("fault/busy:2"), context)
    assert first.status == second.status == 200
    refused = plan_chat(request("fault/busy:2"), context)
    assert refused.status == 429
    assert dict(refused.headers)["retry-after-ms"] == "1000"
    assert b"2 concurrent requests" in refused.body
    assert first.steps is not None and second.steps is not None
    list(first.steps)  # streamed to the end
    assert plan_chat(request("fault/busy:2"), context).status == 200
    second.steps.close()  # type: ignore[attr-defined]  # never started: the server dropped it
    assert context.streaming["fault/busy"] == 1
