"""The OpenAI Responses dialect (``/v1/responses``): typed events in, normalized events out.

A Responses stream has no ``[DONE]``: it is complete only with
``response.completed`` or ``response.incomplete`` (completed, with the
reason as its finish reason); ``response.failed`` and ``error`` are errors.
The mapping (every stream has one choice, index 0):

- ``response.created`` / ``in_progress`` / ``queued``: ``ResponseInfo`` (id, model);
- ``response.output_item.added``: the first item announces the role (a
  message's own, else ``assistant``); a
  ``function_call`` item opens a tool call (``ToolCallDelta`` with its
  ``call_id`` as id and its name).  Tool indexes are 0, 1, 2 in order of
  appearance, at most ``max_tool_calls``; items are keyed by ``item_id`` (else
  ``output_index``), at most ``max_blocks``;
- ``response.output_text.delta``: ``TextDelta``; ``response.refusal.delta``:
  ``RefusalDelta``; ``response.reasoning_text.delta`` and
  ``response.reasoning_summary_text.delta``: ``ReasoningDelta``.  A delta for
  an item that was never added is kept (all text goes to the one choice, in
  order); one for an item already done, or of the wrong kind, is skipped;
- ``response.function_call_arguments.delta``: an arguments fragment of its
  item's call; a fragment for no known ``function_call`` item, or after the
  item is done, is skipped (never given to another call).  An ``item_id``
  never announced is read as the ``function_call`` item its ``id`` or
  ``call_id`` (either way round) or its ``output_index`` names, when there is
  one: some upstreams give every event a fresh ``item_id``, llama.cpp closes a
  call under ``{"call_id": <the id it announced>}``.
  ``function_call_arguments.done`` and ``output_item.done`` carry the
  arguments whole: they are used when no fragment came, and a mismatch with
  the fragments is a skipped frame (the fragments, as streamed, are kept);
- a ``function_call`` item naming the ``call_id`` of an earlier call under
  another item id (added, or seen only at its ``output_item.done``) continues
  that call, as a repeated ``tool_use`` id does on ``/v1/messages``: one call,
  one tool index, the items' arguments concatenated in item order, the first
  name kept (another name is a skipped frame that says so); an item repeating
  the whole call (its arguments equal the call's, already JSON) adds nothing
  and is counted in ``ignored_events``;
- ``response.completed``: ``UsageReported`` from ``response.usage``, finish
  ``stop`` (``tool_calls`` when the output has function calls; native
  ``completed``), ``DoneReceived``.  Its ``output`` is read as deltas when no
  delta came; otherwise only the ``function_call`` items no event announced
  are (a bridge may list a call it never streamed);
- ``response.incomplete``: finish from ``incomplete_details.reason``
  (``max_output_tokens`` → ``length``, ``content_filter`` → ``content_filter``,
  any other kept as sent; native: the reason), usage, ``DoneReceived``;
- ``response.failed``: ``ErrorReported`` from ``response.error``;
  ``error``: ``ErrorReported`` (``code`` and ``message``);
- the ``.done`` / ``.added`` markers of parts, texts, summaries and
  annotations carry nothing new and are read silently; every other type
  (hosted tools' progress, audio, new types) is counted in ``ignored_events``.

Usage: ``input_tokens`` → ``prompt_tokens``, ``output_tokens`` →
``completion_tokens``, ``total_tokens`` (their sum when absent); ``raw`` keeps
the details (cached and reasoning tokens).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, final

from . import _json
from ._dialect import (
    CallPart,
    DialectInterpreter,
    Handler,
    SplitCall,
    _int_or_none,
    _str_value,
)
from .chat import _compact, _short, _str_or_none
from .events import (
    ChoiceFinished,
    ChoiceRole,
    CoreEvent,
    DoneReceived,
    ErrorReported,
    FrameSkipped,
    ReasoningDelta,
    RefusalDelta,
    TextDelta,
    ToolCallDelta,
    UsageReported,
)
from .redact import Redactor
from .result import StreamError, Usage
from .sse import ServerSentEvent

if TYPE_CHECKING:
    from .accumulate import Accumulator

__all__ = ["INCOMPLETE_REASONS", "ResponsesInterpreter", "responses_body_events",
           "responses_usage"]

#: ``incomplete_details.reason`` → chat finish reason (any other is kept as sent).
INCOMPLETE_REASONS = {"max_output_tokens": "length", "content_filter": "content_filter"}

_SILENT = (
    "response.content_part.added", "response.content_part.done", "response.output_text.done",
    "response.refusal.done", "response.reasoning_text.done",
    "response.reasoning_summary_text.done", "response.reasoning_summary_part.added",
    "response.reasoning_summary_part.done", "response.output_text.annotation.added",
)


class _Item:
    __slots__ = ("arguments", "call", "done", "final", "id", "kind", "part")

    def __init__(self, kind: str, item_id: str | None) -> None:
        self.kind = kind
        self.id = item_id
        self.done = False
        self.call: SplitCall | None = None  # a function_call item's call
        self.part: CallPart | None = None  # and its share of it
        self.arguments: list[str] = []  # this item's own fragments
        self.final = False  # the whole arguments were checked (a .done event)


@final
class ResponsesInterpreter(DialectInterpreter):
    """Turns the server-sent events of one Responses stream into normalized events.

    Same keywords and modes as ``ChatChunkInterpreter`` (``max_tool_calls``
    caps the function calls, ``max_blocks`` the output items).
    """

    terminal: ClassVar[str] = "response.completed or response.incomplete"
    api: ClassVar[str] = "responses"
    __slots__ = ("_by_call", "_by_id", "_by_output", "_calls", "_content", "_items", "_role",
                 "_tools", "continued_items")

    def __init__(self, *, strict: bool = False, stream: str = "", content_key: str = "",
                 redactor: Redactor | None = None, max_tool_calls: int = 128,
                 max_blocks: int = 1024) -> None:
        self._by_id: dict[str, _Item] = {}
        self._by_output: dict[int, _Item] = {}
        self._by_call: dict[str, _Item] = {}  # the last function_call item of each call_id
        self._calls: list[SplitCall] = []  # every tool call, in order
        #: ``function_call`` items that continued an earlier call (repeating its ``call_id``).
        self.continued_items = 0
        self._items = 0
        self._tools = 0
        self._role = False
        self._content = False  # a content delta (or a function call) was read
        super().__init__(strict=strict, stream=stream, content_key=content_key,
                         redactor=redactor, max_tool_calls=max_tool_calls,
                         max_blocks=max_blocks)

    def _table(self) -> dict[str, Handler]:
        return _HANDLERS

    def interpret_all(self, events: Sequence[ServerSentEvent | str | bytes | tuple[Any, str]],
                      out: list[CoreEvent], fold: Accumulator | None = None) -> None:
        """``interpret_into`` for each event in order (the parser's hot path): a text
        delta to a known message item, nearly every event, is read without a call."""
        self._fold = fold  # the calls' fragments go into it unbuilt
        if self._redacting:
            super().interpret_all(events, out, fold)
            return
        loads = _json.for_bytes(_json.loads)
        handlers = self._handlers
        by_id = self._by_id
        stream, key = self._stream, self._content_key
        for event in events:
            if type(event) is tuple and not self.done and event[1] != "error" \
                    and type(event[0]) is bytes:
                data = event[0]
                try:
                    chunk = loads(data)
                except (ValueError, RecursionError):
                    chunk = None
                if type(chunk) is dict:
                    kind = chunk.get("type")
                    if kind == "response.output_text.delta":
                        text = chunk.get("delta")
                        item_id = chunk.get("item_id")
                        item = by_id.get(item_id) if type(item_id) is str else None
                        if item is not None and not item.done and item.kind != "function_call":
                            if text and type(text) is str:
                                self._content = True
                                if fold is None:
                                    out.append(TextDelta(0, text, stream, key))
                                else:  # no one reads the events: folded unbuilt, in order
                                    if out:
                                        fold.extend(out)
                                        out.clear()
                                    fold.texts(0).append(text)
                                    fold.content_events += 1
                            continue
                    handler = handlers.get(kind) if type(kind) is str else None
                    if handler is not None:
                        handler(self, chunk, data, out)
                        continue
            self.interpret_into(event, out)

    # -- content ------------------------------------------------------------------------

    def _text(self, chunk: dict[str, Any], data: str | bytes, out: list[CoreEvent]) -> None:
        text = chunk.get("delta")
        if not text or type(text) is not str:
            return
        item_id = chunk.get("item_id")
        item = self._by_id.get(item_id) if type(item_id) is str else None
        if (item is not None and not item.done and item.kind != "function_call") \
                or self._content_item(chunk, "output_text.delta", data, out):
            self._content = True
            out.append(TextDelta(0, text, self._stream, self._content_key))

    def _refusal(self, chunk: dict[str, Any], data: str | bytes, out: list[CoreEvent]) -> None:
        text = chunk.get("delta")
        if text and type(text) is str and self._content_item(chunk, "refusal.delta", data, out):
            self._content = True
            out.append(RefusalDelta(0, text, self._stream, self._content_key))

    def _reasoning(self, chunk: dict[str, Any], data: str | bytes, out: list[CoreEvent]) -> None:
        text = chunk.get("delta")
        if text and type(text) is str and self._content_item(chunk, "reasoning delta", data,
                                                              out):
            self._content = True
            out.append(ReasoningDelta(0, text, self._stream, self._content_key))

    def _content_item(self, chunk: dict[str, Any], what: str, data: str | bytes,
                      out: list[CoreEvent]) -> bool:
        """Whether a text-like delta may be kept: not for a done or function-call item."""
        item = self._find(chunk)
        if item is None:
            return True
        if item.done:
            self._skip(f"{what} for item {_short(item.id)} after its output_item.done", data, out)
            return False
        if item.kind == "function_call":
            self._skip(f"{what} for function_call item {_short(item.id)}", data, out)
            return False
        return True

    def _find(self, chunk: dict[str, Any]) -> _Item | None:
        item_id = chunk.get("item_id")
        if type(item_id) is str and item_id:
            return self._by_id.get(item_id)
        output_index = chunk.get("output_index")
        if type(output_index) is int:
            return self._by_output.get(output_index)
        return None

    def _find_call(self, chunk: dict[str, Any], item: dict[str, Any] | None = None
                   ) -> _Item | None:
        """The item a function-call event is for: by ``item_id``; for an ``item_id``
        never announced, the ``function_call`` item its ``call_id`` or its
        ``output_index`` names (GitHub Copilot's stream, passed on by LiteLLM, gives
        every event of one item a fresh ``item_id``: LiteLLM #30071), so the
        arguments are neither lost nor given to a second call."""
        state = self._find(chunk)
        if state is not None:
            return state
        if item is not None:
            known = self._known_call(item)
            if known is not None:
                return known
        output_index = chunk.get("output_index")
        found = self._by_output.get(output_index) if type(output_index) is int else None
        return found if found is not None and found.kind == "function_call" else None

    # -- output items -------------------------------------------------------------------

    def _item_added(self, chunk: dict[str, Any], data: str | bytes, out: list[CoreEvent]) -> None:
        item = chunk.get("item")
        if type(item) is not dict:
            self._skip("output_item.added without an item object", data, out)
            return
        self._open(chunk, item, data, out)

    def _open(self, chunk: dict[str, Any], item: dict[str, Any], data: str | bytes,
              out: list[CoreEvent]) -> _Item | None:
        kind = item.get("type")
        kind = kind if type(kind) is str else "unknown"
        item_id = _str_value(item.get("id"))
        output_index = chunk.get("output_index")
        if output_index is not None:
            output_index = self._index(output_index, "output_index", data, out)
            if output_index is None:
                return None
        known = self._by_id.get(item_id) if item_id else None
        if known is None and item_id is None and output_index is not None:
            known = self._by_output.get(output_index)
        if known is not None and known.kind == kind:
            self.ignored_events += 1  # the same item announced again
            return known
        if self._items >= self._max_blocks:
            self._skip(f"item {_short(item_id or output_index)} would be more than "
                       f"{self._max_blocks} output items", data, out)
            return None
        call_id = _str_value(item.get("call_id")) if kind == "function_call" else None
        prior = self._by_call.get(call_id) if call_id else None
        call = prior.call if prior is not None else None
        if call is None and kind == "function_call" and self._tools >= self._max_tool_calls:
            self._skip(f"function call {_short(item_id or output_index)} would be more than "
                       f"{self._max_tool_calls} tool calls", data, out)
            return None
        state = _Item(kind, item_id)
        self._items += 1
        if item_id:
            self._by_id[item_id] = state
        if output_index is not None:
            self._by_output[output_index] = state
        if not self._role:  # every output item is the assistant's; a message names its role
            role = item.get("role")
            self._role = True
            out.append(ChoiceRole(0, role if role and type(role) is str else "assistant",
                                  self._stream, self._content_key))
        if kind == "function_call":
            self._content = True
            if call_id:
                self._by_call[call_id] = state
            arguments = _arguments_text(item.get("arguments"))
            if call is not None:
                self._continue(state, call, item, arguments, data, out)
                return state
            name = _str_or_none(item.get("name"))
            call = state.call = SplitCall(self._tools, name, self._stream, self._content_key,
                                         self._fold)
            self._tools += 1
            self._calls.append(call)
            state.part = call.open()
            if arguments:
                state.arguments.append(arguments)
                call.arguments.append(arguments)
            out.append(ToolCallDelta(0, call.tool_index, call_id or item_id, "function", name,
                                     arguments, self._stream, self._content_key))
        return state

    def _continue(self, state: _Item, call: SplitCall, item: dict[str, Any], arguments: str,
                  data: str | bytes, out: list[CoreEvent]) -> None:
        """A ``function_call`` item naming the ``call_id`` of an earlier call (under another
        item id) continues that call, as a repeated ``tool_use`` id does on
        ``/v1/messages``: no second call, its fragments go on the first call's
        arguments, the first name is kept."""
        name = _str_or_none(item.get("name"))
        if name and call.name and name != call.name:
            self._skip(f"function_call item {_short(state.id)} repeats the call_id of tool "
                       f"call {call.tool_index} under another name ({_short(name)}): the call "
                       f"keeps its first name ({_short(call.name)})", data, out)
        self.continued_items += 1
        state.call = call
        state.part = call.open()
        if name and not call.name:  # the first item had none: this one names the call
            call.name = name
            out.append(ToolCallDelta(0, call.tool_index, None, None, name, "", self._stream,
                                     self._content_key))
        if arguments:
            state.arguments.append(arguments)
            call.add(state.part, arguments, out)

    def _item_done(self, chunk: dict[str, Any], data: str | bytes, out: list[CoreEvent]) -> None:
        item = chunk.get("item")
        if type(item) is not dict:
            self._skip("output_item.done without an item object", data, out)
            return
        item_id = _str_value(item.get("id"))
        state = self._by_id.get(item_id) if item_id else self._find(chunk)
        if state is None and item.get("type") == "function_call":
            state = self._find_call(chunk, item)
        if state is None:
            if item.get("type") != "function_call":
                return  # a message item seen only at its end: its text came as deltas or not
            state = self._open(chunk, item, data, out)  # a call announced only whole
            if state is None:
                return
        elif state.done:
            if not (item_id and item_id != state.id and state.kind == "function_call"
                    and _str_value(item.get("call_id")) in self._by_call):
                self.ignored_events += 1
                return
            # a call's next item, seen only at its end (another id, the same call_id)
            state = self._open(chunk, item, data, out)
            if state is None:
                return
        if state.kind == "function_call" and not state.final:
            self._whole_arguments(state, item.get("arguments"), "output_item.done", data, out)
        state.done = True
        if state.call is not None and state.part is not None:
            self.ignored_events += state.call.stop(state.part, out)

    def _arguments(self, chunk: dict[str, Any], data: str | bytes, out: list[CoreEvent]) -> None:
        fragment = chunk.get("delta")
        item_id = chunk.get("item_id")
        state = self._by_id.get(item_id) if type(item_id) is str else None
        if state is None or state.done or state.kind != "function_call":
            state = self._call(chunk, "function_call_arguments.delta", data, out)
            if state is None:
                return
        if fragment and type(fragment) is str and state.call is not None \
                and state.part is not None:
            state.arguments.append(fragment)
            state.call.add(state.part, fragment, out)

    def _arguments_done(self, chunk: dict[str, Any], data: str | bytes,
                        out: list[CoreEvent]) -> None:
        state = self._call(chunk, "function_call_arguments.done", data, out)
        if state is not None:
            self._whole_arguments(state, chunk.get("arguments"), "function_call_arguments.done",
                                  data, out)

    def _call(self, chunk: dict[str, Any], what: str, data: str | bytes,
              out: list[CoreEvent]) -> _Item | None:
        state = self._find_call(chunk)
        where = _short(chunk.get("item_id") or chunk.get("output_index"))
        if state is None:
            self._skip(f"{what} for item {where}, which was never added", data, out)
            return None
        if state.kind != "function_call":
            self._skip(f"{what} for item {where}, a {_short(state.kind)} item", data, out)
            return None
        if state.done:
            self._skip(f"{what} for item {where} after its output_item.done", data, out)
            return None
        return state

    def _whole_arguments(self, state: _Item, value: Any, what: str, data: str | bytes,
                         out: list[CoreEvent]) -> None:
        whole = _arguments_text(value)
        state.final = True
        streamed = "".join(state.arguments)
        if not streamed:
            if whole and state.call is not None and state.part is not None:
                state.arguments.append(whole)
                state.call.add(state.part, whole, out)
        elif whole and whole != streamed:
            self._skip(f"{what} for item {_short(state.id)} differs from its deltas "
                       "(the deltas are kept)", data, out)

    # -- the response -------------------------------------------------------------------

    def _created(self, chunk: dict[str, Any], data: str | bytes, out: list[CoreEvent]) -> None:
        response = chunk.get("response")
        if type(response) is dict:
            self._info(response.get("id"), response.get("model"), out)

    def _completed(self, chunk: dict[str, Any], data: str | bytes, out: list[CoreEvent]) -> None:
        self._terminal(chunk, data, True, out)

    def _incomplete(self, chunk: dict[str, Any], data: str | bytes, out: list[CoreEvent]) -> None:
        self._terminal(chunk, data, False, out)

    def _terminal(self, chunk: dict[str, Any], data: str | bytes, completed: bool,
                  out: list[CoreEvent]) -> None:
        """A terminal event's ``response.status`` outranks its type: a relay that bridges
        another API may close a failed or cut response with ``response.completed``."""
        response = chunk.get("response")
        status = response.get("status") if type(response) is dict else None
        if status == "failed":
            self._failed(chunk, data, out)
        elif status == "cancelled":
            out.append(ErrorReported(StreamError(
                f"the response was cancelled ({_short_type(chunk)} with status cancelled)",
                "response.cancelled"), self._stream, self._content_key))
        else:
            self._finish(chunk, completed and status != "incomplete", out)

    def _finish(self, chunk: dict[str, Any], completed: bool, out: list[CoreEvent]) -> None:
        response = chunk.get("response")
        if type(response) is not dict:
            response = {}
        self._info(response.get("id"), response.get("model"), out)
        for call in self._calls:  # the content ended: held fragments go out
            call.flush(out)
        output = response.get("output")
        if output and type(output) is list:
            if not self._content:
                self._replay(output, out)
            else:
                unseen = [item for item in output if self._unseen_call(item)]
                if unseen:
                    self._replay(unseen, out)
        usage = response.get("usage")
        if usage and type(usage) is dict:
            out.append(UsageReported(responses_usage(usage), self._stream, self._content_key))
        if completed:
            calls = self._tools > 0 or (type(output) is list and any(
                type(item) is dict and item.get("type") == "function_call" for item in output))
            finish, native = ("tool_calls" if calls else "stop"), "completed"
        else:
            details = response.get("incomplete_details")
            reason = details.get("reason") if type(details) is dict else None
            native = str(reason) if reason else "incomplete"
            finish = INCOMPLETE_REASONS.get(native, native)
        out.append(ChoiceFinished(0, finish, self._stream, self._content_key,
                                  native_finish_reason=native))
        self.done = True
        out.append(DoneReceived(self._stream, self._content_key))

    def _replay(self, output: list[Any], out: list[CoreEvent]) -> None:
        """The terminal event's output, when no delta streamed any of it (a relay that
        sends only the lifecycle events): read as the deltas would have been."""
        replay = ResponsesInterpreter(stream=self._stream, content_key=self._content_key,
                                      max_tool_calls=self._max_tool_calls,
                                      max_blocks=self._max_blocks)
        replay._role = self._role
        replay._tools, replay._items = self._tools, self._items  # the caps hold overall
        for frame in _output_frames(output):
            replay._handlers[frame["type"]](replay, frame, "", out)
        self._tools = replay._tools
        self._role = replay._role

    def _known_call(self, item: dict[str, Any]) -> _Item | None:
        """The ``function_call`` item already announced that ``item`` names by its ``id``
        or ``call_id``, either way round: llama.cpp's ``/v1/responses`` announces a
        call as ``{"id": "fc_X", "call_id": "call_X"}`` and closes it (and lists it in
        ``response.completed``) as ``{"call_id": "fc_X"}``, with no ``id``."""
        for key in (_str_value(item.get("id")), _str_value(item.get("call_id"))):
            if key:
                found = self._by_id.get(key) or self._by_call.get(key)
                if found is not None and found.kind == "function_call":
                    return found
        return None

    def _unseen_call(self, item: Any) -> bool:
        """A ``function_call`` of the terminal event's output that no event announced (a
        bridge that lists, in ``response.completed``, a call it never streamed: LiteLLM
        #36375): read from the output, so ``tool_calls`` never comes without its call.
        Message items are not: their text may have streamed under another id."""
        if type(item) is not dict or item.get("type") != "function_call":
            return False
        if self._known_call(item) is not None:
            return False
        # vLLM #47916: the output may give a streamed call a new id and call_id; the same
        # name and arguments are the same call (running it twice is worse than missing it).
        name, arguments = _str_or_none(item.get("name")), _arguments_text(item.get("arguments"))
        return not any(call.name == name and "".join(call.arguments) == arguments
                       for call in self._calls)

    def _failed(self, chunk: dict[str, Any], data: str | bytes, out: list[CoreEvent]) -> None:
        response = chunk.get("response")
        if type(response) is not dict:
            response = {}
        self._info(response.get("id"), response.get("model"), out)
        error = response.get("error")
        if error and type(error) is dict:
            out.append(ErrorReported(self._error(error), self._stream, self._content_key))
        else:
            out.append(ErrorReported(StreamError("the response failed (response.failed)",
                                                 "response.failed"),
                                     self._stream, self._content_key))

    def _error_event(self, chunk: dict[str, Any], data: str | bytes, out: list[CoreEvent]) -> None:
        self._report_error(chunk, out)

    def _error(self, payload: Any) -> StreamError:
        if type(payload) is dict and type(payload.get("error")) is not dict:
            # {"type": "error", "code": ..., "message": ...}; or response.error {code, message}
            message = payload.get("message")
            code = payload.get("code")
            kind = payload.get("type")
            if type(message) is str and message:
                return StreamError(message, None if kind == "error" else _str_or_none(kind),
                                   None if code is None else str(code))
        return super()._error(payload)


def _short_type(chunk: dict[str, Any]) -> str:
    kind = chunk.get("type")
    return kind[:60] if type(kind) is str else "the terminal event"


def _nothing(interpreter: object, chunk: dict[str, Any], data: str | bytes,
             out: list[CoreEvent]) -> None:
    return None


def _arguments_text(value: Any) -> str:
    if value is None:
        return ""
    if type(value) is str:
        return value
    return json.dumps(value, ensure_ascii=False)  # some relays send the arguments as JSON


def responses_usage(usage: dict[str, Any]) -> Usage:
    """A Responses ``usage`` object in fanout's terms; ``raw`` keeps it whole."""
    prompt = _int_or_none(usage.get("input_tokens"))
    completion = _int_or_none(usage.get("output_tokens"))
    total = _int_or_none(usage.get("total_tokens"))
    if total is None and prompt is not None and completion is not None:
        total = prompt + completion
    return Usage(prompt, completion, total, usage)


def responses_body_events(payload: Any, stream: str = "", content_key: str = "",
                          redactor: Redactor | None = None) -> list[CoreEvent]:
    """The events a non-streamed ``response`` object stands for.

    Its ``output`` items are replayed as the stream would have sent them, then
    its ``status``: ``completed`` / ``incomplete`` end it (``DoneReceived``),
    ``failed`` is an error; any other status (``in_progress``) leaves it
    unfinished.  An ``error`` body is an error; anything else one ``FrameSkipped``.
    """
    if redactor:
        payload = redactor.value(payload)
    if type(payload) is not dict or type(payload.get("output")) is not list:
        if type(payload) is dict and payload.get("error"):
            interpreter = ResponsesInterpreter(stream=stream, content_key=content_key)
            return [ErrorReported(interpreter._error(payload.get("error")
                                                     if type(payload.get("error")) is dict
                                                     else payload), stream, content_key)]
        return [FrameSkipped("the body is neither a stream nor a Responses response object",
                             _compact(payload, 200), stream, content_key)]
    interpreter = ResponsesInterpreter(stream=stream, content_key=content_key)
    out: list[CoreEvent] = []
    frames = [{"type": "response.created", "response": payload}, *_output_frames(payload["output"])]
    status = payload.get("status")
    if status in ("completed", "incomplete", "failed"):
        frames.append({"type": f"response.{status}", "response": payload})
    for frame in frames:
        interpreter.interpret_into(ServerSentEvent(json.dumps(frame)), out)
    return out


def _output_frames(output: list[Any]) -> list[dict[str, Any]]:
    """A ``response.output`` list as the events that would have streamed it."""
    frames: list[dict[str, Any]] = []
    for position, item in enumerate(output):
        if type(item) is not dict:
            continue
        head = {"output_index": position, "item_id": _str_value(item.get("id"))
                or f"item_{position}"}
        added = {**item, "id": head["item_id"]}
        kind = item.get("type")
        if kind == "function_call":
            added["arguments"] = ""
        frames.append({"type": "response.output_item.added", "output_index": position,
                       "item": added})
        parts: list[tuple[str, Any]] = []
        if kind == "message" and type(item.get("content")) is list:
            for part in item["content"]:
                if type(part) is dict and part.get("type") == "output_text":
                    parts.append(("response.output_text.delta", part.get("text")))
                elif type(part) is dict and part.get("type") == "refusal":
                    parts.append(("response.refusal.delta", part.get("refusal")))
        elif kind == "reasoning":
            for field in ("summary", "content"):
                parts.extend(("response.reasoning_text.delta", part.get("text"))
                             for part in item.get(field) or () if type(part) is dict)
        elif kind == "function_call":
            parts.append(("response.function_call_arguments.delta",
                          _arguments_text(item.get("arguments"))))
        frames.extend({"type": name, **head, "delta": text} for name, text in parts)
        frames.append({"type": "response.output_item.done", "output_index": position,
                       "item": added if kind != "function_call" else {
                           **added, "arguments": _arguments_text(item.get("arguments"))}})
    return frames


#: ``ResponsesInterpreter``'s handlers (see ``Handler``).
_HANDLERS: dict[str, Handler] = {
    "response.output_text.delta": ResponsesInterpreter._text,
    "response.refusal.delta": ResponsesInterpreter._refusal,
    "response.reasoning_text.delta": ResponsesInterpreter._reasoning,
    "response.reasoning_summary_text.delta": ResponsesInterpreter._reasoning,
    "response.function_call_arguments.delta": ResponsesInterpreter._arguments,
    "response.function_call_arguments.done": ResponsesInterpreter._arguments_done,
    "response.output_item.added": ResponsesInterpreter._item_added,
    "response.output_item.done": ResponsesInterpreter._item_done,
    "response.created": ResponsesInterpreter._created,
    "response.in_progress": ResponsesInterpreter._created,
    "response.queued": ResponsesInterpreter._created,
    "response.completed": ResponsesInterpreter._completed,
    "response.incomplete": ResponsesInterpreter._incomplete,
    "response.failed": ResponsesInterpreter._failed,
    "error": ResponsesInterpreter._error_event,
    **dict.fromkeys(_SILENT, _nothing),
}
