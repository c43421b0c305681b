"""Fault models of the connection, not of the body: servers that give up on keep-alive
connections without saying so, and error responses whose body is an event stream.

- ``fault/close-after-response`` answers as ``mock/fast``, then closes the
  connection when the next request arrives on it (read whole, never
  answered), or after ``:SECONDS`` idle (default 5), with no
  ``Connection: close`` to warn the client.  The native llama.cpp server
  closes every connection a few milliseconds after a streamed response; a
  request a client sends on that pooled connection in the meantime gets no
  status line.  Here that race is lost every time a connection is reused
  within the window.  ``:reset`` resets the connection (TCP RST) at the
  request's first bytes instead (``Connection reset by peer``);
  ``:0.005:reset`` gives both.
- ``fault/close-idle`` answers as ``mock/fast`` and, after each response,
  with probability ``:P`` (default 0.5), closes the connection the same way
  at the next request on it; otherwise keeps it.  ``:P:SEED`` (default seed
  0): each draw is seeded from the seed, the conversation and its attempt
  number, so a run decides the same whatever the order of its requests.
- ``fault/sse-500`` answers 500 with a ``text/event-stream`` body: the
  route's error payload as one SSE event (``data: {"error": ...}``,
  ``event: error`` on ``/v1/messages``), as relays that stream their
  errors do.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import orjson

from .corpus import rng_for
from .models import SSE_HEADERS, Context, ModelSpec, _scripted
from .plans import ChatRequest, CloseAfter, Plan

__all__ = ["CONNECTION_MODELS"]


def _close_after_response(request: ChatRequest, context: Context) -> Plan:
    within = 5.0
    reset = False
    for arg in request.args:
        if arg == "reset":
            reset = True
            continue
        try:
            seconds = float(arg)
        except ValueError:
            continue
        if seconds > 0:
            within = seconds
    plan = _scripted("text", cadence_arg=False)(request, context)
    return attrs.evolve(plan, close_after=CloseAfter(within, reset))


def _close_idle(request: ChatRequest, context: Context) -> Plan:
    chance, seed = 0.5, 0
    try:
        if request.args and request.args[0]:
            chance = min(1.0, max(0.0, float(request.args[0])))
        if len(request.args) > 1 and request.args[1]:
            seed = int(request.args[1])
    except ValueError:
        pass
    attempt = context.attempt(request)
    plan = _scripted("text", cadence_arg=False)(request, context)
    if rng_for("close-idle", seed, request.conversation, attempt).random() < chance:
        return attrs.evolve(plan, close_after=CloseAfter())
    return plan


def _sse_500(request: ChatRequest, context: Context) -> Plan:
    message = "The server had an error while processing your request."
    if request.api == "anthropic":
        payload = {"type": "error", "error": {"type": "api_error", "message": message}}
        body = b"event: error\ndata: " + orjson.dumps(payload) + b"\n\n"
    else:
        payload = {"error": {"message": message, "type": "server_error", "param": None,
                             "code": "internal_error"}}
        body = b"data: " + orjson.dumps(payload) + b"\n\n"
    return Plan(500, SSE_HEADERS, body)


_SPECS: list[tuple[str, str, Callable[[ChatRequest, Context], Plan]]] = [
    ("fault/close-after-response",
     "mock/fast, then the connection closed unannounced when the next request arrives on it "
     "(read, never answered) or after :SECONDS idle (default 5), as the native llama.cpp "
     "server does; :reset resets it instead", _close_after_response),
    ("fault/close-idle",
     "mock/fast; after each response, with probability :P (default 0.5), the connection closed "
     "unannounced at the next request on it (:P:SEED, default seed 0)", _close_idle),
    ("fault/sse-500",
     "500 with a text/event-stream body: data: {\"error\": ...} (event: error on "
     "/v1/messages)", _sse_500),
]

CONNECTION_MODELS: dict[str, ModelSpec] = {
    name: ModelSpec(name, description, plan) for name, description, plan in _SPECS}
