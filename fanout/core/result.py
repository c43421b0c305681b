"""What one stream produced: plain frozen values, built by the Accumulator.

Every text field is ``""`` when nothing arrived, never ``None``.  Every field
that an upstream may or may not send (``finish_reason``, ``usage``, ``role``)
is ``None`` when it did not arrive, so "absent" and "empty" stay distinct.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

__all__ = [
    "Attempt",
    "ChoiceResult",
    "Flag",
    "Outcome",
    "StreamError",
    "StreamResult",
    "ThinkingBlock",
    "Timings",
    "ToolCall",
    "Usage",
    "added_usage",
    "relayed_cut",
    "says_cut",
]

#: A relay's words for the connection to its backend breaking (LiteLLM's
#: ``APIConnectionError ... Connection error.``, an Envoy-style ``upstream connect
#: error``, httpx's and aiohttp's exception names passed on as text).
_CUT_WORDS = re.compile(
    r"connection (?:error|reset|closed|aborted|lost|broken)|APIConnectionError|"
    r"RemoteProtocolError|ReadError|server disconnected|peer closed connection|"
    r"incomplete chunked read|upstream connect error|premature(?:ly)? (?:end|clos)|"
    r"broken pipe|ECONNRESET|EPIPE|stream (?:was )?(?:reset|interrupted|cut)", re.I)


class Outcome(enum.StrEnum):
    """How a stream ended.  Exactly one per stream.

    ``completed`` only when ``data: [DONE]`` arrived **and** at least one
    choice got its ``finish_reason`` (a single-slot server that cuts a stream
    still sends ``[DONE]``).  ``length`` and ``content_filter`` are finish
    reasons *inside* a completed stream, not outcomes.  Every other outcome
    comes with a one-line ``StreamResult.reason``.
    """

    COMPLETED = "completed"
    TRUNCATED = "truncated"  # the body ended before [DONE], or [DONE] without a finish reason
    ERROR = "error"  # HTTP status >= 400, an error payload, a transport or protocol error
    TIMED_OUT = "timed_out"  # a deadline fired (set by the I/O layer)
    CANCELLED = "cancelled"  # the caller cancelled the stream (set by the I/O layer)


class Flag(enum.StrEnum):
    """Stable codes for a result that completed but looks wrong (``StreamResult.flags``).

    A flagged result is still ``completed``: the stream ended properly.  Front
    ends show the flags; ``fanout batch`` does not count ``empty_answer`` as done.
    """

    EMPTY_ANSWER = "empty_answer"  # no text, reasoning, refusal or tool call in any choice
    UNFINISHED_CHOICE = "unfinished_choice"  # a choice ended without its finish_reason
    MISSING_CHOICES = "missing_choices"  # n choices were asked, fewer came
    MISSING_USAGE = "missing_usage"  # usage was asked (stream_options), none came
    NO_FINISH_REASON = "no_finish_reason"  # completed only because the endpoint allows it
    NOT_STREAMED = "not_streamed"  # a JSON completion came where a stream was asked
    SKIPPED_FRAMES = "skipped_frames"  # malformed frames were skipped: output may be missing


@attrs.frozen(slots=True)
class StreamError:
    """An error as the upstream (or fanout) described it.

    ``message`` is always a non-empty one-line-or-more description; ``type`` and
    ``code`` are the upstream's own words when it sent them; ``status`` is the
    HTTP status when the error came from one.
    """

    message: str
    type: str | None = None
    code: str | None = None
    status: int | None = None


@attrs.frozen(slots=True)
class Usage:
    """Token counts from a ``usage`` object; ``raw`` keeps every detail sent.

    ``per_choice``: empty when the server sent one usage for the whole response
    (OpenAI: one chunk at the end; the last one kept when several came); else the
    usage it sent for each choice (llama.cpp with ``n`` > 1 sends one after each
    choice's finish), which these counts add up: completion tokens summed, the
    prompt's counted once when every choice reports the same one (one prompt), and
    ``raw`` holds the three sums and ``per_choice``, each choice's as sent.
    """

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None
    raw: Mapping[str, Any] = attrs.field(factory=dict, eq=True, repr=False)
    # Not ``tuple[...]``: the compiled core checks a tuple-typed attribute's class default.
    per_choice: Sequence[Usage] = attrs.field(default=(), repr=False)

    @classmethod
    def from_dict(cls, usage: Mapping[str, Any]) -> Usage:
        """Build from an upstream ``usage`` object, keeping only integer counts."""
        return cls(
            _count(usage, "prompt_tokens"), _count(usage, "completion_tokens"),
            _count(usage, "total_tokens"), usage,
        )


def added_usage(reports: Iterable[Usage]) -> Usage:
    """One ``Usage`` for a response whose server sent one per choice (``reports``, in
    order): see ``Usage.per_choice``."""
    parts = tuple(reports)
    prompts = [u.prompt_tokens for u in parts]
    if None in prompts:
        prompt = None
    elif len(set(prompts)) == 1:
        prompt = prompts[0]  # the same prompt, counted by each choice
    else:
        prompt = sum(p for p in prompts if p is not None)
    completions = [u.completion_tokens for u in parts]
    completion = None if None in completions else sum(
        c for c in completions if c is not None)
    if prompt is not None and completion is not None:
        total: int | None = prompt + completion
    else:
        totals = [u.total_tokens for u in parts]
        total = None if None in totals else sum(t for t in totals if t is not None)
    raw: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion,
                           "total_tokens": total, "per_choice": [dict(u.raw) for u in parts]}
    costs = [u.raw.get("cost") for u in parts]
    if all(type(c) in (int, float) for c in costs):
        raw["cost"] = sum(c for c in costs if isinstance(c, int | float))
    return Usage(prompt, completion, total, raw, parts)


def _count(usage: Mapping[str, Any], name: str) -> int | None:
    value = usage.get(name)
    return value if type(value) is int else None


@attrs.frozen(slots=True)
class ToolCall:
    """One tool call of one choice, assembled from its deltas.

    ``arguments`` is the concatenation of every fragment, exactly as sent.
    ``parsed`` is its JSON value when it parses (``parse_error`` is then ``None``),
    else ``parse_error`` says why.  ``schema_errors`` is ``None`` when no schema
    was known for ``name``, ``()`` when the parsed value matched it, else one
    message per violation.
    """

    index: int
    id: str | None
    type: str | None
    name: str | None
    arguments: str
    parsed: Any = None
    parse_error: str | None = None
    schema_errors: tuple[str, ...] | None = None


@attrs.frozen(slots=True)
class ThinkingBlock:
    """One Anthropic ``thinking`` or ``redacted_thinking`` content block, whole.

    A conversation that continues after a turn with thinking must send these
    blocks back as they came: ``thinking`` is the block's text (also in the
    choice's ``reasoning``), ``signature`` the one its ``signature_delta`` carried
    (``None`` when none came).  A ``redacted_thinking`` block has ``redacted``
    set, no text, and its opaque ``data``: it is never shown, only kept.
    ``index`` is the block's index in the message.
    """

    index: int
    thinking: str = ""
    signature: str | None = None
    redacted: bool = False
    data: str | None = None


@attrs.frozen(slots=True)
class ChoiceResult:
    """The output of one choice (``n`` > 1 gives several).

    ``finish_reason`` is in the chat vocabulary (``stop``, ``length``,
    ``tool_calls``, ``content_filter``) for every dialect;
    ``native_finish_reason`` is the dialect's own word when it was mapped
    (Anthropic's ``end_turn``, Responses' ``max_output_tokens``), ``None`` for
    a chat stream, whose finish reason is the server's own.  ``thinking`` holds
    Anthropic's thinking blocks with their signatures (empty for other dialects).
    """

    index: int
    role: str | None = None
    text: str = ""
    reasoning: str = ""
    refusal: str = ""
    finish_reason: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    native_finish_reason: str | None = None
    thinking: tuple[ThinkingBlock, ...] = ()


def has_output(choices: Iterable[ChoiceResult]) -> bool:
    """Any of ``choices`` has non-blank text, reasoning, refusal, or a tool call."""
    return any(not is_blank(c.text) or not is_blank(c.reasoning) or not is_blank(c.refusal)
               or c.tool_calls for c in choices)


def is_blank(text: str) -> bool:
    """``text`` is empty or only whitespace: what ``text.strip()`` empties, without
    copying it (a strip copies the whole text when it begins or ends with a space)."""
    return not text or text.isspace()


@attrs.frozen(slots=True)
class Attempt:
    """One HTTP attempt of a stream.  ``waited`` is the backoff slept before it."""

    number: int
    status: int | None = None
    error: StreamError | None = None
    waited: float = 0.0
    delivered_content: bool = False


@attrs.frozen(slots=True)
class Timings:
    """Where the time went, in seconds on a monotonic clock.

    ``queued`` is the time spent waiting for a concurrency slot (and for a
    connection from the client's pool).  The other points are measured from
    the moment the stream got its slot (so queueing never counts in
    time-to-first-token), ``None`` when they never happened.
    ``first_request_sent`` is the first attempt's; the rest describe the last
    attempt, so ``ttft`` is the model's latency and ``e2e`` / ``retrying``
    cover the whole stream.  ``gap_*`` are statistics of the gaps between
    events (keep-alive comments are not events).
    """

    queued: float = 0.0
    first_request_sent: float | None = None
    request_sent: float | None = None
    headers: float | None = None
    first_byte: float | None = None
    first_content: float | None = None
    first_text: float | None = None
    last_event: float | None = None
    end: float | None = None
    gap_max: float | None = None
    gap_p50: float | None = None
    gap_p95: float | None = None

    @property
    def ttft(self) -> float | None:
        """Time to first token (any content: text, reasoning, refusal, tool call),
        from the request being sent."""
        if self.first_content is None or self.request_sent is None:
            return None
        return self.first_content - self.request_sent

    @property
    def e2e(self) -> float | None:
        """The whole stream, retries included: first request sent to the end."""
        start = self.first_request_sent if self.first_request_sent is not None \
            else self.request_sent
        if start is None or self.end is None:
            return None
        return self.end - start

    @property
    def retrying(self) -> float:
        """Time spent before the last attempt: failed attempts and backoff waits."""
        if self.first_request_sent is None or self.request_sent is None:
            return 0.0
        return max(0.0, self.request_sent - self.first_request_sent)

    @property
    def ttfc(self) -> float | None:
        """Time to first answer text (after any reasoning), from the request being sent."""
        if self.first_text is None or self.request_sent is None:
            return None
        return self.first_text - self.request_sent


@attrs.frozen(slots=True)
class StreamResult:
    """Everything one stream produced, whatever its outcome.

    ``choices`` is ordered by index (gaps allowed).  Partial output is kept for
    every outcome.  For a ``truncated`` stream, ``pending_event`` says whether
    the body ended inside an event, and ``all_choices_finished`` whether every
    choice had received a finish reason before the end.

    Counters: ``events`` server-sent events dispatched, ``content_events``
    the content deltas among their normalized events, ``skipped_frames``
    malformed frames skipped (``skip_reasons`` keeps the first few reasons),
    ``comments`` keep-alive comment lines, ``bytes_received`` body bytes,
    ``ignored_after_done`` events that followed ``[DONE]`` (or the dialect's
    terminal event), ``ignored_events`` events of a type the dialect's
    interpreter does not use (the Responses and Anthropic dialects: new or
    unmapped event types are counted, never errors).

    ``reason`` is one line saying why for every outcome but ``completed``
    (``None`` then): "the body ended after 12 events without [DONE]",
    "[DONE] arrived but no choice had a finish reason", "HTTP 500: ...".
    ``flags`` are ``Flag`` codes for a completed stream that looks wrong.

    Set by the I/O layer: ``timed_out`` names the deadline that fired
    (``connect``, ``first_byte``, ``first_token``, ``idle``, ``total`` or
    ``fanout``), ``attempts`` records every HTTP attempt, ``timings`` where the
    time went, ``others_running`` how many other streams of the same fan-out
    were running when this one ended (a single-slot server cuts the running
    stream when another arrives: a cut with others running is that signal).
    """

    outcome: Outcome
    choices: tuple[ChoiceResult, ...] = ()
    reason: str | None = None
    flags: tuple[Flag, ...] = ()
    usage: Usage | None = None
    error: StreamError | None = None
    response_id: str | None = None
    model: str | None = None
    system_fingerprint: str | None = None
    status: int | None = None
    pending_event: bool = False
    all_choices_finished: bool = False
    events: int = 0
    content_events: int = 0
    skipped_frames: int = 0
    skip_reasons: tuple[str, ...] = ()
    comments: int = 0
    bytes_received: int = 0
    ignored_after_done: int = 0
    ignored_events: int = 0
    stream: str = ""
    content_key: str = ""
    timed_out: str | None = None  # which deadline fired, for ``timed_out``
    attempts: tuple[Attempt, ...] = ()
    timings: Timings | None = None
    others_running: int = 0

    @property
    def text(self) -> str:
        """The first choice's text (``""`` when there is none): the common case."""
        return self.choices[0].text if self.choices else ""

    @property
    def has_output(self) -> bool:
        """Any choice has non-blank text, reasoning, refusal, or a tool call."""
        return has_output(self.choices)

    def choice(self, index: int) -> ChoiceResult | None:
        """The choice with this ``index``, or ``None`` if it never appeared."""
        for choice in self.choices:
            if choice.index == index:
                return choice
        return None


def relayed_cut(result: StreamResult) -> bool:
    """Whether ``result`` is a relay's report that its backend's stream was cut: an
    ``error`` that came in-band (an error event in a 2xx stream, not an HTTP status),
    after some output or before any, whose words say the connection broke (LiteLLM's
    "Connection error." when the server behind it cut the stream).  A cut, not a
    refusal: the partial output is kept, and ``fanout batch`` redoes it as it redoes a
    truncation."""
    error = result.error
    if result.outcome != Outcome.ERROR or error is None:
        return False
    if result.status is not None and not 200 <= result.status < 300:
        return False
    return says_cut(f"{error.message} {error.type or ''} {error.code or ''}")


def says_cut(text: str) -> bool:
    """Whether ``text`` (an error's words) says the connection to a backend broke."""
    return bool(_CUT_WORDS.search(text))
