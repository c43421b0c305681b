"""What a fan-out is asked to do: one endpoint, many stream requests, their deadlines and retries.

Values only (attrs, frozen, validated at construction: a bad argument fails
there, naming the field).  The API key lives in ``Endpoint`` and nowhere
else; it is left out of every repr and of ``content_key``.
"""

from __future__ import annotations

import email.utils
import hashlib
import json
import math
import random
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
from attrs import validators as v

from .bodies import APIS, build_body, check_api, refused_param
from .core.redact import Redactor
from .core.sse import DEFAULT_MAX_EVENT_SIZE

__all__ = [
    "ANTHROPIC_VERSION",
    "APIS",
    "DEFAULT_MAX_RESPONSE_BYTES",
    "Deadlines",
    "Endpoint",
    "RetryPolicy",
    "StreamRequest",
    "StreamSettings",
    "content_key",
]

#: 64 MiB: an endless stream ends there with its output kept (a long answer is ~100 KiB).
DEFAULT_MAX_RESPONSE_BYTES = 64 * 1024 * 1024

#: The ``anthropic-version`` header sent to an Anthropic endpoint (its ``headers`` may override).
ANTHROPIC_VERSION = "2023-06-01"

#: Where each dialect's requests go, under the base URL.
_PATHS = {"chat": "/chat/completions", "responses": "/responses", "anthropic": "/messages"}


def _positive_or_none(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0 or (
        math.isnan(value)
    ):
        raise ValueError(f"{attribute.name} must be a positive number of seconds or None, "
                         f"not {value!r}")


def _nonempty_str(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{attribute.name} must be a non-empty string, not {value!r}")


def _messages(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    for index, message in enumerate(value):
        if not isinstance(message, Mapping):
            raise ValueError(f"messages[{index}] must be a mapping, not {message!r}")


def _base_url(url: object) -> str:
    return str(url).rstrip("/")


def _api(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    check_api(value, attribute.name)


def _optional_api(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None:
        check_api(value, attribute.name)


# Typed converters: with a bare ``tuple``/``dict`` converter, type checkers cannot
# infer what ``__init__`` accepts, and a typed caller passing a list gets an error.
def _str_dict(value: Mapping[str, str]) -> dict[str, str]:
    return dict(value)


def _any_dict(value: Mapping[str, Any]) -> dict[str, Any]:
    return dict(value)


def _statuses(value: Iterable[int]) -> frozenset[int]:
    return frozenset(value)


def _messages_tuple(value: Iterable[Mapping[str, Any]]) -> tuple[Mapping[str, Any], ...]:
    return tuple(value)


def _tags(value: Iterable[str]) -> frozenset[str]:
    if isinstance(value, str):
        return frozenset((value,))
    return frozenset(value)


def _tools_tuple(value: Iterable[Mapping[str, Any]] | None
                 ) -> tuple[Mapping[str, Any], ...] | None:
    return None if value is None else tuple(value)


@attrs.frozen
class Endpoint:
    """One relay: a base URL ending in ``/v1``, one key, and the dialect it speaks.

    ``repr`` never shows the key; neither does anything fanout prints,
    records or raises.  ``require_finish_reason=False`` is for a relay known
    to omit finish reasons: its streams complete on ``[DONE]`` alone (flagged
    ``no_finish_reason``), where normally ``[DONE]`` without any finish reason
    is a cut stream (``truncated``).

    ``key_env``: where the key came from, named when the endpoint refuses it.

    ``api``: the dialect of its streams unless a request says otherwise:
    ``"chat"`` (``POST {base_url}/chat/completions``, the key in
    ``Authorization: Bearer``), ``"responses"`` (``/responses``, the same
    header) or ``"anthropic"`` (``/messages``, the key in ``x-api-key`` with
    ``anthropic-version: 2023-06-01``, which ``headers`` may override).
    """

    base_url: str = attrs.field(converter=_base_url)
    api_key: str | None = attrs.field(default=None, repr=False,
                                      validator=v.optional(v.instance_of(str)))
    headers: Mapping[str, str] = attrs.field(factory=dict, converter=_str_dict)
    require_finish_reason: bool = attrs.field(default=True, validator=v.instance_of(bool))
    api: str = attrs.field(default="chat", validator=_api)
    #: The name of the environment variable the key came from (``OPENAI_API_KEY``, or
    #: what ``[endpoint] api_key_env`` names), for errors to say where to look; never
    #: the key.  ``None``: the key was given as it is.  Not part of equality.
    key_env: str | None = attrs.field(default=None, eq=False,
                                      validator=v.optional(v.instance_of(str)))

    def __attrs_post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, "
                             f"not {self.base_url!r}")
        for name in self.headers:
            if name.lower() in ("authorization", "x-api-key"):
                raise ValueError(f"headers must not carry {name}: pass api_key instead")

    @property
    def chat_url(self) -> str:
        return f"{self.base_url}/chat/completions"

    def url(self, api: str | None = None) -> str:
        """Where a stream of ``api`` (default: the endpoint's) is requested."""
        return self.base_url + _PATHS[check_api(api or self.api)]

    def auth_headers(self, api: str | None = None) -> dict[str, str]:
        """The headers that carry the key (and the version) for ``api``'s requests.

        The key goes only here: ``Authorization: Bearer`` for chat and
        responses; ``x-api-key`` and ``anthropic-version`` for anthropic, never
        an ``Authorization`` header (no key: none of them but the version).
        """
        if check_api(api or self.api) == "anthropic":
            headers = {"anthropic-version": ANTHROPIC_VERSION}
            if self.api_key:
                headers["x-api-key"] = self.api_key
            return headers
        return {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    @property
    def secrets(self) -> tuple[str, ...]:
        """What must never be shown: the key (for the parser's ``Redactor``)."""
        return (self.api_key,) if self.api_key else ()

    def redact(self, text: str) -> str:
        """``text`` with the key (if it appears) replaced by ``***``."""
        return Redactor(self.secrets).text(text)


@attrs.frozen
class Deadlines:
    """Per-stream deadlines in seconds.  ``None`` disables one.

    ``connect``: to open the connection.  ``first_byte``: from the request to
    the first body byte (a server that never answers, or drips its headers
    forever, ends here).  ``first_token``: from the request to the first
    content delta; while it is set it alone bounds the wait for the first content
    (a server evaluating a long prompt may send nothing at all).  ``idle``: the
    longest gap between events, from the first content when ``first_token`` is set,
    else from the response's headers, keep-alives counting before the first content
    (comments, events the dialect ignores such as Anthropic's ``ping``) and never
    after it: a relay can send them forever while the model is stuck.  Bytes that
    never complete an event never count.
    ``total``: the whole stream, retries included, from when it got its
    concurrency slot.

    The defaults bound every stream, so no server can hang a fan-out forever:
    connect 10 s, first byte 300 s, idle 300 s (a reasoning model may think
    silently for minutes), total 3600 s; no first-token deadline.
    ``Deadlines(idle=30)`` keeps the other defaults; ``Deadlines.none()``
    disables all of them.
    """

    connect: float | None = attrs.field(default=10.0, validator=_positive_or_none)
    first_byte: float | None = attrs.field(default=300.0, validator=_positive_or_none)
    first_token: float | None = attrs.field(default=None, validator=_positive_or_none)
    idle: float | None = attrs.field(default=300.0, validator=_positive_or_none)
    total: float | None = attrs.field(default=3600.0, validator=_positive_or_none)

    @classmethod
    def none(cls) -> Deadlines:
        """No deadline at all (the caller bounds the streams some other way)."""
        return cls(connect=None, first_byte=None, first_token=None, idle=None, total=None)


@attrs.frozen
class RetryPolicy:
    """When and how a stream is tried again.

    Retried, only before an attempt delivered any content (after that a retry
    would duplicate text and cost): connect errors, ``statuses`` (529 is
    Anthropic's "overloaded"), and a 2xx response that delivered nothing (an
    empty body, a cut before the first token, ``[DONE]`` alone, an error event
    such as Anthropic's ``overloaded_error`` before any content).  Final at
    once: any other 4xx, and a 5xx whose body names a validation error (the
    same request fails the same way).
    ``attempts`` counts the first try (1 disables retries); 429s may use all
    of them, every other failure at most ``failure_attempts`` (a broken server
    is not a busy one).  The wait is exponential (``initial`` doubling up to
    ``maximum``) with full jitter, or what ``Retry-After`` /
    ``retry-after-ms`` said (up to ``max_retry_after``), and never past the
    stream's ``total`` deadline.  ``retry_after_spread``: a Retry-After wait
    is lengthened by up to this fraction, at random, so streams refused
    together do not all come back at the same instant (0, the default:
    exactly what the server said).
    """

    attempts: int = attrs.field(default=3, validator=[v.instance_of(int), v.ge(1)])
    initial: float = attrs.field(default=0.5, validator=v.ge(0))
    maximum: float = attrs.field(default=8.0, validator=v.ge(0))
    statuses: frozenset[int] = attrs.field(
        default=frozenset({408, 409, 429, 500, 502, 503, 504, 529}), converter=_statuses)
    failure_attempts: int = attrs.field(default=3, validator=[v.instance_of(int), v.ge(1)])
    empty_responses: bool = True
    connect_errors: bool = True
    max_retry_after: float = attrs.field(default=60.0, validator=v.ge(0))
    jitter: bool = True
    retry_after_spread: float = attrs.field(default=0.0, validator=v.ge(0))

    def allows(self, status: int | None, attempt: int) -> bool:
        """Another attempt may follow attempt number ``attempt`` that failed this way."""
        budget = self.attempts if status == 429 else min(self.attempts, self.failure_attempts)
        return attempt < budget

    def backoff(self, retry_number: int, rng: random.Random) -> float:
        """The wait before retry ``retry_number`` (1 for the first retry)."""
        ceiling = min(self.maximum, self.initial * 2 ** (retry_number - 1))
        return rng.uniform(0, ceiling) if self.jitter else ceiling

    def retry_after(self, headers: Mapping[str, str], *,
                    now: float | None = None) -> float | None:
        """What the server asked for, in seconds, capped; ``None`` if it did not say.

        ``now``: the time an HTTP date is counted from, in seconds since the epoch
        (``time.time()`` when not given)."""
        milliseconds = headers.get("retry-after-ms")
        if milliseconds:
            try:
                return min(self.max_retry_after, max(0.0, float(milliseconds) / 1000))
            except ValueError:
                pass
        value = headers.get("retry-after")
        if not value:
            return None
        try:
            return min(self.max_retry_after, max(0.0, float(value)))
        except ValueError:
            pass
        try:  # an HTTP date
            parsed = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None  # a header we cannot read is no instruction
        since = time.time() if now is None else now
        return min(self.max_retry_after, max(0.0, parsed.timestamp() - since))


def content_key(base_url: str, model: str, messages: Sequence[Any],
                params: Mapping[str, Any], tools: Sequence[Any] | None = None,
                api: str = "chat") -> str:
    """A stable hash of what was asked (never of the key): equal requests, equal keys.

    The dialect is part of it (a chat key is what it was before dialects):
    the same question asked through another API is another request.
    """
    parts: list[Any] = [base_url, model, messages, params, tools or []]
    if api != "chat":
        parts.append(api)
    blob = json.dumps(parts, sort_keys=True, ensure_ascii=False, default=str)
    # surrogatepass: a lone surrogate (valid in JSON text, "\ud800") hashes, never crashes
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()[:20]


@attrs.frozen
class StreamRequest:
    """One stream of a fan-out: a model and a conversation.

    ``key`` is the caller's name for the stream, unique within a fan-out; every
    event of the stream carries it as ``.stream``.  ``params`` go into the
    request body as they are (``temperature``, ``max_tokens``, ...).
    ``deadlines`` override the fan-out's defaults.  ``tools`` are sent and
    used to validate tool-call arguments.  ``headers`` are sent over the
    endpoint's (never ``Authorization``: the key is the endpoint's);
    ``retry`` overrides the fan-out's retry policy for this stream.
    ``tags`` are the caller's labels (never sent, not in ``content_key``):
    ``fan.cancel_where(lambda r: "job-7" in r.tags)`` cancels a group.
    ``api`` is the dialect (``"chat"``, ``"responses"``, ``"anthropic"``;
    ``None``: the endpoint's): the same messages, params and tools are sent
    in its shape (see ``fanout.bodies``); a parameter it does not have (``n``
    for Anthropic, ...) is a ``ValueError`` here, or when the stream starts
    on an endpoint whose dialect lacks it.

    Keys are strings, not any hashable: a key names the stream in every event,
    JSON record, results file and log line, and a tuple would not survive the
    trip through JSON.  Join the parts (``f"{job}/{model}"``) and keep your own
    mapping if you need them back.
    """

    key: str = attrs.field(validator=_nonempty_str)
    model: str = attrs.field(validator=_nonempty_str)
    messages: Sequence[Mapping[str, Any]] = attrs.field(converter=_messages_tuple,
                                                          validator=_messages)
    params: Mapping[str, Any] = attrs.field(factory=dict, converter=_any_dict)
    deadlines: Deadlines | None = attrs.field(default=None,
                                              validator=v.optional(v.instance_of(Deadlines)))
    tools: Sequence[Mapping[str, Any]] | None = attrs.field(
        default=None, converter=_tools_tuple)
    headers: Mapping[str, str] = attrs.field(factory=dict, converter=_str_dict)
    retry: RetryPolicy | None = attrs.field(default=None,
                                            validator=v.optional(v.instance_of(RetryPolicy)))
    tags: frozenset[str] = attrs.field(factory=frozenset, converter=_tags)
    api: str | None = attrs.field(default=None, validator=_optional_api)

    def __attrs_post_init__(self) -> None:
        if not self.messages:
            raise ValueError(f"stream {self.key!r}: messages must not be empty")
        for name, value in self.headers.items():
            if not isinstance(name, str) or not isinstance(value, str):
                raise ValueError(f"stream {self.key!r}: headers must map strings to strings, "
                                 f"not {name!r}: {type(value).__name__}")
            if name.lower() in ("authorization", "x-api-key"):
                raise ValueError(f"stream {self.key!r}: headers must not carry {name}: the key "
                                 "is the endpoint's")
        for reserved in ("model", "messages", "stream", "tools"):
            if reserved in self.params:
                raise ValueError(f"stream {self.key!r}: params must not set {reserved!r}; "
                                 "it is a field of StreamRequest or set by fanout")
        if self.api is not None:
            self.check(self.api)

    def api_for(self, endpoint: Endpoint) -> str:
        """The dialect this request is sent in: its own, else the endpoint's."""
        return self.api or endpoint.api

    def check(self, api: str) -> None:
        """``ValueError`` naming the stream and the parameter if ``api`` cannot carry it."""
        refused = refused_param(check_api(api), self.params)
        if refused is not None:
            name, why = refused
            raise ValueError(f"stream {self.key!r}: the {api} API has no parameter "
                             f"{name!r} ({why})")
        try:
            build_body(api, self.model, self.messages, self.params, self.tools)
        except ValueError as exc:
            raise ValueError(f"stream {self.key!r}: {exc}") from None

    def body(self, api: str | None = None) -> dict[str, Any]:
        """The JSON body of the HTTP request, in ``api``'s dialect (default: the
        request's own, else chat)."""
        return build_body(api or self.api or "chat", self.model, self.messages, self.params,
                          self.tools)

    @property
    def expected_choices(self) -> int:
        """How many choices were asked for (``n``, default 1; always 1 in the other
        dialects, which have no ``n``)."""
        if self.api not in (None, "chat"):
            return 1
        n = self.params.get("n")
        return n if type(n) is int and n > 0 else 1

    @property
    def expects_usage(self) -> bool:
        """Whether the stream will report usage: asked for in chat
        (``stream_options.include_usage``), always sent by the other dialects."""
        if self.api not in (None, "chat"):
            return True
        options = self.body("chat").get("stream_options")
        return isinstance(options, Mapping) and bool(options.get("include_usage"))

    def content_key(self, endpoint: Endpoint) -> str:
        return content_key(endpoint.base_url, self.model, list(self.messages), self.params,
                           list(self.tools or ()), self.api_for(endpoint))


def _positive_int_or_none(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{attribute.name} must be a whole number >= 1 or None, not {value!r}")


@attrs.frozen
class StreamSettings:
    """What every stream of a fan-out is run with: one value, validated, with its defaults.

    ``open_fanout`` builds it from its keywords; a request's own ``deadlines``
    and ``retry`` win over ``deadlines`` and ``retry`` here.  ``fanout_deadline``
    is the whole fan-out's end on trio's clock (``inf``: none).
    ``max_response_bytes`` (default 64 MiB) ends an endless stream with its
    output kept; ``None`` removes the cap.
    """

    deadlines: Deadlines = attrs.field(factory=Deadlines,
                                       validator=v.instance_of(Deadlines))
    retry: RetryPolicy = attrs.field(factory=RetryPolicy, validator=v.instance_of(RetryPolicy))
    strict: bool = attrs.field(default=False, validator=v.instance_of(bool))
    max_event_size: int = attrs.field(default=DEFAULT_MAX_EVENT_SIZE,
                                      validator=[v.instance_of(int), v.ge(1)])
    max_response_bytes: int | None = attrs.field(default=DEFAULT_MAX_RESPONSE_BYTES,
                                                 validator=_positive_int_or_none)
    fanout_deadline: float = attrs.field(default=math.inf, validator=v.instance_of(float))
