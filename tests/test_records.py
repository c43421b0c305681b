"""Records: what --json, results files and the service hold of a result."""

from __future__ import annotations

import attrs

from fanout import Timings, parse_stream
from fanout.records import result_record, tokens_per_second
from tests.helpers import chunk, delta, sse_body


def test_estimated_rate_counts_only_chunks_that_carried_content() -> None:
    # role chunk, 5 content chunks, a finish-only chunk, [DONE]: 5 tokens, not 7
    body = sse_body(chunk(delta(role="assistant", content="")),
                    *(chunk(delta(content=f"t{i}")) for i in range(5)), chunk(delta(0, "stop")))
    result = attrs.evolve(parse_stream([body]),
                          timings=Timings(request_sent=0.0, first_content=1.0, last_event=2.0))
    assert (result.events, result.content_events) == (8, 5)
    rate, estimated = tokens_per_second(result)
    assert (rate, estimated) == (4.0, True)  # (5 - 1) tokens after the first, in 1 s


def test_the_record_carries_reason_and_flags() -> None:
    cut = result_record(parse_stream([sse_body(chunk(delta(content="a")))]))
    assert (cut["outcome"], cut["reason"], cut["flags"]) == (
        "truncated", "[DONE] arrived but no choice had a finish reason (the server cut the stream)",
        [])
    empty = result_record(parse_stream([sse_body(chunk(delta(0, "stop")))]))
    assert (empty["outcome"], empty["reason"], empty["flags"]) == (
        "completed", None, ["empty_answer"])
