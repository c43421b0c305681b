"""The Accumulator: choices, tool calls, usage, errors and outcomes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fanout import (
    Accumulator,
    ChoiceFinished,
    ChoiceResult,
    ChoiceRole,
    DoneReceived,
    ErrorReported,
    FrameSkipped,
    Outcome,
    StreamError,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    Usage,
    UsageReported,
    parse_stream,
)
from tests.helpers import chunk, delta, sse_body

WEATHER_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"},
                               "unit": {"enum": ["celsius", "fahrenheit"]}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
]


def tool_calls(*calls: dict[str, Any], tools: Any = None) -> tuple[ToolCall, ...]:
    body = sse_body(*(chunk(delta(tool_calls=[c])) for c in calls))
    return parse_stream([body], tools=tools).choices[0].tool_calls


def fn(arguments: str | None = None, name: str | None = None) -> dict[str, Any]:
    function: dict[str, Any] = {}
    if name is not None:
        function["name"] = name
    if arguments is not None:
        function["arguments"] = arguments
    return function


def test_empty_stream_gives_no_choices_and_empty_text() -> None:
    result = parse_stream([b"data: [DONE]\n\n"])
    assert result.outcome is Outcome.TRUNCATED  # [DONE] alone: nothing finished
    assert result.reason == ("[DONE] arrived but no choice had a finish reason "
                             "(the server cut the stream)")
    assert result.choices == ()
    assert result.text == ""
    assert result.all_choices_finished is False


def test_text_fields_are_empty_strings_not_none() -> None:
    [choice] = parse_stream([sse_body(chunk(delta(role="assistant")))]).choices
    assert choice == ChoiceResult(0, "assistant", "", "", "", None, ())


def test_choices_in_any_order_with_gaps() -> None:
    body = sse_body(chunk(delta(2, content="c")), chunk(delta(1, content="b1")),
                    chunk(delta(1, content="b2"), delta(2, "stop")), chunk(delta(1, "length")))
    result = parse_stream([body])
    assert [(c.index, c.text, c.finish_reason) for c in result.choices] == [
        (1, "b1b2", "length"), (2, "c", "stop")]
    assert result.choice(2) is result.choices[1]
    assert result.choice(0) is None
    assert result.text == "b1b2"  # the first choice present
    assert result.all_choices_finished


def test_role_is_kept_once_never_concatenated() -> None:
    acc = Accumulator()
    acc.extend([ChoiceRole(0, "assistant"), ChoiceRole(0, "assistant"), ChoiceRole(0, "tool")])
    assert acc.choices()[0].role == "assistant"


def test_interleaved_tool_calls() -> None:
    calls = tool_calls(
        {"index": 0, "id": "a", "type": "function", "function": fn("", "f")},
        {"index": 1, "id": "b", "type": "function", "function": fn("", "g")},
        {"index": 0, "function": fn('{"x":')},
        {"index": 1, "function": fn('{"y":')},
        {"index": 0, "function": fn("1}")},
        {"index": 1, "function": fn("2}")},
    )
    assert [(c.index, c.id, c.name, c.arguments, c.parsed) for c in calls] == [
        (0, "a", "f", '{"x":1}', {"x": 1}), (1, "b", "g", '{"y":2}', {"y": 2})]


def test_sparse_tool_indexes_and_first_index_one() -> None:
    calls = tool_calls({"index": 2, "function": fn("{}", "h")}, {"index": 1, "function": fn("[]")})
    assert [(c.index, c.name, c.parsed) for c in calls] == [(1, None, []), (2, "h", {})]


def test_repeated_id_type_and_name_are_not_concatenated() -> None:
    repeated = {"index": 0, "id": "call_1", "type": "function"}
    calls = tool_calls(*({**repeated, "function": fn(part, "get_weather")}
                         for part in ['{"city"', ': "Paris"}']))
    assert calls == (ToolCall(0, "call_1", "function", "get_weather", '{"city": "Paris"}',
                              {"city": "Paris"}),)


def test_missing_index_matches_by_id_else_continues_the_last_call() -> None:
    calls = tool_calls(
        {"id": "a", "function": fn('{"p":', "f")},
        {"id": "b", "function": fn('{"q":', "g")},
        {"id": "a", "function": fn("1}")},
        {"function": fn("2")},  # no id, no index: the last call (a) continues... not b
    )
    assert [(c.index, c.id, c.arguments) for c in calls] == [(0, "a", '{"p":1}2'), (1, "b", '{"q":')]


def test_missing_index_without_id_starts_at_zero() -> None:
    calls = tool_calls({"function": fn('{"a"', "f")}, {"function": fn(":1}")})
    assert [(c.index, c.parsed) for c in calls] == [(0, {"a": 1})]


def test_tool_calls_are_per_choice() -> None:
    body = sse_body(
        chunk(delta(0, tool_calls=[{"index": 0, "function": fn("{}", "a")}]),
              delta(1, tool_calls=[{"index": 0, "function": fn("[1]", "b")}])))
    result = parse_stream([body])
    assert [(c.index, c.tool_calls[0].name, c.tool_calls[0].parsed) for c in result.choices] == [
        (0, "a", {}), (1, "b", [1])]


@pytest.mark.parametrize(
    ("arguments", "error"),
    [("", "no arguments were sent"), ("  ", "no arguments were sent"),
     ('{"city": "Par', "arguments are not valid JSON"),
     ('{"city": NaN}', "arguments are not valid JSON: NaN is not valid JSON"),
     ("-Infinity", "arguments are not valid JSON: -Infinity is not valid JSON")],
)
def test_unparseable_arguments_are_recorded_not_raised(arguments: str, error: str) -> None:
    [call] = tool_calls({"index": 0, "function": fn(arguments, "get_weather")}, tools=WEATHER_TOOLS)
    assert call.parsed is None
    assert call.parse_error is not None and call.parse_error.startswith(error)
    assert call.schema_errors is None
    assert call.arguments == arguments


def test_schema_validation_records_violations() -> None:
    [ok] = tool_calls({"index": 0, "function": fn('{"city": "Paris"}', "get_weather")},
                      tools=WEATHER_TOOLS)
    assert ok.schema_errors == ()
    [bad] = tool_calls({"index": 0, "function": fn('{"unit": "kelvin", "x": 1}', "get_weather")},
                       tools=WEATHER_TOOLS)
    assert bad.parsed == {"unit": "kelvin", "x": 1}
    assert bad.schema_errors is not None and len(bad.schema_errors) == 3
    assert any("'city' is a required property" in e for e in bad.schema_errors)
    assert any(e.startswith("unit: 'kelvin' is not one of") for e in bad.schema_errors)


def test_no_schema_for_an_unknown_function() -> None:
    [call] = tool_calls({"index": 0, "function": fn("{}", "other")}, tools=WEATHER_TOOLS)
    assert call.schema_errors is None


def test_invalid_schema_is_reported_not_raised() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": 12}}}]
    [call] = tool_calls({"index": 0, "function": fn("{}", "f")}, tools=tools)
    assert call.schema_errors is not None
    assert call.schema_errors[0].startswith("the tool's schema is invalid")


def test_later_usage_replaces_earlier_and_null_never_erases() -> None:
    first = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    last = {"prompt_tokens": 1, "completion_tokens": 5, "total_tokens": 6}
    body = sse_body(chunk(usage=first), chunk(usage=last), chunk(delta(content="x"), usage=None))
    assert parse_stream([body]).usage == Usage(1, 5, 6, last)


def test_usage_with_non_integer_counts() -> None:
    usage = Usage.from_dict({"prompt_tokens": "3", "total_tokens": 4.0, "completion_tokens": True})
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (None, None, None)


def test_reading_continues_after_finish_reason() -> None:
    usage = {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}
    body = sse_body(chunk(delta(content="a")), chunk(delta(0, "stop")), chunk(usage=usage))
    result = parse_stream([body])
    assert (result.text, result.choices[0].finish_reason, result.usage) == (
        "a", "stop", Usage(2, 1, 3, usage))


def test_outcomes() -> None:
    completed = parse_stream([sse_body(chunk(delta(0, "stop", content="a")))])
    assert (completed.outcome, completed.reason, completed.flags) == (
        Outcome.COMPLETED, None, ())
    truncated = parse_stream([sse_body(chunk(delta(0, "stop", content="a")), done=False)])
    assert (truncated.outcome, truncated.text, truncated.all_choices_finished) == (
        Outcome.TRUNCATED, "a", True)
    errored = parse_stream([sse_body(chunk(delta(content="a")), {"error": {"message": "x"}})])
    assert (errored.outcome, errored.text, errored.error) == (
        Outcome.ERROR, "a", StreamError("x"))


def test_first_error_is_the_cause() -> None:
    acc = Accumulator()
    acc.extend([ErrorReported(StreamError("first")), ErrorReported(StreamError("second"))])
    assert acc.error == StreamError("first")


def test_length_and_content_filter_are_data() -> None:
    body = sse_body(chunk(delta(0, "length", content="a"), delta(1, "content_filter")))
    result = parse_stream([body])
    assert result.outcome is Outcome.COMPLETED
    assert [c.finish_reason for c in result.choices] == ["length", "content_filter"]


def test_outcome_override_keeps_partial_output() -> None:
    acc = Accumulator(stream="s", content_key="k")
    acc.extend([TextDelta(0, "part"), ChoiceFinished(0, "stop"), DoneReceived()])
    result = acc.result(outcome=Outcome.CANCELLED)
    assert (result.outcome, result.text, result.stream, result.content_key) == (
        Outcome.CANCELLED, "part", "s", "k")


def test_skip_reasons_are_counted_and_capped() -> None:
    acc = Accumulator()
    acc.extend(FrameSkipped(f"r{i}", "") for i in range(25))
    result = acc.result()
    assert result.skipped_frames == 25
    assert result.skip_reasons == tuple(f"r{i}" for i in range(10))


def test_unknown_event_types_are_ignored() -> None:
    acc = Accumulator()
    acc.add(object())
    assert acc.result().choices == ()
    acc.extend([object(), TextDelta(0, "a"), "not an event", TextDelta(0, "b")])
    assert acc.result().choices[0].text == "ab"


def test_tool_call_deltas_fold_without_a_parser() -> None:
    acc = Accumulator()
    acc.extend([ToolCallDelta(0, 0, "id", "function", "f", '{"a"'),
                ToolCallDelta(0, 0, "id", "function", "f", ": 1}"),
                UsageReported(Usage(1, 2, 3))])
    assert acc.choices()[0].tool_calls[0].parsed == {"a": 1}


def _patterned(schema: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": "f", "parameters": schema}}]


@pytest.mark.parametrize(("pattern", "error"), [
    # re backtracks for hours on this one (jsonschema's own validator never returns);
    # regex sees at once that it fails
    ("^(a+)+$", "does not match '^(a+)+$'"),
    # and this one regex would backtrack on: its time limit ends it
    ("^(a|aa)+$", "the tool's schema pattern '^(a|aa)+$' timed out after 1 s"),
])
@pytest.mark.parametrize("where", ["pattern", "patternProperties", "additionalProperties"])
def test_a_tool_schema_pattern_never_hangs_the_stream(pattern: str, error: str,
                                                      where: str) -> None:
    # A user's pattern with nested quantifiers on the model's arguments (40 "a" and a
    # "!"): the call is still read, the pattern's failure named as a schema error.
    hostile = "a" * 40 + "!"
    schema: dict[str, Any] = {
        "pattern": {"type": "object",
                    "properties": {"s": {"type": "string", "pattern": pattern}}},
        "patternProperties": {"type": "object", "patternProperties": {pattern: {}},
                              "additionalProperties": False},
        "additionalProperties": {"type": "object", "patternProperties": {"^x$": {}},
                                 "additionalProperties": {"type": "string",
                                                          "pattern": pattern}},
    }[where]
    key = hostile if where == "patternProperties" else "s"  # there the keys are matched
    arguments = json.dumps({key: hostile})
    [call] = tool_calls({"index": 0, "function": fn(arguments, "f")}, tools=_patterned(schema))
    assert call.parsed == {key: hostile}
    assert call.schema_errors is not None and len(call.schema_errors) == 1
    if where == "patternProperties" and "timed out" not in error:
        assert f"'{hostile}' does not match any of the regexes" in call.schema_errors[0]
    else:
        assert error in call.schema_errors[0], call.schema_errors


def test_tool_schema_patterns_still_validate() -> None:
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^a+$"}},
              "patternProperties": {"^x_": {"type": "integer"}},
              "additionalProperties": False}
    [ok] = tool_calls({"index": 0, "function": fn('{"s": "aaa", "x_1": 1}', "f")},
                      tools=_patterned(schema))
    assert ok.schema_errors == ()
    [bad] = tool_calls({"index": 0, "function": fn('{"s": "ab", "x_1": "one", "y": 0}', "f")},
                       tools=_patterned(schema))
    assert bad.schema_errors is not None and sorted(bad.schema_errors) == [
        "(root): 'y' does not match any of the regexes: '^x_'",
        "s: 'ab' does not match '^a+$'",
        "x_1: 'one' is not of type 'integer'"]


@pytest.mark.parametrize("fold", ["add", "extend", "extend in pieces"])
def test_long_text_is_joined_as_it_comes(fold: str) -> None:
    # A string object per token costs ~50 bytes beyond its characters: the accumulator
    # joins runs of fragments as they come, so 1,000 tokens are a few dozen strings, and
    # the text, reasoning, refusal and tool-call arguments are exactly what was sent.
    from fanout.core.events import ReasoningDelta, RefusalDelta

    tokens = [f"t{i} " for i in range(1000)]
    events: list[Any] = []
    for i, token in enumerate(tokens):
        events += [TextDelta(0, token), ReasoningDelta(0, token.upper()),
                   RefusalDelta(0, token[::-1]),
                   ToolCallDelta(0, 0, "c1" if i == 0 else None, "f" if i == 0 else None,
                                 None, token)]
    acc = Accumulator()
    if fold == "add":
        for event in events:
            acc.add(event)
    elif fold == "extend":
        acc.extend(events)
    else:
        for start in range(0, len(events), 7):
            acc.extend(events[start:start + 7])
    acc.add(ChoiceFinished(0, "stop"))
    (choice,) = acc.choices()
    assert choice.text == "".join(tokens)
    assert choice.reasoning == "".join(t.upper() for t in tokens)
    assert choice.refusal == "".join(t[::-1] for t in tokens)
    assert choice.tool_calls[0].arguments == "".join(tokens)
    assert len(acc.texts(0)) <= 1000 // 32 + 32


# ------------------------------------------------------------- usage per choice

def _usage(prompt: int, completion: int, **extra: object) -> dict[str, object]:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion, **extra}


def test_usage_sent_after_each_choice_finish_is_added_up() -> None:
    # llama.cpp with n = 2 (captured from its native server): choice 0 finishes, its
    # usage; choice 1 goes on, finishes, its usage.  52 tokens, not the last chunk's 40.
    body = sse_body(chunk(delta(0, content="a"), delta(1, content="b")),
                    chunk(delta(0, finish_reason="stop")),
                    chunk(usage=_usage(38, 12, prompt_tokens_details={"cached_tokens": 0})),
                    chunk(delta(1, content="c")), chunk(delta(1, finish_reason="length")),
                    chunk(usage=_usage(38, 2, cost=0.25)))
    result = parse_stream([body], expect_choices=2)
    usage = result.usage
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (38, 14, 52)
    assert [(u.prompt_tokens, u.completion_tokens) for u in usage.per_choice] == [
        (38, 12), (38, 2)]
    assert usage.raw["per_choice"][0]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert "cost" not in usage.raw  # only one of them said its cost
    assert result.outcome == Outcome.COMPLETED and not result.flags


@pytest.mark.parametrize("body", [
    # OpenAI: both choices finish, then one usage for the response.
    sse_body(chunk(delta(0, content="a"), delta(1, content="b")),
             chunk(delta(0, finish_reason="stop")), chunk(delta(1, finish_reason="stop")),
             chunk(usage=_usage(38, 40))),
    # A relay that repeats the final usage.
    sse_body(chunk(delta(0, content="a"), delta(1, content="b")),
             chunk(delta(0, finish_reason="stop"), delta(1, finish_reason="stop")),
             chunk(usage=_usage(38, 2)), chunk(usage=_usage(38, 40))),
    # vLLM's continuous usage stats: a running total on every chunk.
    sse_body(chunk(delta(0, content="a"), usage=_usage(38, 1)),
             chunk(delta(1, content="b"), usage=_usage(38, 2)),
             chunk(delta(0, finish_reason="stop"), usage=_usage(38, 20)),
             chunk(delta(1, finish_reason="stop"), usage=_usage(38, 40))),
])
def test_one_usage_for_the_response_is_kept_as_sent(body: bytes) -> None:
    usage = parse_stream([body], expect_choices=2).usage
    assert usage is not None and usage.per_choice == ()
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (38, 40, 78)


def test_usage_per_choice_with_costs_adds_the_costs() -> None:
    body = sse_body(chunk(delta(0, content="a"), delta(1, content="b")),
                    chunk(delta(1, finish_reason="stop")), chunk(usage=_usage(5, 1, cost=0.5)),
                    chunk(delta(0, finish_reason="stop")), chunk(usage=_usage(5, 3, cost=1)))
    usage = parse_stream([body], expect_choices=2).usage
    assert usage is not None and usage.raw["cost"] == 1.5 and usage.total_tokens == 9
