"""Events and results as JSON-ready records: the shapes of ``compare --json``, results
files and the service, shared by every front end (public: ``fanout.records``).

Every record is plain data (str, int, float, bool, None, lists, dicts) so any
JSON writer takes it.  Response headers are left out (they are the relay's,
and may carry cookies); the API key is in no event or result to begin with.
"""

from __future__ import annotations

import json
import re
from typing import Any

import attrs
import orjson

from .core.events import (
    ChoiceFinished,
    ChoiceRole,
    DoneReceived,
    ErrorReported,
    Event,
    FrameSkipped,
    ReasoningDelta,
    RefusalDelta,
    ResponseInfo,
    StreamFinished,
    StreamRetrying,
    StreamStarted,
    TextDelta,
    ThinkingBlockFinished,
    ToolCallDelta,
    UsageReported,
)
from .core.result import Flag, StreamError, StreamResult, ThinkingBlock, Timings, Usage

__all__ = ["FLAG_LABELS", "MIN_RATE_EVENTS", "MIN_RATE_SPAN", "dumps", "dumps_bytes",
           "event_record", "flag_label", "flag_labels", "metrics", "output_chars",
           "result_record", "tokens_per_second"]

# What JSON may legally carry raw but a terminal or a UTF-8 encoder must not get:
# DEL and the C1 controls (U+009B is an 8-bit CSI), the bidi controls (U+202E turns
# text around), the line and paragraph separators, and lone surrogates (valid JSON
# escapes, but no UTF-8 encoder takes them raw).  C0 controls json escapes itself.
_UNSAFE = re.compile("[\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e"
                     "\u2066-\u2069\ud800-\udfff]")
_UNSAFE_UTF8 = re.compile(rb"\x7f|\xc2[\x80-\x9f]|\xd8\x9c|\xe2\x80[\x8e\x8f\xa8-\xae]"
                          rb"|\xe2\x81[\xa6-\xa9]")


def _escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def dumps(value: Any) -> str:
    """``value`` as one line of JSON that is valid UTF-8 and safe to print to a terminal.

    Every control character, bidi control, line separator and lone surrogate
    in a string is written as a ``\\uXXXX`` escape: the text round-trips
    exactly (``json.loads`` gives back the same string, lone surrogates
    included), and nothing in it can move a cursor, reorder a line or fail to
    encode.  The one writer for ``--json`` lines, results files and the service.
    """
    return _UNSAFE.sub(_escape, json.dumps(value, ensure_ascii=False))


def dumps_bytes(value: Any) -> bytes:
    """``dumps`` as UTF-8 with a newline, the fast way when nothing needs escaping."""
    try:
        data = orjson.dumps(value, option=orjson.OPT_APPEND_NEWLINE)
    except TypeError:  # lone surrogates, integers past 64 bits: the careful path
        return (dumps(value) + "\n").encode()
    if _UNSAFE_UTF8.search(data) is None:
        return data
    return (dumps(value) + "\n").encode()

_TYPES: dict[type[Any], str] = {
    ResponseInfo: "response",
    ChoiceRole: "role",
    TextDelta: "text",
    ReasoningDelta: "reasoning",
    RefusalDelta: "refusal",
    ToolCallDelta: "tool_call",
    ChoiceFinished: "finish",
    ThinkingBlockFinished: "thinking_block",
    UsageReported: "usage",
    ErrorReported: "error",
    FrameSkipped: "skipped",
    DoneReceived: "done_marker",  # `[DONE]` (or the dialect's terminal event) arrived;
    # whether the stream completed: `result`
    StreamStarted: "started",
    StreamRetrying: "retrying",
    StreamFinished: "result",
}


#: The fields an event type's record copies as they are, by type (looked up once).
_FIELDS: dict[type[Any], tuple[str, ...]] = {}


def event_record(event: Event) -> dict[str, Any]:
    """``{"type": ..., "stream": ..., <the event's fields>, "content_key": ...}``.

    ``type`` is always the record's type (``tool_call``, ``error``, ...): an inner
    type is ``tool_type`` or ``error_type``.  ``done_marker`` says ``[DONE]`` (or the
    dialect's terminal event: ``response.completed`` / ``response.incomplete``,
    ``message_stop``) arrived, nothing more (a cut stream gets one too); a
    ``StreamFinished`` becomes the stream's ``result`` record, which says how it ended.
    """
    if isinstance(event, StreamFinished):
        return {"type": "result", **result_record(event.result)}
    record: dict[str, Any] = {"type": _TYPES[type(event)], "stream": event.stream}
    if isinstance(event, UsageReported):
        record.update(_usage(event.usage) or {})
    elif isinstance(event, ErrorReported):
        error = event.error  # `type` is the record's: the error's own type is error_type
        record.update(message=error.message, error_type=error.type, code=error.code,
                      status=error.status)
    elif isinstance(event, ToolCallDelta):
        record.update(choice=event.choice, tool_index=event.tool_index, id=event.id,
                      tool_type=event.type, name=event.name, arguments=event.arguments)
    elif isinstance(event, StreamRetrying):
        record.update(attempt=event.attempt, wait=event.wait, error=_error(event.error))
    elif isinstance(event, StreamStarted):
        record.update(attempt=event.attempt, status=event.status)
    elif isinstance(event, FrameSkipped):
        record.update(reason=event.reason, data=event.data[:200])
    elif isinstance(event, ThinkingBlockFinished):
        record.update(choice=event.choice, **_thinking(event.block))
    else:
        names = _FIELDS.get(type(event))
        if names is None:
            names = _FIELDS[type(event)] = tuple(
                field.name for field in attrs.fields(type(event))
                if field.name not in ("stream", "content_key"))
        for name in names:
            record[name] = getattr(event, name)
    record["content_key"] = event.content_key
    return record


def result_record(result: StreamResult) -> dict[str, Any]:
    """A stream's whole result as plain data, with its metrics."""
    return {
        "stream": result.stream,
        "outcome": str(result.outcome),
        "reason": result.reason,
        "flags": [str(flag) for flag in result.flags],
        "flag_labels": flag_labels(result),
        "others_running": result.others_running,
        "content_key": result.content_key,
        "model": result.model,
        "response_id": result.response_id,
        "status": result.status,
        "timed_out": result.timed_out,
        "text": result.text,
        "choices": [
            {
                "index": choice.index,
                "text": choice.text,
                "reasoning": choice.reasoning,
                "refusal": choice.refusal,
                "finish_reason": choice.finish_reason,
                "native_finish_reason": choice.native_finish_reason,
                "thinking": [_thinking(block) for block in choice.thinking],
                "tool_calls": [
                    {
                        "index": call.index, "id": call.id, "type": call.type,
                        "name": call.name, "arguments": call.arguments,
                        "parsed": call.parsed,
                        "valid_json": call.parse_error is None,
                        "parse_error": call.parse_error,
                        "schema_valid": None if call.schema_errors is None
                        else not call.schema_errors,
                        "schema_errors": list(call.schema_errors or ()),
                    }
                    for call in choice.tool_calls
                ],
            }
            for choice in result.choices
        ],
        "usage": _usage(result.usage),
        "error": _error(result.error),
        "attempts": [
            {"number": a.number, "status": a.status, "error": _error(a.error),
             "waited": a.waited, "delivered_content": a.delivered_content}
            for a in result.attempts
        ],
        "skipped_frames": result.skipped_frames,
        "skip_reasons": list(result.skip_reasons),
        "ignored_events": result.ignored_events,
        "pending_event": result.pending_event,
        "all_choices_finished": result.all_choices_finished,
        "metrics": metrics(result),
    }


#: The one vocabulary for flags: how each ``Flag`` code reads in every view (compare's
#: notes, ``fanout report``, the HTML report, the service's records and the page).
#: ``flag_label`` puts the numbers in when the result has them.
FLAG_LABELS: dict[Flag, str] = {
    Flag.EMPTY_ANSWER: "empty answer",
    Flag.UNFINISHED_CHOICE: "a choice unfinished",
    Flag.MISSING_CHOICES: "fewer choices than asked",
    Flag.MISSING_USAGE: "missing usage",
    Flag.NO_FINISH_REASON: "no finish reason",
    Flag.NOT_STREAMED: "not streamed",
    Flag.SKIPPED_FRAMES: "frames skipped",
}

#: Tokens per second needs this many content events over this many seconds: fewer
#: (one burst, a cached answer) measure the network, not the model.
MIN_RATE_EVENTS = 4
MIN_RATE_SPAN = 0.25


def flag_label(flag: Flag, result: StreamResult) -> str:
    """How ``flag`` reads for ``result``: ``FLAG_LABELS``'s words, with the numbers
    the result holds ("choice 1 unfinished", "3 frames skipped", "2 choices came")."""
    if flag == Flag.UNFINISHED_CHOICE:
        unfinished = [str(c.index) for c in result.choices if c.finish_reason is None]
        if unfinished:
            return f"choice{'s' if len(unfinished) > 1 else ''} {', '.join(unfinished)} unfinished"
    elif flag == Flag.MISSING_CHOICES:
        came = len(result.choices)
        return f"fewer choices than asked ({came} came)"
    elif flag == Flag.SKIPPED_FRAMES:
        count = result.skipped_frames
        return f"{count} frame{'s' if count != 1 else ''} skipped"
    return FLAG_LABELS.get(flag, str(flag).replace("_", " "))


def flag_labels(result: StreamResult) -> list[str]:
    """``flag_label`` of each of the result's flags, in order."""
    return [flag_label(flag, result) for flag in result.flags]


def output_chars(result: StreamResult) -> int:
    """Characters the model produced, in every choice: text, reasoning, refusal and
    tool-call arguments (a tool-calling answer is not 0 characters)."""
    return sum(len(c.text) + len(c.reasoning) + len(c.refusal)
               + sum(len(call.arguments) for call in c.tool_calls)
               for c in result.choices)


def metrics(result: StreamResult) -> dict[str, Any]:
    """Latency and throughput of one stream, in seconds (``None`` when unknown): the
    one computation every view shows.

    ``e2e_latency`` is the stream's time: the whole stream, retries and their
    waits included, from the first request being sent to the end
    (``Timings.e2e``); ``retrying`` is the part of it before the last attempt.
    The rest describe the last attempt, from its request being sent: ``ttfb``
    (first body byte), ``ttft`` (first token of any kind, reasoning included),
    ``ttfc`` (first answer text).  ``queue_wait``: for a concurrency slot.
    ``generation_time``: first token to last event.  ``gap_*``: between
    events.  ``chunks``: SSE events.  ``output_chars``: see ``output_chars``.
    ``tokens_per_second``: see ``tokens_per_second``.
    """
    t = result.timings or Timings()
    rate, estimated = tokens_per_second(result)
    sent = t.request_sent
    return {
        "queue_wait": t.queued,
        "ttfb": _since(t.first_byte, sent),
        "ttft": t.ttft,
        "ttfc": t.ttfc,
        "e2e_latency": t.e2e,
        "retrying": t.retrying,
        "generation_time": _since(t.last_event, t.first_content, floor=0.0),
        "gap_max": t.gap_max,
        "gap_p95": t.gap_p95,
        "chunks": result.events,
        "output_chars": output_chars(result),
        "tokens_per_second": rate,
        "tokens_estimated": estimated,
    }


def tokens_per_second(result: StreamResult) -> tuple[float | None, bool]:
    """Output tokens per second of generation, and whether the count is estimated.

    The count is ``usage.completion_tokens`` when the relay reported it, else
    the number of content deltas (OpenAI-style servers send about one token a
    chunk; the role chunk, the finish-only chunk, usage and ``[DONE]`` carry
    none): then the second value is True.  Generation time runs from the
    first content to the last event.  ``None`` with fewer than
    ``MIN_RATE_EVENTS`` content events or less than ``MIN_RATE_SPAN`` seconds
    of generation (too little to measure a rate).
    """
    t = result.timings
    usage = result.usage
    if usage is not None and usage.completion_tokens is not None:
        tokens, estimated = usage.completion_tokens, False
    else:
        tokens, estimated = result.content_events, True
    if t is None or t.first_content is None or t.last_event is None:
        return None, estimated
    seconds = t.last_event - t.first_content
    if (seconds < MIN_RATE_SPAN or tokens <= 1
            or result.content_events < MIN_RATE_EVENTS):
        return None, estimated
    return (tokens - 1) / seconds, estimated  # the first token arrives at the start


def _since(end: float | None, start: float | None, *, floor: float | None = None
           ) -> float | None:
    if end is None or start is None:
        return None
    return end - start if floor is None else max(floor, end - start)


def _usage(usage: Usage | None) -> dict[str, Any] | None:
    if usage is None:
        return None
    counts: dict[str, Any] = {"prompt_tokens": usage.prompt_tokens,
                              "completion_tokens": usage.completion_tokens,
                              "total_tokens": usage.total_tokens}
    if usage.per_choice:  # the server sent usage per choice: these are their sums
        counts["per_choice"] = [_usage(part) for part in usage.per_choice]
    return counts


def _thinking(block: ThinkingBlock) -> dict[str, Any]:
    # An Anthropic thinking block as the next request must send it back.
    return {"index": block.index, "thinking": block.thinking, "signature": block.signature,
            "redacted": block.redacted, "data": block.data}


def _error(error: StreamError | None) -> dict[str, Any] | None:
    if error is None:
        return None
    return {"message": error.message, "type": error.type, "code": error.code,
            "status": error.status}
