"""One stream's whole sans-I/O pipeline: bytes → SSE events → normalized events → result.

``StreamParser`` is what the I/O layer drives (one per stream attempt) and
what ``parse_stream`` runs over a finished byte sequence.  It owns one
``SSEDecoder``, one interpreter of the stream's dialect (``api``: chat
completions, the Responses API, Anthropic Messages; see ``dialects.py``) and
one ``Accumulator``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, final

from .._exceptions import EventTooLarge, MalformedFrame, ProtocolError, ResponseTooLarge
from . import _json
from .accumulate import Accumulator
from .chat import MAX_CHOICES, MAX_TOOL_CALLS, error_from_response
from .dialects import body_events, make_interpreter, terminal_event
from .events import CoreEvent, DoneReceived, ErrorReported
from .redact import Redactor
from .result import Attempt, Outcome, StreamError, StreamResult, Timings
from .sse import DEFAULT_MAX_EVENT_SIZE, ServerSentEvent, SSEDecoder

__all__ = ["StreamParser", "parse_stream"]


@final
class StreamParser:
    """Feed a response body in pieces, get normalized events, then a result.

    ``feed(data)`` returns the events ``data`` completed, already folded into
    the accumulator.  ``close()`` marks the end of the body.  ``result()`` may
    be called at any time and never loses output already received.

    When the parser stops early, the error is recorded (outcome ``error``),
    later input is ignored, and the output received so far stays in
    ``result()``.  It stops when an event passes ``max_event_size``
    characters or the body passes ``max_response_bytes`` (resilient mode: an
    ``ErrorReported`` event is returned; strict mode: ``EventTooLarge`` /
    ``ResponseTooLarge`` is raised), and in strict mode at the first malformed
    frame (``MalformedFrame`` is raised).  In resilient mode a malformed frame
    is skipped, counted and reported as ``FrameSkipped``.

    The parser is where server-supplied text enters fanout, so it is where
    ``secrets`` (the API key) are redacted: from every event's data, every
    error it records (``fail``, ``fail_http``) and every header set passed
    through ``headers()``.  ``require_finish_reason``, ``expect_choices``
    and ``expect_usage`` go to the ``Accumulator`` (the outcome and flags);
    ``max_choices`` / ``max_tool_calls`` to the interpreter (the caps).

    ``api`` is the stream's dialect: ``"chat"`` (the default), ``"responses"``
    or ``"anthropic"`` (any other name is a ``ValueError``).  Every other
    argument means the same for each; ``done`` is the dialect's terminal event
    (``[DONE]``, ``response.completed`` / ``response.incomplete``,
    ``message_stop``), and so are the reasons a truncated result gives.
    """

    __slots__ = (
        "_accumulator",
        "_api",
        "_closed",
        "_decoder",
        "_fold",
        "_interpret_all",
        "_interpreter",
        "_redactor",
        "_sse_events",
        "_stopped",
        "max_response_bytes",
        "status",
        "strict",
    )

    def __init__(
        self,
        *,
        strict: bool = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
        max_event_size: int = DEFAULT_MAX_EVENT_SIZE,
        max_response_bytes: int | None = None,
        stream: str = "",
        content_key: str = "",
        secrets: Iterable[str | None] = (),
        require_finish_reason: bool = True,
        expect_choices: int = 1,
        expect_usage: bool = False,
        max_choices: int = MAX_CHOICES,
        max_tool_calls: int = MAX_TOOL_CALLS,
        api: str = "chat",
    ) -> None:
        terminal = terminal_event(api)  # an unknown api fails here, before anything is built
        self._api = api
        self.strict = strict
        self.max_response_bytes = max_response_bytes
        #: The HTTP status the body came with, when the caller knows it.
        self.status: int | None = None
        self._redactor = Redactor(secrets)
        self._decoder = SSEDecoder(max_event_size=max_event_size)
        self._decoder._pairs = api != "chat"  # the dialects read (data, name) pairs
        self._interpreter = make_interpreter(
            api, strict=strict, stream=stream, content_key=content_key, redactor=self._redactor,
            max_choices=max_choices, max_tool_calls=max_tool_calls,
        )
        self._accumulator = Accumulator(
            tools=tools, stream=stream, content_key=content_key,
            require_finish_reason=require_finish_reason, expect_choices=expect_choices,
            expect_usage=expect_usage, terminal=terminal,
        )
        self._interpret_all = self._interpreter.interpret_all
        #: Set when no one reads ``feed``'s events (``parse_stream``): the
        #: interpreter may then fold content into the accumulator unbuilt.
        self._fold: Accumulator | None = None
        self._sse_events = 0
        self._stopped = False
        self._closed = False

    @property
    def api(self) -> str:
        """The stream's dialect: ``chat``, ``responses`` or ``anthropic``."""
        return self._api

    @property
    def done(self) -> bool:
        """``[DONE]`` (or the dialect's terminal event) has arrived."""
        return self._interpreter.done

    @property
    def stopped(self) -> bool:
        """An error was recorded: further input is ignored."""
        return self._stopped

    @property
    def heard(self) -> int:
        """SSE events and comments read so far: each a sign the server is alive, content
        or not (a keep-alive comment, an event the dialect ignores such as Anthropic's
        ``ping``); bytes that complete neither do not count."""
        return self._sse_events + self._decoder.comments

    @property
    def accumulator(self) -> Accumulator:
        """The accumulator (read-only use: a live view's snapshot)."""
        return self._accumulator

    def feed(self, data: bytes) -> list[CoreEvent]:
        """Parse the next piece of the body; return the events it completed."""
        if self._stopped or not data:
            return []
        limit = self.max_response_bytes
        if limit is not None:
            size = self._decoder.bytes_fed + len(data)
            if size > limit:
                out = self.feed(data[: limit - self._decoder.bytes_fed])
                if not self._stopped:
                    out.append(self._stop(ResponseTooLarge(size, limit)))
                return out
        try:
            sse_events = self._decoder._feed_items(data)
        except EventTooLarge as exc:
            out = self._interpret(exc.events)
            out.append(self._stop(exc))
            return out
        return self._interpret(sse_events) if sse_events else []

    def close(self) -> list[CoreEvent]:
        """The body ended.  Returns the last events (none, by the SSE rules)."""
        if self._closed:
            return []
        self._closed = True
        if self._stopped:
            return []
        return self._interpret(self._decoder.close())

    @property
    def redactor(self) -> Redactor:
        """The stream's redactor (for text the I/O layer reports on its own)."""
        return self._redactor

    def headers(self, headers: Mapping[str, str]) -> dict[str, str]:
        """Response headers as they may be kept: lower-cased names, secrets redacted."""
        return self._redactor.headers({k.lower(): v for k, v in headers.items()})

    def fail(self, error: StreamError) -> ErrorReported:
        """Record an error found outside the body (an HTTP status, a transport error).

        The first error recorded is the stream's error (its text redacted).
        Returns the event for the caller to pass on.  Further input is ignored.
        """
        redact = self._redactor
        if redact:
            error = StreamError(redact.text(error.message), redact.optional(error.type),
                                redact.optional(error.code), error.status)
        event = ErrorReported(error, self._accumulator.stream, self._accumulator.content_key)
        self._accumulator.add(event)
        self._stopped = True
        return event

    def fail_http(self, status: int, body: bytes, reason: str = "", *,
                  explain: Callable[[StreamError], StreamError] | None = None
                  ) -> ErrorReported:
        """Record a non-2xx response from its status and (bounded) body; ``explain``
        may say what the error means before it is recorded (from the redacted body)."""
        self.status = status
        redact = self._redactor
        if redact:
            body = redact.text(body.decode("utf-8", "replace")).encode()
        error = error_from_response(status, body, reason)
        return self.fail(explain(error) if explain is not None else error)

    def feed_completion(self, body: bytes, content_type: str = "application/json"
                        ) -> list[CoreEvent]:
        """Parse a whole body that is not an event stream.

        A relay may answer a streaming request with one JSON ``chat.completion``
        (a Responses ``response`` object, an Anthropic ``message``, for those
        dialects): it is read as one (the result is flagged ``not_streamed``),
        and a JSON ``error`` body as an error.  Anything else (an HTML login page, plain
        text) is an error saying it is not an event stream, with an excerpt.
        """
        if self._stopped:
            return []
        self._decoder.bytes_fed += len(body)
        text = self._redactor.text(body.decode("utf-8", "replace"))
        try:
            payload: Any = _json.loads(text)
        except (ValueError, RecursionError):
            try:
                payload = _json.loads_stdlib(text)
            except (ValueError, RecursionError):
                payload = None
        accumulator = self._accumulator
        events = (body_events(self._api, payload, accumulator.stream, accumulator.content_key,
                              self._redactor)
                  if isinstance(payload, dict) else [])
        if not any(isinstance(e, DoneReceived | ErrorReported) for e in events):
            excerpt = " ".join(text.split())[:120]
            what = f"content-type {content_type}" if content_type else "no content-type"
            return [self.fail(StreamError(
                f"not an event stream ({what}): {excerpt!r}" if excerpt
                else f"not an event stream ({what}) and an empty body",
                "not_event_stream", None, self.status))]
        if any(isinstance(e, DoneReceived) for e in events):
            self._interpreter.done = True
            accumulator.not_streamed = True
        accumulator.extend(events)
        self._closed = True
        return events

    def result(
        self,
        outcome: Outcome | None = None,
        *,
        timed_out: str | None = None,
        attempts: tuple[Attempt, ...] = (),
        timings: Timings | None = None,
        reason: str | None = None,
    ) -> StreamResult:
        """The result so far.  ``outcome`` overrides the derived one; ``timed_out``,
        ``attempts``, ``timings`` and the ``reason`` for an outcome it sets are
        what only the I/O layer knows."""
        decoder = self._decoder
        return self._accumulator.result(
            reason=self._redactor.optional(reason),
            timed_out=timed_out,
            attempts=attempts,
            timings=timings,
            outcome=outcome,
            status=self.status,
            pending_event=decoder.unterminated,
            sse_events=self._sse_events,
            comments=decoder.comments,
            bytes_received=decoder.bytes_fed,
            ignored_after_done=self._interpreter.ignored_after_done,
            ignored_events=getattr(self._interpreter, "ignored_events", 0),
        )

    def _interpret(self, sse_events: Sequence[ServerSentEvent | str | bytes | tuple[Any, str]]
                   ) -> list[CoreEvent]:
        out: list[CoreEvent] = []
        if not sse_events:
            return out
        self._sse_events += len(sse_events)
        try:
            self._interpret_all(sse_events, out, self._fold)
        except MalformedFrame as exc:
            self._accumulator.extend(out)
            self._stop(exc)
            raise
        if out:
            self._accumulator.extend(out)
        return out

    def _stop(self, exc: ProtocolError) -> ErrorReported:
        code = {
            EventTooLarge: "event_too_large",
            ResponseTooLarge: "response_too_large",
            MalformedFrame: "malformed_frame",
        }.get(type(exc), "protocol_error")
        event = self.fail(StreamError(str(exc), "protocol_error", code, self.status))
        if self.strict and not isinstance(exc, MalformedFrame):
            raise exc
        return event


def parse_stream(
    chunks: Iterable[bytes],
    *,
    strict: bool = False,
    tools: Sequence[Mapping[str, Any]] | None = None,
    status: int = 200,
    max_event_size: int = DEFAULT_MAX_EVENT_SIZE,
    max_response_bytes: int | None = None,
    require_finish_reason: bool = True,
    expect_choices: int = 1,
    expect_usage: bool = False,
    secrets: Iterable[str | None] = (),
    api: str = "chat",
) -> StreamResult:
    """Parse a whole response body (a capture, a test's byte list) into its result.

    ``chunks`` are the body's bytes in the pieces they arrived in; any split
    gives the same result.  ``status`` is the HTTP status the body came with:
    a non-2xx body is read as an error response.  In strict mode a malformed
    frame raises ``MalformedFrame``; otherwise it is skipped and counted.
    ``api`` is the body's dialect.  The other keywords are ``StreamParser``'s.
    """
    parser = StreamParser(
        strict=strict,
        tools=tools,
        max_event_size=max_event_size,
        max_response_bytes=max_response_bytes,
        require_finish_reason=require_finish_reason,
        expect_choices=expect_choices,
        expect_usage=expect_usage,
        secrets=secrets,
        api=api,
    )
    if not 200 <= status < 300:
        parser.fail_http(status, b"".join(chunks))
        return parser.result()
    parser.status = status
    parser._fold = parser.accumulator  # no one reads the events: content is folded unbuilt
    for chunk in chunks:
        parser.feed(chunk)
    parser.close()
    return parser.result()
