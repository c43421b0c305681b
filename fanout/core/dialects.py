"""The stream dialects fanout reads, by name: ``chat``, ``responses``, ``anthropic``.

``StreamParser(api=...)`` picks its interpreter, its terminal event and its
reader of non-streamed bodies here.  An unknown name is a ``ValueError``
naming the known ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Protocol

from .anthropic import AnthropicInterpreter, anthropic_body_events
from .chat import MAX_TOOL_CALLS, ChatChunkInterpreter, completion_events
from .events import CoreEvent
from .redact import Redactor
from .responses import ResponsesInterpreter, responses_body_events

if TYPE_CHECKING:
    from .accumulate import Accumulator

__all__ = ["DIALECTS", "Interpreter", "body_events", "check_api", "make_interpreter",
           "terminal_event"]

DIALECTS: Final = ("chat", "responses", "anthropic")
"""The dialect names, the default first."""

_TERMINAL: Final = {"chat": "[DONE]", "responses": ResponsesInterpreter.terminal,
                    "anthropic": AnthropicInterpreter.terminal}

BodyEvents = Callable[[Any, str, str, Redactor | None], list[CoreEvent]]
_BODIES: Final[dict[str, BodyEvents]] = {
    "chat": completion_events,
    "responses": responses_body_events,
    "anthropic": anthropic_body_events,
}


class Interpreter(Protocol):
    """What a parser needs of a dialect's interpreter."""

    strict: bool
    done: bool
    ignored_after_done: int

    def interpret_into(self, event: Any, out: list[CoreEvent]) -> None:
        """``event``: a ``ServerSentEvent``, a ``str`` (a ``message`` event's data) or,
        for the Responses and Anthropic dialects, a ``(data, name)`` pair."""

    def interpret_all(self, events: Any, out: list[CoreEvent],
                      fold: Accumulator | None = None) -> None:
        """``interpret_into`` over ``events``; content may go straight into ``fold``."""


def check_api(api: str) -> str:
    """``api`` if it names a dialect, else ``ValueError`` saying which do."""
    if api not in _TERMINAL:
        raise ValueError(f"unknown api {api!r}: expected one of {', '.join(DIALECTS)}")
    return api


def make_interpreter(api: str, *, strict: bool = False, stream: str = "", content_key: str = "",
                     redactor: Redactor | None = None, max_choices: int = 128,
                     max_tool_calls: int = MAX_TOOL_CALLS) -> Interpreter:
    """A new interpreter for one stream of dialect ``api``.

    ``max_choices`` applies to chat only (the other dialects have one choice).
    """
    check_api(api)
    if api == "responses":
        return ResponsesInterpreter(strict=strict, stream=stream, content_key=content_key,
                                    redactor=redactor, max_tool_calls=max_tool_calls)
    if api == "anthropic":
        return AnthropicInterpreter(strict=strict, stream=stream, content_key=content_key,
                                    redactor=redactor, max_tool_calls=max_tool_calls)
    return ChatChunkInterpreter(strict=strict, stream=stream, content_key=content_key,
                                redactor=redactor, max_choices=max_choices,
                                max_tool_calls=max_tool_calls)


def terminal_event(api: str) -> str:
    """The name of the event that completes a stream of dialect ``api`` (for reasons)."""
    return _TERMINAL[check_api(api)]


def body_events(api: str, payload: Any, stream: str = "", content_key: str = "",
                redactor: Redactor | None = None) -> list[CoreEvent]:
    """The events a non-streamed JSON body of dialect ``api`` stands for."""
    return _BODIES[check_api(api)](payload, stream, content_key, redactor)
