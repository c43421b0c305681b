"""Folding normalized events into a ``StreamResult``.

The accumulator is the only place that keeps per-stream state about output.
Choices may arrive in any index order and with gaps (choice 1 before choice 0
is fine).  Tool calls are keyed by (choice, tool index):

- ``id``, ``type`` and ``function.name`` are taken from the first delta that
  carries them and never concatenated (some relays repeat them in every delta);
- ``arguments`` fragments are concatenated in arrival order;
- a delta without ``index`` continues the call with the same ``id``, else
  the call that received the last fragment, else opens call 0;
- the assembled arguments are parsed as JSON only when the result is built,
  and validated against the function's JSON Schema when the request's
  ``tools`` were given (violations are recorded, never raised).

The outcome is ``completed`` only when ``[DONE]`` (or the dialect's terminal
event, named by ``terminal``) arrived and at least one choice got a finish
reason (``require_finish_reason=False`` accepts ``[DONE]`` alone, for a relay
known to omit finish reasons; the result is then flagged ``no_finish_reason``).
Every other outcome gets a one-line ``reason``; a completed result that looks
wrong gets ``Flag`` codes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, final

from .events import (
    ChoiceFinished,
    ChoiceRole,
    CoreEvent,
    DoneReceived,
    ErrorReported,
    FrameSkipped,
    ReasoningDelta,
    RefusalDelta,
    ResponseInfo,
    TextDelta,
    ThinkingBlockFinished,
    ToolCallDelta,
    UsageReported,
)
from .result import (
    Attempt,
    ChoiceResult,
    Flag,
    Outcome,
    StreamError,
    StreamResult,
    ThinkingBlock,
    Timings,
    ToolCall,
    Usage,
    added_usage,
    has_output,
    is_blank,
)

__all__ = ["Accumulator"]

_MAX_SKIP_REASONS = 10
_MAX_REASON = 300


#: Fragments of a text kept apart before they are joined into one string: a string
#: object per token costs ~50 bytes beyond its characters (12 KB of a 200-token answer).
_PACK = 32
#: Usage reports looked at for one per choice; more are a running total (vLLM's
#: continuous usage stats send one on every chunk).
MAX_USAGE_REPORTS = 16


def _pack(pieces: list[str], packed: int) -> int:
    """Join the fragments after the first ``packed`` into one; return the packed count.

    Each fragment is copied once, when its run is joined: linear in the text,
    where joining everything so far each time would be quadratic.
    """
    pieces[packed:] = ["".join(pieces[packed:])]
    return packed + 1


class _ToolCallState:
    __slots__ = ("arguments", "id", "index", "name", "packed", "type")

    def __init__(self, index: int) -> None:
        self.index = index
        self.id: str | None = None
        self.type: str | None = None
        self.name: str | None = None
        self.arguments: list[str] = []
        self.packed = 0


class _ChoiceState:
    __slots__ = ("finish_reason", "last_tool", "native_finish_reason", "reasoning",
                 "reasoning_packed", "refusal", "refusal_packed", "role", "text", "text_packed",
                 "thinking", "tools")

    def __init__(self) -> None:
        self.native_finish_reason: str | None = None
        self.thinking: list[ThinkingBlock] = []
        self.role: str | None = None
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.refusal: list[str] = []
        # How many leading fragments of each are already joined runs (see ``_pack``).
        self.text_packed = 0
        self.reasoning_packed = 0
        self.refusal_packed = 0
        self.finish_reason: str | None = None
        self.tools: dict[int, _ToolCallState] = {}
        self.last_tool: _ToolCallState | None = None


@final
class Accumulator:
    """Folds one stream's events into its ``StreamResult``.

    ``add(event)`` for each event in order; ``result()`` at any time (a live
    view may take a snapshot mid-stream) builds an immutable result.  ``tools``
    is the request's ``tools`` list, used to validate tool-call arguments.
    """

    __slots__ = (
        "_choices",
        "_schemas",
        "_usage_reports",
        "content_events",
        "content_key",
        "done",
        "error",
        "events",
        "expect_choices",
        "expect_usage",
        "model",
        "not_streamed",
        "require_finish_reason",
        "response_id",
        "skip_reasons",
        "skipped_frames",
        "stream",
        "system_fingerprint",
        "terminal",
        "usage",
    )

    def __init__(
        self,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        stream: str = "",
        content_key: str = "",
        require_finish_reason: bool = True,
        expect_choices: int = 1,
        expect_usage: bool = False,
        terminal: str = "[DONE]",
    ) -> None:
        self.stream = stream
        #: The name of the event that completes the stream, for the reasons.
        self.terminal = terminal
        self.content_key = content_key
        self.require_finish_reason = require_finish_reason
        #: What was asked (``n``; usage in ``stream_options``): fewer is flagged.
        self.expect_choices = expect_choices
        self.expect_usage = expect_usage
        #: The body was one JSON completion, not a stream (set by the parser).
        self.not_streamed = False
        self.content_events = 0
        self._choices: dict[int, _ChoiceState] = {}
        self._schemas = _schemas_by_name(tools)
        self.done = False
        self.error: StreamError | None = None
        self.usage: Usage | None = None
        #: (choices finished, usage) of each usage sent; ``None`` past a few of them.
        self._usage_reports: list[tuple[int, Usage]] | None = []
        self.response_id: str | None = None
        self.model: str | None = None
        self.system_fingerprint: str | None = None
        self.events = 0
        self.skipped_frames = 0
        self.skip_reasons: list[str] = []

    def add(self, event: CoreEvent | object) -> None:
        """Fold one event in.  Events of types the core does not define are ignored."""
        handler = _HANDLERS.get(type(event))
        if handler is not None:
            handler(self, event)
            if type(event) is TextDelta:
                self.content_events += 1

    def extend(self, events: Iterable[CoreEvent | object]) -> None:
        """Fold several events in, in order."""
        handlers = _HANDLERS
        choices = self._choices
        texts = 0
        last = None  # the choice of the last text, its state and its text list
        state = pieces = None
        try:
            for event in events:
                if type(event) is TextDelta:  # the hot path, without a call
                    if event.choice is not last or pieces is None:
                        state = choices.get(event.choice)
                        if state is None:
                            state = choices[event.choice] = _ChoiceState()
                        pieces = state.text
                        last = event.choice
                    pieces.append(event.text)
                    if len(pieces) - state.text_packed >= _PACK:  # type: ignore[union-attr]
                        state.text_packed = _pack(pieces, state.text_packed)  # type: ignore[union-attr]
                    texts += 1
                    continue
                handler = handlers.get(type(event))
                if handler is not None:
                    handler(self, event)
        finally:
            self.content_events += texts

    def texts(self, choice: int) -> list[str]:
        """Choice ``choice``'s text fragments, for a caller that folds ``TextDelta``
        events without building them (it adds them to ``content_events``)."""
        return self._choice(choice).text

    def arguments(self, choice: int, tool_index: int, arguments: str) -> None:
        """Fold ``ToolCallDelta(choice, tool_index, None, None, None, arguments)``
        without building it."""
        self.content_events += 1
        state = self._choice(choice)
        call = state.tools.get(tool_index)
        if call is None:
            call = state.tools[tool_index] = _ToolCallState(tool_index)
        if arguments:
            call.arguments.append(arguments)
            if len(call.arguments) - call.packed >= _PACK:
                call.packed = _pack(call.arguments, call.packed)
        state.last_tool = call

    def _choice(self, index: int) -> _ChoiceState:
        state = self._choices.get(index)
        if state is None:
            state = self._choices[index] = _ChoiceState()
        return state

    def _text(self, event: TextDelta) -> None:
        state = self._choice(event.choice)
        state.text.append(event.text)
        if len(state.text) - state.text_packed >= _PACK:
            state.text_packed = _pack(state.text, state.text_packed)

    def _reasoning(self, event: ReasoningDelta) -> None:
        state = self._choice(event.choice)
        state.reasoning.append(event.text)
        if len(state.reasoning) - state.reasoning_packed >= _PACK:
            state.reasoning_packed = _pack(state.reasoning, state.reasoning_packed)
        self.content_events += 1

    def _refusal(self, event: RefusalDelta) -> None:
        state = self._choice(event.choice)
        state.refusal.append(event.text)
        if len(state.refusal) - state.refusal_packed >= _PACK:
            state.refusal_packed = _pack(state.refusal, state.refusal_packed)
        self.content_events += 1

    def _role(self, event: ChoiceRole) -> None:
        state = self._choice(event.choice)
        if state.role is None:
            state.role = event.role

    def _finished(self, event: ChoiceFinished) -> None:
        state = self._choice(event.choice)
        state.finish_reason = event.finish_reason
        state.native_finish_reason = event.native_finish_reason

    def _thinking(self, event: ThinkingBlockFinished) -> None:
        self._choice(event.choice).thinking.append(event.block)

    def _tool_call(self, event: ToolCallDelta) -> None:
        self.content_events += 1
        choice = self._choice(event.choice)
        tools = choice.tools
        index = event.tool_index
        if index is None:
            call = None
            if event.id:
                call = next((c for c in tools.values() if c.id == event.id), None)
                if call is None and tools:  # a new id: a new call after the others
                    index = max(tools) + 1
            elif choice.last_tool is not None:
                call = choice.last_tool
            if call is None:
                index = 0 if index is None else index
                call = tools.get(index) or tools.setdefault(index, _ToolCallState(index))
        else:
            call = tools.get(index)
            if call is None:
                call = tools[index] = _ToolCallState(index)
        if event.id and call.id is None:
            call.id = event.id
        if event.type and call.type is None:
            call.type = event.type
        if event.name and call.name is None:
            call.name = event.name
        if event.arguments:
            call.arguments.append(event.arguments)
            if len(call.arguments) - call.packed >= _PACK:
                call.packed = _pack(call.arguments, call.packed)
        choice.last_tool = call

    def _usage(self, event: UsageReported) -> None:
        self.usage = event.usage
        # How many choices had finished when each usage came: one usage after each
        # choice's finish is usage per choice (llama.cpp with n > 1), added up in
        # ``result``; any other pattern (one at the end, one on every chunk) is a total.
        reports = self._usage_reports
        if reports is not None:
            if len(reports) >= MAX_USAGE_REPORTS:
                self._usage_reports = None  # usage on every chunk: a running total
            else:
                finished = sum(1 for c in self._choices.values()
                               if c.finish_reason is not None)
                reports.append((finished, event.usage))

    def _reported_usage(self) -> Usage | None:
        """The response's usage: the last one sent, or the choices' added up when the
        server sent one after each choice's finish."""
        reports = self._usage_reports
        count = len(self._choices)
        if reports is None or count < 2 or len(reports) != count:
            return self.usage
        if [finished for finished, _ in reports] != list(range(1, count + 1)):
            return self.usage
        return added_usage([usage for _, usage in reports])

    def _error(self, event: ErrorReported) -> None:
        if self.error is None:  # the first error is the cause; later ones are echoes
            self.error = event.error

    def _skipped(self, event: FrameSkipped) -> None:
        self.skipped_frames += 1
        if len(self.skip_reasons) < _MAX_SKIP_REASONS:
            self.skip_reasons.append(event.reason)

    def _done(self, event: DoneReceived) -> None:
        self.done = True

    def _info(self, event: ResponseInfo) -> None:
        if event.id is not None:
            self.response_id = event.id
        if event.model is not None:
            self.model = event.model
        if event.system_fingerprint is not None:
            self.system_fingerprint = event.system_fingerprint

    @property
    def finished(self) -> bool:
        """At least one choice received its finish reason."""
        return any(state.finish_reason is not None for state in self._choices.values())

    def outcome(self) -> Outcome:
        """``error`` if an error arrived; ``completed`` if ``[DONE]`` did and a
        choice finished (or finish reasons are not required); else ``truncated``."""
        if self.error is not None:
            return Outcome.ERROR
        if self.done and (self.finished or not self.require_finish_reason):
            return Outcome.COMPLETED
        return Outcome.TRUNCATED

    def reason(self, outcome: Outcome, *, sse_events: int = 0, bytes_received: int = 0,
               pending_event: bool = False) -> str | None:
        """One line saying why ``outcome`` is not ``completed`` (``None`` if it is)."""
        if outcome is Outcome.COMPLETED:
            return None
        error = self.error
        if outcome is Outcome.ERROR and error is not None:
            status = f"HTTP {error.status}: " if error.status and error.status >= 400 else ""
            return _one_line(status + error.message)
        if outcome is Outcome.TRUNCATED:
            if self.done:
                return (f"{self.terminal} arrived but no choice had a finish reason "
                        "(the server cut the stream)")
            if sse_events:
                plural = "s" if sse_events != 1 else ""
                where = f"after {sse_events} event{plural} without {self.terminal}"
                if pending_event:
                    where += ", inside an unfinished event"
            else:
                where = "before any event " + (f"({bytes_received} bytes)" if bytes_received
                                               else "(empty body)")
            if not self.content_events and self.skip_reasons:
                # Nothing readable came: what the frames were says why (often the wrong api).
                plural = "s" if self.skipped_frames != 1 else ""
                where += (f" ({self.skipped_frames} frame{plural} skipped: "
                          f"{self.skip_reasons[0]})")
            if error is not None:
                return _one_line(f"the connection broke {where}: {error.message}")
            return f"the body ended {where}"
        if error is not None:
            return _one_line(error.message)
        return str(outcome).replace("_", " ")

    def flags(self, choices: Sequence[ChoiceResult], skipped_frames: int) -> tuple[Flag, ...]:
        """The ``Flag`` codes of a completed result built from ``choices``."""
        flags = []
        if not has_output(choices):
            flags.append(Flag.EMPTY_ANSWER)
        finished = [c.finish_reason is not None for c in choices]
        if not any(finished):
            flags.append(Flag.NO_FINISH_REASON)
        elif not all(finished):
            flags.append(Flag.UNFINISHED_CHOICE)
        if len(choices) < self.expect_choices:
            flags.append(Flag.MISSING_CHOICES)
        if self.expect_usage and self.usage is None:
            flags.append(Flag.MISSING_USAGE)
        if self.not_streamed:
            flags.append(Flag.NOT_STREAMED)
        if skipped_frames:
            flags.append(Flag.SKIPPED_FRAMES)
        return tuple(flags)

    def choices(self) -> tuple[ChoiceResult, ...]:
        """The choices so far, ordered by index, tool-call arguments parsed."""
        return tuple(
            ChoiceResult(
                index,
                state.role,
                "".join(state.text),
                "".join(state.reasoning),
                "".join(state.refusal),
                state.finish_reason,
                tuple(self._finish_call(state.tools[t]) for t in sorted(state.tools)),
                state.native_finish_reason,
                tuple(state.thinking),
            )
            for index, state in sorted(self._choices.items())
        )

    def result(
        self,
        *,
        outcome: Outcome | None = None,
        status: int | None = None,
        pending_event: bool = False,
        sse_events: int = 0,
        comments: int = 0,
        bytes_received: int = 0,
        ignored_after_done: int = 0,
        ignored_events: int = 0,
        timed_out: str | None = None,
        attempts: tuple[Attempt, ...] = (),
        timings: Timings | None = None,
        reason: str | None = None,
    ) -> StreamResult:
        """Build the result.  ``outcome`` overrides the one derived from the events
        (the I/O layer passes ``timed_out`` or ``cancelled``, with its ``reason``);
        the other keywords are counters only the layers below the events know.
        """
        choices = self.choices()
        final = outcome if outcome is not None else self.outcome()
        if final is Outcome.COMPLETED:
            why, flags = None, self.flags(choices, self.skipped_frames)
        else:
            why = _one_line(reason) if reason else self.reason(
                final, sse_events=sse_events, bytes_received=bytes_received,
                pending_event=pending_event)
            flags = ()
        return StreamResult(
            outcome=final,
            choices=choices,
            reason=why,
            flags=flags,
            usage=self._reported_usage(),
            error=self.error,
            response_id=self.response_id,
            model=self.model,
            system_fingerprint=self.system_fingerprint,
            status=status,
            pending_event=pending_event,
            all_choices_finished=bool(choices)
            and all(c.finish_reason is not None for c in choices),
            events=sse_events,
            content_events=self.content_events,
            skipped_frames=self.skipped_frames,
            skip_reasons=tuple(self.skip_reasons),
            comments=comments,
            bytes_received=bytes_received,
            ignored_after_done=ignored_after_done,
            ignored_events=ignored_events,
            stream=self.stream,
            content_key=self.content_key,
            timed_out=timed_out,
            attempts=attempts,
            timings=timings,
        )

    def _finish_call(self, state: _ToolCallState) -> ToolCall:
        arguments = "".join(state.arguments)
        parsed: Any = None
        parse_error: str | None = None
        schema_errors: tuple[str, ...] | None = None
        if is_blank(arguments):
            parse_error = "no arguments were sent"
        else:
            try:
                parsed = json.loads(arguments, parse_constant=_reject_constant)
            except (ValueError, RecursionError) as exc:
                parse_error = f"arguments are not valid JSON: {exc}"
        schema = self._schemas.get(state.name) if state.name else None
        if schema is not None and parse_error is None:
            schema_errors = _validate(parsed, schema)
        return ToolCall(
            state.index, state.id, state.type, state.name, arguments, parsed, parse_error,
            schema_errors,
        )


#: The fold of each event type: a table of the class's functions, not of bound methods
#: per instance (an accumulator holding its own bound methods is a reference cycle:
#: left to the cyclic GC, which at thousands of streams cost a third of the CPU).
_HANDLERS: dict[type[Any], Callable[[Accumulator, Any], None]] = {
    TextDelta: Accumulator._text,
    ReasoningDelta: Accumulator._reasoning,
    RefusalDelta: Accumulator._refusal,
    ToolCallDelta: Accumulator._tool_call,
    ChoiceFinished: Accumulator._finished,
    ThinkingBlockFinished: Accumulator._thinking,
    ChoiceRole: Accumulator._role,
    UsageReported: Accumulator._usage,
    ErrorReported: Accumulator._error,
    FrameSkipped: Accumulator._skipped,
    DoneReceived: Accumulator._done,
    ResponseInfo: Accumulator._info,
}


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= _MAX_REASON else line[: _MAX_REASON - 1] + "…"


def _reject_constant(name: str) -> Any:
    # json.loads accepts NaN and Infinity; JSON (and every tool runtime) does not.
    raise ValueError(f"{name} is not valid JSON")


def _schemas_by_name(tools: Sequence[Mapping[str, Any]] | None) -> dict[str, Mapping[str, Any]]:
    schemas: dict[str, Mapping[str, Any]] = {}
    for tool in tools or ():
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if isinstance(function, Mapping) and isinstance(function.get("name"), str):
            parameters = function.get("parameters")
            schemas[function["name"]] = parameters if isinstance(parameters, Mapping) else {}
    return schemas


def _validate(value: Any, schema: Mapping[str, Any]) -> tuple[str, ...]:
    # Imported here: jsonschema and regex are only needed when a stream has tools.
    import jsonschema

    from . import patterns

    # The schema's patterns are the user's and the arguments the model's: matched with
    # a time limit (``patterns``), so a pattern with nested quantifiers cannot hang
    # the stream that validates them.
    try:
        jsonschema.validators.validator_for(schema).check_schema(dict(schema))
        patterns.check_schema_patterns(schema)
        found = patterns.LimitedValidator(schema).errors(
            value, patterns.Deadline(patterns.DEFAULT_TIMEOUT))
    except jsonschema.exceptions.SchemaError as exc:
        return (f"the tool's schema is invalid: {exc.message}",)
    except (ValueError, patterns.PatternError) as exc:
        return (f"the tool's schema cannot be checked: {exc}",)
    except patterns.PatternTimeout as exc:
        return (f"the tool's schema pattern {patterns.quote(exc.pattern, 40)} timed out "
                f"after {exc.seconds:g} s",)
    errors = sorted(found, key=lambda e: [str(p) for p in e.path])
    return tuple(
        f"{'/'.join(str(p) for p in error.absolute_path) or '(root)'}: {error.message}"
        for error in errors
    )
