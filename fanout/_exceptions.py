"""fanout's exceptions.

Expected failures of a stream (HTTP errors, timeouts, truncation, malformed
frames in resilient mode) are *data*: they end up on ``StreamResult.outcome``
and ``StreamResult.error``, never as exceptions.  The classes below are raised
only where the caller asked for it (strict mode) or passed a bad argument::

    FanoutError
    ├── ConfigError             a config file (or its environment) is wrong
    └── ProtocolError           the upstream broke the wire protocol
        ├── EventTooLarge       one SSE event grew past ``max_event_size``
        ├── ResponseTooLarge    the body grew past ``max_response_bytes``
        └── MalformedFrame      strict mode: an event's data is not a JSON object
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, final

if TYPE_CHECKING:
    from .core._sse_event import ServerSentEvent

__all__ = [
    "ConfigError",
    "EventTooLarge",
    "FanoutError",
    "MalformedFrame",
    "ProtocolError",
    "ResponseTooLarge",
]


class FanoutError(Exception):
    """Base class of every exception fanout raises on purpose."""


@final
class ConfigError(FanoutError):
    """A config file (or a file it names, or the environment) is wrong.

    The message is one line per problem (a file with several mistakes reports
    every one of them at once), each naming the file and the table or key at
    fault; it never contains a secret.  ``problems`` lists the lines.
    """

    @property
    def problems(self) -> list[str]:
        return str(self).splitlines()


class ProtocolError(FanoutError):
    """The upstream sent bytes that break the SSE or chat-chunk protocol."""


@final
class EventTooLarge(ProtocolError):
    """A single server-sent event grew past the decoder's ``max_event_size``."""

    def __init__(self, size: int, limit: int, events: Sequence[ServerSentEvent] = ()) -> None:
        super().__init__(
            f"server-sent event of at least {size} characters exceeds "
            f"max_event_size={limit}; the stream was stopped"
        )
        self.size = size
        self.limit = limit
        #: The events the failing ``feed()`` call completed before the limit:
        #: data already received is never lost.
        self.events = list(events)


@final
class ResponseTooLarge(ProtocolError):
    """The response body grew past the parser's ``max_response_bytes``."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            f"response body of at least {size} bytes exceeds "
            f"max_response_bytes={limit}; the stream was stopped"
        )
        self.size = size
        self.limit = limit


@final
class MalformedFrame(ProtocolError):
    """Strict mode only: an event's data is neither ``[DONE]`` nor a JSON object.

    ``data`` holds the frame (cut to 200 characters), ``reason`` says what is wrong.
    """

    def __init__(self, reason: str, data: str) -> None:
        self.reason = reason
        self.data = data[:200]
        super().__init__(f"malformed frame ({reason}): {self.data!r}")
