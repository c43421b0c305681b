"""One tool call split over several blocks (Anthropic) or output items (Responses).

LiteLLM's ``/v1/messages`` bridge splits one tool call into several ``tool_use``
blocks that repeat the call's id and name, each with a fragment of the arguments;
a Responses relay may do the same with several ``function_call`` items naming one
``call_id``.  The rule: a block (item) repeating the id of an earlier call continues
that call; the arguments concatenate in block order; the call is whole when its
last block stops.  One call, one tool index, announced once.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from fanout import Outcome, StreamParser, StreamResult, ToolCallDelta, parse_stream
from fanout.core.events import CoreEvent
from fanout.records import event_record
from tests.core.test_anthropic import (
    END,
    block_start,
    json_delta,
    message_delta,
    start,
    stop,
    text,
)
from tests.core.test_anthropic import parse as parse_anthropic
from tests.core.test_responses import (
    added,
    arguments,
    completed,
    created,
    item_done,
)
from tests.core.test_responses import parse as parse_responses
from tests.helpers import byte_at_a_time, every_split, random_splits

# LiteLLM's /v1/messages with one call split into three tool_use blocks (the shape of
# the issue: each block names the call's id and name and carries one fragment).
THREE_BLOCKS = b"""\
event: message_start
data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-x","content":[],"stop_reason":null,"usage":{"input_tokens":12,"output_tokens":1}}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_01","name":"lookup","input":{}}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\\"place\\": "}}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: content_block_start
data: {"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_01","name":"lookup","input":{}}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"\\"Troms\\u00f8\\", \\"uni"}}

event: content_block_stop
data: {"type":"content_block_stop","index":1}

event: content_block_start
data: {"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_01","name":"lookup","input":{}}}

event: content_block_delta
data: {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"ts\\": \\"metric\\"}"}}

event: content_block_stop
data: {"type":"content_block_stop","index":2}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":30}}

event: message_stop
data: {"type":"message_stop"}

"""

# The same on /v1/responses: three function_call items (three item ids, three output
# indexes) naming one call_id, each with a fragment; response.completed lists them.
_ITEMS = [("fc_a", '{"place": '), ("fc_b", '"Troms\\u00f8", "uni'), ("fc_c", 'ts": "metric"}')]
THREE_ITEMS = b"".join(
    [b'data: {"type":"response.created","response":{"id":"resp_1","model":"gpt-x",'
     b'"status":"in_progress","output":[]}}\n\n']
    + [(f'data: {{"type":"response.output_item.added","output_index":{n},"item":'
        f'{{"id":"{item}","type":"function_call","call_id":"call_7","name":"lookup",'
        f'"arguments":""}}}}\n\n'
        f'data: {{"type":"response.function_call_arguments.delta","item_id":"{item}",'
        f'"output_index":{n},"delta":{json.dumps(piece)}}}\n\n'
        f'data: {{"type":"response.output_item.done","output_index":{n},"item":'
        f'{{"id":"{item}","type":"function_call","call_id":"call_7","name":"lookup",'
        f'"arguments":{json.dumps(piece)}}}}}\n\n').encode()
       for n, (item, piece) in enumerate(_ITEMS)]
    + [('data: {"type":"response.completed","response":{"id":"resp_1","model":"gpt-x",'
        '"status":"completed","output":['
        + ",".join(f'{{"id":"{item}","type":"function_call","call_id":"call_7",'
                   f'"name":"lookup","arguments":{json.dumps(piece)}}}'
                   for item, piece in _ITEMS)
        + '],"usage":{"input_tokens":12,"output_tokens":30,"total_tokens":42}}}\n\n').encode()])

WHOLE = {"place": "Tromsø", "units": "metric"}


def splits(raw: bytes) -> list[list[bytes]]:
    return [[raw], byte_at_a_time(raw), *random_splits(raw, seed=19)]


def one_call(result: StreamResult, call_id: str) -> None:
    assert result.outcome is Outcome.COMPLETED
    assert (result.skipped_frames, result.ignored_events) == (0, 0)
    [call] = result.choices[0].tool_calls
    assert (call.index, call.id, call.name, call.parsed, call.parse_error) == (
        0, call_id, "lookup", WHOLE, None)
    assert result.choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize(("raw", "api", "call_id"), [(THREE_BLOCKS, "anthropic", "toolu_01"),
                                                     (THREE_ITEMS, "responses", "call_7")])
def test_one_call_in_three_parts_is_one_call_on_every_split(raw: bytes, api: str,
                                                            call_id: str) -> None:
    results = [parse_stream(chunks, api=api) for chunks in splits(raw)]
    one_call(results[0], call_id)
    assert all(r == results[0] for r in results)


def test_every_cut_of_the_three_blocks_gives_the_same_call() -> None:
    results = [parse_stream(chunks, api="anthropic") for chunks in every_split(THREE_BLOCKS)]
    assert all(r == results[0] for r in results)
    one_call(results[0], "toolu_01")


def tool_events(raw: bytes, api: str) -> list[ToolCallDelta]:
    parser = StreamParser(api=api, stream="s")
    events: list[CoreEvent] = []
    for chunk in byte_at_a_time(raw):
        events.extend(parser.feed(chunk))
    return [e for e in events if isinstance(e, ToolCallDelta)]


@pytest.mark.parametrize(("raw", "api"), [(THREE_BLOCKS, "anthropic"),
                                          (THREE_ITEMS, "responses")])
def test_the_events_a_consumer_sees_announce_one_call(raw: bytes, api: str) -> None:
    events = tool_events(raw, api)
    records = [event_record(e) for e in events]
    assert {r["tool_index"] for r in records} == {0}  # what compare --json and serve relay
    assert [r["id"] is not None for r in records].count(True) == 1  # announced once
    assert [r["name"] for r in records if r["name"]] == ["lookup"]
    assert json.loads("".join(r["arguments"] for r in records)) == WHOLE


# ---------------------------------------------------------------- Anthropic: the class

def tool(index: int, call_id: str = "t1", name: str = "lookup", **fields: Any) -> dict[str, Any]:
    return block_start(index, "tool_use", id=call_id, name=name, input=fields.pop("input", {}),
                       **fields)


def calls(result: StreamResult) -> list[tuple[int, str | None, str | None, Any]]:
    return [(c.index, c.id, c.name, c.parsed) for c in result.choices[0].tool_calls]


def test_a_first_block_without_a_fragment_gives_no_empty_object_before_the_rest() -> None:
    # the 9 blocks: the first names the call, the next 8 carry a fragment each
    pieces = ['{"pl', 'ace"', ': "Os', 'lo", ', '"days', '": ', '3', "}"]
    frames = [start(), tool(0), stop(0)]
    for n, piece in enumerate(pieces, 1):
        frames += [tool(n), json_delta(n, piece), stop(n)]
    result = parse_anthropic(*frames, message_delta("tool_use"), END)
    assert calls(result) == [(0, "t1", "lookup", {"place": "Oslo", "days": 3})]
    assert (result.skipped_frames, result.ignored_events) == (0, 0)


def test_a_call_whose_blocks_carry_nothing_has_the_empty_input_once() -> None:
    result = parse_anthropic(start(), tool(0), stop(0), tool(1), stop(1),
                             message_delta("tool_use"), END)
    [call] = result.choices[0].tool_calls
    assert (call.arguments, call.parsed) == ("{}", {})


def test_interleaved_blocks_of_two_split_calls_make_two_calls() -> None:
    frames = [start(), tool(0, "ta", "a"), json_delta(0, '{"x": '), stop(0),
              tool(1, "tb", "b"), json_delta(1, '{"y": '), stop(1),
              tool(2, "ta", "a"), json_delta(2, "1}"), stop(2),
              tool(3, "tb", "b"), json_delta(3, "2}"), stop(3), message_delta("tool_use"), END]
    result = parse_anthropic(*frames)
    assert calls(result) == [(0, "ta", "a", {"x": 1}), (1, "tb", "b", {"y": 2})]
    assert result.skipped_frames == 0


def test_two_open_blocks_of_one_call_concatenate_in_block_order() -> None:
    frames = [start(), tool(0), tool(1), json_delta(1, '2]'), json_delta(0, "[1, "),
              stop(0), stop(1), message_delta("tool_use"), END]
    parser = StreamParser(api="anthropic")
    fragments = [e.arguments for e in parser.feed(serialize_frames(frames))
                 if isinstance(e, ToolCallDelta) and e.arguments]
    assert fragments == ["[1, ", "2]"]
    assert calls(parser.result()) == [(0, "t1", "lookup", [1, 2])]


def test_a_block_under_another_name_continues_the_call_and_says_so() -> None:
    frames = [start(), tool(0, name="lookup"), json_delta(0, '{"a": '), stop(0),
              tool(1, name="fetch"), json_delta(1, "1}"), stop(1), message_delta("tool_use"),
              END]
    result = parse_anthropic(*frames)
    assert calls(result) == [(0, "t1", "lookup", {"a": 1})]
    assert result.skip_reasons == ("tool_use block 1 repeats the id of tool call 0 under "
                                   "another name ('fetch'): the call keeps its first name "
                                   "('lookup')",)


def test_a_block_naming_a_call_that_had_no_name_names_it() -> None:
    frames = [start(), tool(0, name=""), json_delta(0, '{"a": '), stop(0),
              tool(1, name="lookup"), json_delta(1, "1}"), stop(1),
              message_delta("tool_use"), END]
    result = parse_anthropic(*frames)
    assert calls(result) == [(0, "t1", "lookup", {"a": 1})]
    assert result.skipped_frames == 0


def test_a_call_reopened_after_its_block_stopped_is_read_again_when_the_next_stops() -> None:
    parser = StreamParser(api="anthropic")
    parser.feed(serialize_frames([start(), tool(0), json_delta(0, '{"a": "b'), stop(0)]))
    [early] = parser.result().choices[0].tool_calls  # a live view's snapshot
    assert early.parse_error is not None and early.parsed is None
    events = parser.feed(serialize_frames([tool(1), json_delta(1, 'c"}'), stop(1),
                                           message_delta("tool_use"), END]))
    assert [(e.tool_index, e.id, e.name, e.arguments) for e in events
            if isinstance(e, ToolCallDelta)] == [(0, None, None, 'c"}')]
    [call] = parser.result().choices[0].tool_calls
    assert (call.parsed, call.parse_error) == ({"a": "bc"}, None)


def test_a_block_repeating_the_whole_call_adds_nothing_one_that_goes_on_continues() -> None:
    repeated = parse_anthropic(start(), tool(0), json_delta(0, '{"a": 1}'), stop(0),
                               tool(1), json_delta(1, '{"a": '), json_delta(1, "1}"), stop(1),
                               message_delta("tool_use"), END)
    assert calls(repeated) == [(0, "t1", "lookup", {"a": 1})]
    assert (repeated.ignored_events, repeated.skipped_frames) == (1, 0)
    # held while it repeats the call's start, given (in order) once it does not
    going_on = parse_anthropic(start(), tool(0), json_delta(0, "1"), stop(0),
                               tool(1), json_delta(1, "1"), json_delta(1, "2"), stop(1),
                               message_delta("tool_use"), END)
    assert [c.arguments for c in going_on.choices[0].tool_calls] == ["112"]


def test_a_whole_input_repeated_by_a_later_block_is_one_call() -> None:
    result = parse_anthropic(start(), tool(0, input={"a": 1}), stop(0),
                             tool(3, input={"a": 1}), stop(3), message_delta("tool_use"), END)
    assert calls(result) == [(0, "t1", "lookup", {"a": 1})]
    assert result.ignored_events == 1


def test_a_block_continuing_a_call_after_message_delta_is_skipped() -> None:
    result = parse_anthropic(start(), tool(0), json_delta(0, "{}"), stop(0),
                             message_delta("tool_use"), tool(1), json_delta(1, "[2]"), stop(1),
                             END)
    assert calls(result) == [(0, "t1", "lookup", {})]
    assert result.skip_reasons[0] == ("tool_use block 1 continues tool call 0 after "
                                      "message_delta ended the content")


def test_text_between_the_blocks_of_a_call_stays_text() -> None:
    result = parse_anthropic(start(), tool(0), json_delta(0, "[1,"), stop(0),
                             block_start(1), text(1, "hm"), stop(1),
                             tool(2), json_delta(2, " 2]"), stop(2), message_delta("tool_use"),
                             END)
    assert (result.text, calls(result)) == ("hm", [(0, "t1", "lookup", [1, 2])])


# ---------------------------------------------------------------- Responses: the class

def fc(position: int, item_id: str, call_id: str = "call_1", name: str = "lookup",
       args: str = "") -> dict[str, Any]:
    return added(position, "function_call", item_id, call_id=call_id, name=name,
                 arguments=args)


def fc_done(position: int, item_id: str, call_id: str = "call_1", name: str = "lookup",
            args: str = "") -> dict[str, Any]:
    return item_done(position, "function_call", item_id=item_id, call_id=call_id, name=name,
                     arguments=args)


def test_responses_interleaved_items_of_two_split_calls_make_two_calls() -> None:
    frames = [created(), fc(0, "i0", "ca", "a"), arguments('{"x": ', 0, "i0"),
              fc_done(0, "i0", "ca", "a", '{"x": '),
              fc(1, "i1", "cb", "b"), arguments('{"y": ', 1, "i1"),
              fc(2, "i2", "ca", "a"), arguments("1}", 2, "i2"),
              fc_done(1, "i1", "cb", "b", '{"y": '), fc_done(2, "i2", "ca", "a", "1}"),
              fc(3, "i3", "cb", "b"), arguments("2}", 3, "i3"), fc_done(3, "i3", "cb", "b", "2}"),
              completed()]
    result = parse_responses(*frames)
    assert calls(result) == [(0, "ca", "a", {"x": 1}), (1, "cb", "b", {"y": 2})]
    assert (result.skipped_frames, result.ignored_events) == (0, 0)


def test_responses_an_item_under_another_name_continues_the_call_and_says_so() -> None:
    frames = [created(), fc(0, "i0"), arguments('{"a": ', 0, "i0"), fc_done(0, "i0",
                                                                            args='{"a": '),
              fc(1, "i1", name="fetch"), arguments("1}", 1, "i1"),
              fc_done(1, "i1", name="fetch", args="1}"), completed()]
    result = parse_responses(*frames)
    assert calls(result) == [(0, "call_1", "lookup", {"a": 1})]
    assert result.skip_reasons == ("function_call item 'i1' repeats the call_id of tool call 0 "
                                   "under another name ('fetch'): the call keeps its first "
                                   "name ('lookup')",)


def test_responses_an_item_seen_only_at_its_end_continues_the_call() -> None:
    frames = [created(), fc(0, "i0"), arguments('{"a": ', 0, "i0"),
              fc_done(0, "i0", args='{"a": '), fc_done(1, "i1", args="1}"), completed()]
    result = parse_responses(*frames)
    assert calls(result) == [(0, "call_1", "lookup", {"a": 1})]
    assert (result.skipped_frames, result.ignored_events) == (0, 0)


def test_responses_an_item_repeating_the_whole_call_adds_nothing() -> None:
    frames = [created(), fc(0, "i0"), arguments('{"a": 1}', 0, "i0"),
              fc_done(0, "i0", args='{"a": 1}'), fc(1, "i1", args='{"a": 1}'),
              fc_done(1, "i1", args='{"a": 1}'), completed()]
    result = parse_responses(*frames)
    assert calls(result) == [(0, "call_1", "lookup", {"a": 1})]
    assert result.ignored_events == 1


def serialize_frames(frames: list[Any]) -> bytes:
    return b"".join(f"event: {f['type']}\ndata: {json.dumps(f)}\n\n".encode() for f in frames)
