"""Requests in, plans out: the embedded upstream's protocol logic, without sockets.

A ``Plan`` is what the server will do for one request: a status, headers,
and either a fixed body or a lazy sequence of steps (``Send`` bytes,
``Pause``, ``Hang`` with the socket open, ``Abort`` the connection), and
what becomes of the connection after a whole response (``CloseAfter``).  A
``raw`` plan's steps are the bytes of the whole response, status line and
headers included (a server that never answers, or never ends its headers);
a ``gzip`` plan's body is compressed as it is written.  The
server (``server.py``) executes plans; everything that decides *what* to
send lives here and in ``models.py``, and is tested without a socket.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any, TypeAlias

import attrs
import orjson

__all__ = [
    "Abort",
    "ChatRequest",
    "CloseAfter",
    "Hang",
    "Pause",
    "Plan",
    "RequestError",
    "Send",
    "Step",
    "error_plan",
    "json_plan",
    "parse_chat_request",
]


@attrs.frozen
class Send:
    """Write these bytes of the body (the server may split them: see fragment.py).

    ``terminal``: these bytes are the dialect's end-of-stream event (``[DONE]``,
    ``response.completed``, ``message_stop``), which some faults leave out.
    """

    data: bytes
    terminal: bool = False


@attrs.frozen
class Pause:
    """Wait this many seconds before the next step."""

    seconds: float


@attrs.frozen
class Hang:
    """Send nothing more; keep the connection open until the client goes away."""


@attrs.frozen
class Abort:
    """Close the connection now, without ending the body.

    With ``partial_chunk``, first start an HTTP chunk that announces twice its
    length and send only these bytes: the socket dies mid-chunk.
    """

    partial_chunk: bytes | None = None


Step: TypeAlias = Send | Pause | Hang | Abort


@attrs.frozen
class CloseAfter:
    """After a whole response, close the connection without having said so.

    The response carries no ``Connection: close``, so the client pools the
    connection.  The server closes it when the next request on it arrives
    (read whole, never answered) or after ``within`` seconds idle, whichever
    comes first: the race a server loses that closes its connections a few
    milliseconds after each response (the native llama.cpp server), made to
    happen every time.  A close while idle, before any request, is what a
    client's pool sees before reuse and does not need a mode.  ``reset``: a
    TCP reset (``SO_LINGER`` 0) instead of a clean close, as soon as the next
    request's first bytes arrive.
    """

    within: float = attrs.field(default=5.0, validator=attrs.validators.gt(0))
    reset: bool = False


@attrs.frozen
class Plan:
    """One response.  ``steps`` (streamed, chunked) or ``body`` (Content-Length).

    ``raw``: the steps are written to the socket as they are, with no status
    line, headers or chunked framing of the server's (``status`` and
    ``headers`` are ignored), and the connection is closed after them.
    ``gzip``: the server gzips the streamed body as it writes it (each write
    sync-flushed, so it inflates as it arrives) and says so in
    ``content-encoding``, whatever the request's ``Accept-Encoding``.
    ``close_after``: what becomes of the connection after a whole response
    (by default it stays open for the next request, as HTTP/1.1 says).
    """

    status: int
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""
    steps: Iterable[Step] | None = None
    fragment: str | None = None  # the request's choice, else the server's
    raw: bool = False
    gzip: bool = False
    close_after: CloseAfter | None = None


class RequestError(Exception):
    """A request the upstream refuses with 400, naming the field at fault."""

    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def json_plan(status: int, payload: Any, headers: tuple[tuple[str, str], ...] = ()) -> Plan:
    return Plan(status, (("content-type", "application/json"), *headers), orjson.dumps(payload))


def error_plan(status: int, message: str, type_: str, *, param: str | None = None,
               code: str | None = None, headers: tuple[tuple[str, str], ...] = ()) -> Plan:
    """An OpenAI-style JSON error response."""
    error = {"message": message, "type": type_, "param": param, "code": code}
    return json_plan(status, {"error": error}, headers)


@attrs.frozen
class ChatRequest:
    """A validated ``POST /v1/chat/completions`` with fanout's own controls.

    ``model`` is the id as sent; ``name`` the registered model it names;
    ``args`` what followed ``:`` (``fault/429:3`` -> ``("3",)``); ``fragment``
    what followed ``@`` or the ``X-Fanout-Fragment`` header; ``api_key`` the
    bearer token of the ``Authorization`` header (only ``fault/echo-key``
    uses it, to echo it back; never in a repr; Anthropic's ``x-api-key``).
    The other routes' requests are made into this same shape (``api`` says
    which route), so a model plans one answer for all of them.
    """

    model: str
    name: str
    args: tuple[str, ...]
    messages: tuple[Mapping[str, Any], ...]
    stream: bool = False
    n: int = 1
    max_tokens: int | None = None
    include_usage: bool = False
    tools: tuple[Mapping[str, Any], ...] = ()
    tool_choice: Any = None
    seed: int | None = None
    fragment: str | None = None
    cadence: float | None = None  # X-Fanout-Cadence: seconds between chunks
    tokens: int | None = None  # X-Fanout-Tokens: answer length before max_tokens
    delay: float | None = None  # X-Fanout-Delay: the slow fault's delay
    retry_after: float = 1.0  # X-Fanout-Retry-After: seconds, for fault/429
    api_key: str | None = attrs.field(default=None, repr=False)
    #: The route it came by: "chat", "responses" (/v1/responses) or "anthropic" (/v1/messages).
    api: str = "chat"
    #: The JSON body as it arrived (``mock/echo-request`` sends it back).
    body: Mapping[str, Any] = attrs.field(factory=dict, eq=False, repr=False)

    @property
    def prompt(self) -> str:
        """The text of the last user message (text parts joined)."""
        for message in reversed(self.messages):
            if message.get("role") == "user":
                return _text_of(message.get("content"))
        return _text_of(self.messages[-1].get("content")) if self.messages else ""

    @property
    def conversation(self) -> str:
        """A stable key of what was asked: retries of one request share it (the same
        question by another route is another conversation)."""
        asked: list[Any] = [self.model, self.messages, self.seed]
        if self.api != "chat":
            asked.append(self.api)
        blob = json.dumps(asked, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @property
    def prompt_tokens(self) -> int:
        return sum(len(_text_of(m.get("content")).split()) + 4 for m in self.messages)


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, Mapping))
    return ""


def parse_chat_request(body: bytes, headers: Mapping[str, str]) -> ChatRequest:
    """Validate a chat-completions body; raise ``RequestError`` naming the bad field."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        raise RequestError("We could not parse the JSON body of your request.", None) from None
    if not isinstance(data, dict):
        raise RequestError("The request body must be a JSON object.", None)
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise RequestError("you must provide a model parameter", "model")
    if "messages" not in data:
        raise RequestError("Missing required parameter: 'messages'.", "messages")
    messages = data["messages"]
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty array.", "messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError(f"messages[{i}] must be an object with a 'role'.",
                               f"messages[{i}]")
    stream = data.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError(f"'stream' must be a boolean, not {stream!r}.", "stream")
    n = _int_field(data, "n", 1, low=1, high=16)
    max_tokens = data.get("max_tokens", data.get("max_completion_tokens"))
    if max_tokens is not None:
        max_tokens = _int_field(data, "max_tokens" if "max_tokens" in data
                                else "max_completion_tokens", None, low=1)
    options = data.get("stream_options")
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise RequestError("'stream_options' must be an object.", "stream_options")
    tools = data.get("tools")
    if tools is None:
        tools = []
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise RequestError("'tools' must be an array of objects.", "tools")
    for name in ("temperature", "top_p"):
        value = data.get(name)
        if value is not None and (not isinstance(value, int | float) or isinstance(value, bool)):
            raise RequestError(f"'{name}' must be a number, not {value!r}.", name)
    seed = data.get("seed")
    base, _, fragment = model.partition("@")
    name, *args = base.split(":")
    return ChatRequest(
        model=model,
        name=name,
        args=tuple(args),
        messages=tuple(messages),
        stream=stream,
        n=n or 1,
        max_tokens=max_tokens,
        include_usage=bool(options.get("include_usage")),
        tools=tuple(tools),
        tool_choice=data.get("tool_choice"),
        seed=seed if isinstance(seed, int) and not isinstance(seed, bool) else None,
        fragment=headers.get("x-fanout-fragment") or fragment or None,
        cadence=_header_float(headers, "x-fanout-cadence"),
        tokens=_header_int(headers, "x-fanout-tokens"),
        delay=_header_float(headers, "x-fanout-delay"),
        retry_after=_header_float(headers, "x-fanout-retry-after") or 1.0,
        api_key=_bearer(headers.get("authorization")),
        body=data,
    )


def _bearer(header: str | None) -> str | None:
    """The token of ``Authorization: Bearer <token>`` (any other scheme: the whole value)."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip() if scheme.lower() == "bearer" else header.strip()
    return token or None


def _int_field(data: Mapping[str, Any], name: str, default: int | None, *, low: int,
               high: int | None = None) -> int | None:
    value = data.get(name, default)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < low or (
        high is not None and value > high
    ):
        bounds = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise RequestError(f"'{name}' must be an integer {bounds}, not {value!r}.", name)
    return value


def _header_float(headers: Mapping[str, str], name: str) -> float | None:
    value = headers.get(name)
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        raise RequestError(f"header {name}: {value!r} is not a number", name) from None
    if number < 0:
        raise RequestError(f"header {name}: {value!r} is negative", name)
    return number


def _header_int(headers: Mapping[str, str], name: str) -> int | None:
    number = _header_float(headers, name)
    return None if number is None else max(1, int(number))
