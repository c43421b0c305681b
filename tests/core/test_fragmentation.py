"""Any split of the same bytes gives the same result, and the right one."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fanout import Outcome, StreamResult, parse_stream
from fanout.core import _json
from tests.helpers import byte_at_a_time, split_at
from tests.strategies import GeneratedStream, chat_streams

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


@pytest.fixture(params=["orjson", "stdlib"], autouse=True)
def json_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if request.param == "stdlib":
        monkeypatch.setattr(_json, "loads", json.loads)
    yield request.param


def check_against_model(result: StreamResult, stream: GeneratedStream) -> None:
    finished = any(c.finish_reason is not None for c in stream.choices.values())
    assert result.outcome is (Outcome.COMPLETED if stream.done and finished
                              else Outcome.TRUNCATED)
    assert (result.reason is None) is (result.outcome is Outcome.COMPLETED)
    assert result.skipped_frames == 0
    assert result.comments == stream.comments
    assert [c.index for c in result.choices] == sorted(stream.choices)
    for choice in result.choices:
        expected = stream.choices[choice.index]
        assert choice.text == expected.text
        assert choice.reasoning == expected.reasoning
        assert choice.finish_reason == expected.finish_reason
        assert [(t.index, t.id, t.name, t.arguments) for t in choice.tool_calls] == [
            (i, c.id, c.name, c.arguments) for i, c in sorted(expected.calls.items())
        ]
    assert (result.usage.total_tokens if result.usage else None) == stream.usage_total


@SETTINGS
@given(stream=chat_streams(), data=st.data())
def test_any_split_gives_the_same_correct_result(stream: GeneratedStream, data: st.DataObject,
                                                 json_backend: str) -> None:
    whole = parse_stream([stream.body])
    check_against_model(whole, stream)
    offsets = data.draw(st.lists(st.integers(0, len(stream.body)), max_size=30))
    assert parse_stream(split_at(stream.body, offsets)) == whole


@settings(SETTINGS, max_examples=40)
@given(stream=chat_streams())
def test_byte_at_a_time_gives_the_same_result(stream: GeneratedStream, json_backend: str) -> None:
    assert parse_stream(byte_at_a_time(stream.body)) == parse_stream([stream.body])
