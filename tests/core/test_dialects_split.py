"""The Responses and Anthropic dialects: any split of the same bytes gives the same,
right result, over generated streams (noise, line endings, named or unnamed events)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fanout import Outcome, StreamResult, parse_stream
from fanout.core import _json
from tests.helpers import byte_at_a_time, split_at
from tests.strategies import DialectStream, dialect_streams

SETTINGS = settings(max_examples=120, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])
TERMINALS = {"responses": "response.completed or response.incomplete",
             "anthropic": "message_stop"}


@pytest.fixture(params=["orjson", "stdlib"], autouse=True)
def json_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if request.param == "stdlib":
        monkeypatch.setattr(_json, "loads", json.loads)
    yield request.param


def check_against_script(result: StreamResult, stream: DialectStream) -> None:
    script = stream.script
    assert result.outcome is (Outcome.COMPLETED if stream.terminal else Outcome.TRUNCATED)
    if not stream.terminal:
        assert result.reason is not None
        assert result.reason.endswith(f"without {TERMINALS[stream.api]}")
    assert (result.skipped_frames, result.comments) == (0, stream.comments)
    assert result.ignored_events == stream.ignored
    [choice] = result.choices
    assert choice.role == "assistant"
    assert choice.text == "".join(script.text)
    assert choice.reasoning == "".join(script.reasoning)
    assert [(c.index, c.id, c.name, c.arguments, c.parse_error) for c in choice.tool_calls] == [
        (i, c.id, c.name, c.arguments, None) for i, c in enumerate(script.calls)]
    assert [c.parsed for c in choice.tool_calls] == [json.loads(c.arguments)
                                                     for c in script.calls]
    if stream.api == "anthropic" or stream.terminal:  # Responses' finish is in its terminal
        assert choice.finish_reason == script.finish_reason
    else:
        assert choice.finish_reason is None
    if stream.api == "anthropic" and script.reasoning:
        [block] = choice.thinking
        assert (block.thinking, block.signature) == ("".join(script.reasoning), script.signature)
    else:
        assert choice.thinking == ()
    usage = result.usage
    if stream.api == "responses" and not stream.terminal:
        assert usage is None
    else:
        assert usage is not None
        assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (
            script.prompt_tokens, script.completion_tokens, script.total_tokens)


@SETTINGS
@pytest.mark.parametrize("api", ["responses", "anthropic"])
@given(data=st.data())
def test_any_split_gives_the_same_correct_result(api: str, data: st.DataObject,
                                                 json_backend: str) -> None:
    stream = data.draw(dialect_streams(api))
    whole = parse_stream([stream.body], api=api)
    check_against_script(whole, stream)
    offsets = data.draw(st.lists(st.integers(0, len(stream.body)), max_size=30))
    assert parse_stream(split_at(stream.body, offsets), api=api) == whole


@settings(SETTINGS, max_examples=25)
@pytest.mark.parametrize("api", ["responses", "anthropic"])
@given(data=st.data())
def test_byte_at_a_time_gives_the_same_result(api: str, data: st.DataObject,
                                              json_backend: str) -> None:
    stream = data.draw(dialect_streams(api))
    assert parse_stream(byte_at_a_time(stream.body), api=api) == parse_stream([stream.body],
                                                                              api=api)
