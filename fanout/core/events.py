"""Normalized events: what every stream turns its bytes into.

Each event is a small frozen value.  ``stream`` is the caller's name for the
stream and ``content_key`` a stable hash of what was asked; both are ``""``
when the core runs on its own (a capture, a test).  Content events
(``TextDelta``, ``ReasoningDelta``, ``RefusalDelta``, ``ToolCallDelta``) are the
ones that count for time-to-first-token; ``CONTENT_EVENTS`` lists them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeAlias

import attrs

from .result import StreamError, StreamResult, ThinkingBlock, Usage

__all__ = [
    "CONTENT_EVENTS",
    "ChoiceFinished",
    "ChoiceRole",
    "ContentEvent",
    "CoreEvent",
    "DoneReceived",
    "ErrorReported",
    "Event",
    "FrameSkipped",
    "ReasoningDelta",
    "RefusalDelta",
    "ResponseInfo",
    "StreamFinished",
    "StreamRetrying",
    "StreamStarted",
    "TextDelta",
    "ThinkingBlockFinished",
    "ToolCallDelta",
    "UsageReported",
]


@attrs.frozen(slots=True)
class ResponseInfo:
    """The response's ``id``, ``model`` or ``system_fingerprint`` as first seen, or changed."""

    id: str | None
    model: str | None
    system_fingerprint: str | None
    stream: str = ""
    content_key: str = ""


@attrs.frozen(slots=True)
class ChoiceRole:
    """The first ``role`` a choice announced (repeats are not reported again)."""

    choice: int
    role: str
    stream: str = ""
    content_key: str = ""


@attrs.frozen(slots=True)
class TextDelta:
    """A fragment of a choice's ``content``, exactly as sent (never empty)."""

    choice: int
    text: str
    stream: str = ""
    content_key: str = ""


@attrs.frozen(slots=True)
class ReasoningDelta:
    """A fragment of ``reasoning_content`` (or ``reasoning``, as some relays name it)."""

    choice: int
    text: str
    stream: str = ""
    content_key: str = ""


@attrs.frozen(slots=True)
class RefusalDelta:
    """A fragment of a choice's ``refusal``."""

    choice: int
    text: str
    stream: str = ""
    content_key: str = ""


@attrs.frozen(slots=True)
class ToolCallDelta:
    """One ``delta.tool_calls[j]`` entry.

    ``tool_index`` is ``None`` when the relay sent no ``index`` (the accumulator
    then matches by ``id``, else continues the last open call).  ``arguments``
    is this delta's fragment, ``""`` when it carried none.
    """

    choice: int
    tool_index: int | None
    id: str | None
    type: str | None
    name: str | None
    arguments: str
    stream: str = ""
    content_key: str = ""


@attrs.frozen(slots=True)
class ChoiceFinished:
    """A choice's ``finish_reason``, exactly as sent (``length`` is not ``stop``).

    For the Responses and Anthropic dialects ``finish_reason`` is mapped to the
    chat vocabulary and ``native_finish_reason`` keeps the dialect's own word
    (``end_turn``, ``max_output_tokens``); it is ``None`` for a chat stream.
    """

    choice: int
    finish_reason: str
    stream: str = ""
    content_key: str = ""
    native_finish_reason: str | None = None


@attrs.frozen(slots=True)
class ThinkingBlockFinished:
    """An Anthropic ``thinking`` / ``redacted_thinking`` block ended (``content_block_stop``).

    Its text already arrived as ``ReasoningDelta`` events; this carries the
    block whole with its ``signature`` (or the opaque data of a redacted block),
    which a client needs to continue the conversation.
    """

    choice: int
    block: ThinkingBlock
    stream: str = ""
    content_key: str = ""


@attrs.frozen(slots=True)
class UsageReported:
    """A ``usage`` object.  A later one replaces an earlier one; ``null`` is not reported."""

    usage: Usage
    stream: str = ""
    content_key: str = ""


@attrs.frozen(slots=True)
class ErrorReported:
    """An error: an in-stream ``error`` payload, ``event: error``, or an HTTP status."""

    error: StreamError
    stream: str = ""
    content_key: str = ""


@attrs.frozen(slots=True)
class FrameSkipped:
    """Resilient mode: a frame that was not a JSON object was skipped.

    ``data`` holds the frame's first 200 characters.
    """

    reason: str
    data: str
    stream: str = ""
    content_key: str = ""


@attrs.frozen(slots=True)
class DoneReceived:
    """``data: [DONE]`` arrived, or the dialect's terminal event (``response.completed``
    or ``response.incomplete``; ``message_stop``): the stream is complete."""

    stream: str = ""
    content_key: str = ""


@attrs.frozen(slots=True)
class StreamStarted:
    """An HTTP attempt got its response headers (one per attempt).

    ``headers`` keeps the response headers of interest (content type, request
    ids, rate-limit and retry headers), lower-cased.
    """

    attempt: int
    status: int
    headers: Mapping[str, str] = attrs.field(factory=dict)
    stream: str = ""
    content_key: str = ""


@attrs.frozen(slots=True)
class StreamRetrying:
    """An attempt failed before any content; the next one starts after ``wait`` seconds.

    A consumer should drop any partial output it showed for this stream
    (there is none by construction: retries happen only before content).
    """

    attempt: int
    wait: float
    error: StreamError
    stream: str = ""
    content_key: str = ""


@attrs.frozen(slots=True)
class StreamFinished:
    """The stream's last event, exactly one per stream, whatever happened."""

    result: StreamResult
    stream: str = ""
    content_key: str = ""


CoreEvent: TypeAlias = (
    ResponseInfo
    | ChoiceRole
    | TextDelta
    | ReasoningDelta
    | RefusalDelta
    | ToolCallDelta
    | ChoiceFinished
    | ThinkingBlockFinished
    | UsageReported
    | ErrorReported
    | FrameSkipped
    | DoneReceived
)
"""Any event the sans-I/O core produces."""

ContentEvent: TypeAlias = TextDelta | ReasoningDelta | RefusalDelta | ToolCallDelta
"""The events that count for time-to-first-token.  A union: ``isinstance(event,
ContentEvent)`` works at run time and narrows in a type checker, and so does
``match event: case TextDelta() | ReasoningDelta(): ...``."""

CONTENT_EVENTS: tuple[type[TextDelta], type[ReasoningDelta], type[RefusalDelta],
                      type[ToolCallDelta]] = (
    TextDelta,
    ReasoningDelta,
    RefusalDelta,
    ToolCallDelta,
)
"""``ContentEvent``'s members as a tuple, for ``isinstance(event, CONTENT_EVENTS)``."""

Event: TypeAlias = CoreEvent | StreamStarted | StreamRetrying | StreamFinished
"""Any event a fan-out delivers."""
