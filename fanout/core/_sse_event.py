"""One dispatched server-sent event: a value of its own, so that the exceptions
(``fanout._exceptions``, which ``sse.py`` raises) can name it without importing
the decoder."""

from __future__ import annotations

import attrs

__all__ = ["ServerSentEvent"]


@attrs.frozen(slots=True)
class ServerSentEvent:
    """One dispatched event.

    ``event`` is ``"message"`` when no ``event:`` field was set; ``data`` is the
    block's ``data`` lines joined with ``\\n``; ``id`` is the last event ID in
    force at dispatch (``""`` if none); ``retry`` is the reconnection time in
    milliseconds if this event's block set a valid one, else ``None``.
    """

    data: str = ""
    event: str = "message"
    id: str = ""
    retry: int | None = None
