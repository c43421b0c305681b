"""One scripted answer streamed in the three dialects gives one result: the same text,
reasoning, tool calls, finish reason, usage and outcome (only the natives differ)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fanout import Outcome, StreamResult, parse_stream
from tests.strategies import (
    Script,
    anthropic_frames,
    chat_bytes,
    renderings,
    responses_frames,
    scripts,
    serialize,
)

SETTINGS = settings(max_examples=100, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def bodies(script: Script, terminal: bool, data: st.DataObject) -> dict[str, bytes]:
    return {
        "chat": chat_bytes(script, terminal=terminal),
        "responses": serialize(responses_frames(script, terminal=terminal),
                               data.draw(renderings)),
        "anthropic": serialize(anthropic_frames(script, terminal=terminal),
                               data.draw(renderings)),
    }


def essence(result: StreamResult) -> tuple[Any, ...]:
    [choice] = result.choices
    usage = result.usage
    return (
        result.outcome, choice.role, choice.text, choice.reasoning, choice.refusal,
        choice.finish_reason,
        tuple((c.index, c.id, c.type, c.name, c.arguments, c.parse_error)
              for c in choice.tool_calls),
        None if usage is None else (usage.prompt_tokens, usage.completion_tokens,
                                    usage.total_tokens),
        result.flags, result.skipped_frames,
    )


@SETTINGS
@given(script=scripts(), data=st.data())
def test_the_same_answer_gives_the_same_result_in_every_dialect(script: Script,
                                                                data: st.DataObject) -> None:
    results = {api: parse_stream([raw], api=api)
               for api, raw in bodies(script, True, data).items()}
    assert essence(results["responses"]) == essence(results["chat"])
    assert essence(results["anthropic"]) == essence(results["chat"])
    chat = results["chat"]
    assert chat.outcome is Outcome.COMPLETED
    assert chat.choices[0].finish_reason == script.finish_reason
    assert chat.usage is not None and chat.usage.total_tokens == script.total_tokens
    assert [c.parsed for c in chat.choices[0].tool_calls] == [
        json.loads(c.arguments) for c in script.calls]
    assert results["chat"].choices[0].native_finish_reason is None
    assert results["anthropic"].choices[0].native_finish_reason in (
        "end_turn", "tool_use", "max_tokens", "refusal")
    assert results["responses"].choices[0].native_finish_reason in (
        "completed", "max_output_tokens", "content_filter")


@SETTINGS
@given(script=scripts(), data=st.data())
def test_without_the_terminal_event_every_dialect_is_truncated_with_its_output(
        script: Script, data: st.DataObject) -> None:
    results = {api: parse_stream([raw], api=api)
               for api, raw in bodies(script, False, data).items()}
    for api, terminal in (("chat", "[DONE]"), ("anthropic", "message_stop"),
                          ("responses", "response.completed or response.incomplete")):
        result = results[api]
        assert result.outcome is Outcome.TRUNCATED
        assert result.reason is not None and result.reason.endswith(f"without {terminal}")
        assert result.choices[0].text == "".join(script.text)
        assert [c.arguments for c in result.choices[0].tool_calls] == [
            c.arguments for c in script.calls]


@pytest.mark.parametrize("api", ["chat", "responses", "anthropic"])
def test_an_empty_body_is_truncated_before_any_event(api: str) -> None:
    result = parse_stream([b""], api=api)
    assert (result.outcome, result.reason) == (Outcome.TRUNCATED,
                                               "the body ended before any event (empty body)")
