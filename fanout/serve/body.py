"""Request bodies: read within a bound, checked, turned into what the engine runs.

``read_json`` reads at most ``max_body_bytes`` (413 past it) and parses one JSON
object.  ``parse_fanout`` and ``parse_chat`` check every field they know and
name it in the error (``messages[1].role: ...``, ``models[2]: no model named
'gtp-4o' (did you mean 'gpt-4o'?)``); every other key is a request parameter
(``temperature``, ``max_tokens``, ...), sent over the model's own ``params``.
Nothing here does I/O but reading the body.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping, Sequence
from contextlib import aclosing
from typing import Any, Literal, NoReturn

import attrs
from starlette.requests import ClientDisconnect, Request

from .._exceptions import ConfigError
from ..config import Config, ModelConfig, ServeConfig
from ..request import StreamRequest
from .errors import ApiError, describe

__all__ = ["ChatAsk", "FanoutAsk", "StreamPlan", "parse_chat", "parse_fanout", "read_json"]

Mode = Literal["all", "first"]
MODES: tuple[Mode, ...] = ("all", "first")
ROLES = ("system", "developer", "user", "assistant", "tool", "function")

# Parameters whose type is checked here (a wrong one is the client's 400, not the
# upstream's); any other key goes to the upstream as it is.
_NUMBERS = ("temperature", "top_p", "presence_penalty", "frequency_penalty")
_COUNTS = ("max_tokens", "max_completion_tokens", "n")
_INTEGERS = ("seed", "top_logprobs")
_BOOLEANS = ("logprobs", "parallel_tool_calls")
_STRINGS = ("user", "reasoning_effort")


@attrs.frozen
class StreamPlan:
    """One stream of a fan-out: its key (``stream`` in every record), model and request.

    ``sample`` is ``None`` when one sample per model was asked for; the key is
    then the model's name, else ``name#sample`` (samples count from 0).
    """

    key: str
    model: ModelConfig
    sample: int | None
    request: StreamRequest


@attrs.frozen
class FanoutAsk:
    """A checked ``POST /v1/fanout``: the streams, ``mode`` and whether to stream."""

    streams: tuple[StreamPlan, ...]
    mode: Mode
    stream: bool


@attrs.frozen
class ChatAsk:
    """A checked ``POST /v1/chat/completions``: one model, one request."""

    model: ModelConfig
    request: StreamRequest
    stream: bool
    include_usage: bool


def bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    """A 400 naming ``param``."""
    return ApiError(400, message, param=param, code=code)


async def read_json(request: Request, max_bytes: int) -> dict[str, Any]:
    """The body as one JSON object, read within ``max_bytes`` (413 past it)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        _too_large(max_bytes)
    parts: list[bytes] = []
    size = 0
    try:
        # Closed at once, also when the limit stops the reading: no generator is left to
        # the garbage collector.
        async with aclosing(request.stream()) as chunks:
            async for chunk in chunks:
                size += len(chunk)
                if size > max_bytes:
                    _too_large(max_bytes)
                parts.append(chunk)
    except ClientDisconnect:
        raise bad("the client went away while sending the body") from None
    data = b"".join(parts)
    if not data.strip():
        raise bad("the body is empty: send a JSON object")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad(f"the body is not UTF-8 text (byte {exc.start})") from None
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise bad("the body nests too deeply") from None
    except json.JSONDecodeError as exc:
        raise bad(f"the body is not valid JSON: {exc.msg} (line {exc.lineno}, column "
                  f"{exc.colno})") from None
    except ValueError as exc:
        raise bad(f"the body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise bad(f"the body must be a JSON object, not {describe(value)}")
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise bad("the body holds a lone surrogate (a \\ud800-\\udfff escape): text must be "
                  "valid Unicode") from None
    return value


def parse_fanout(body: Mapping[str, Any], config: Config, limits: ServeConfig) -> FanoutAsk:
    """Check a ``/v1/fanout`` body against the config and the limits."""
    if "model" in body:
        raise bad("model: /v1/fanout takes models, a list of model names (for one model, "
                  "POST /v1/chat/completions)", "model")
    messages = _messages(body.get("messages"))
    names = body.get("models")
    if names is None:
        names = list(config.compare) or [m.name for m in config.models]
    if not isinstance(names, list) or not names:
        raise bad("models: must be a non-empty array of model names, not "
                  f"{describe(names)}", "models")
    models: list[ModelConfig] = []
    for index, name in enumerate(names):
        where = f"models[{index}]"
        model = _model(config, name, where)
        if any(m.name == model.name for m in models):
            raise bad(f"{where}: {model.name!r} is asked for twice (samples asks for more "
                      "than one answer)", where)
        models.append(model)
    samples = _count(body, "samples", 1)
    stream = _boolean(body, "stream", False)
    mode = body.get("mode", "all")
    if mode not in MODES:
        raise bad(f"mode: must be \"all\" or \"first\", not {describe(mode)}", "mode")
    tools = _tools(body.get("tools"))
    _stream_options(body)
    params = _params(body, ("messages", "models", "samples", "stream", "mode", "tools",
                            "stream_options"))
    choices = params.get("n", 1)
    total = len(models) * samples * choices
    if total > limits.max_streams:
        asked = f"{len(models)} models x {samples} samples" + (
            f" x n={choices}" if choices != 1 else "")
        raise bad(f"{'samples' if samples > 1 else 'models'}: {asked} is {total} streams, "
                  f"over this service's max_streams of {limits.max_streams}",
                  "samples" if samples > 1 else "models", "too_many_streams")
    plans: list[StreamPlan] = []
    for model in models:
        for sample in range(samples):
            key = model.name if samples == 1 else f"{model.name}#{sample}"
            plans.append(StreamPlan(key, model, None if samples == 1 else sample,
                                    _request(key, model, config, messages, params, tools)))
    if len({plan.key for plan in plans}) != len(plans):
        raise bad("models: two streams would have the same name (a model named like "
                  "another's sample, name#N)", "models")
    return FanoutAsk(tuple(plans), mode, stream)


def parse_chat(body: Mapping[str, Any], config: Config, limits: ServeConfig) -> ChatAsk:
    """Check a ``/v1/chat/completions`` body: one configured model."""
    for key in ("models", "samples", "mode"):
        if key in body:
            raise bad(f"{key}: /v1/chat/completions runs one model; several at once: "
                      "POST /v1/fanout", key)
    if "model" not in body:
        raise bad("model: missing (a model name of this service: GET /v1/models)", "model")
    model = _model(config, body["model"], "model")
    messages = _messages(body.get("messages"))
    stream = _boolean(body, "stream", False)
    tools = _tools(body.get("tools"))
    include_usage = _stream_options(body)
    params = _params(body, ("model", "messages", "stream", "tools", "stream_options"))
    if params.get("n", 1) > limits.max_streams:
        raise bad(f"n: {params['n']} choices, over this service's max_streams of "
                  f"{limits.max_streams}", "n", "too_many_streams")
    return ChatAsk(model, _request(model.name, model, config, messages, params, tools), stream,
                   include_usage)


def _request(key: str, model: ModelConfig, config: Config, messages: list[dict[str, Any]],
             params: Mapping[str, Any], tools: list[dict[str, Any]] | None) -> StreamRequest:
    # The request compare and batch send for this model (its own tools when the body has
    # none), with the body's params and tools over the model's.
    try:
        return config.request(key, model, messages, params=params, tools=tools)
    except ValueError as exc:  # StreamRequest's own checks: the client's input
        raise bad(str(exc)) from None


def _too_large(max_bytes: int) -> NoReturn:
    raise ApiError(413, f"the request body is over {max_bytes} bytes (this service's "
                   "max_body_bytes)", code="body_too_large")


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a JSON number")


def _model(config: Config, name: Any, where: str) -> ModelConfig:
    if not isinstance(name, str) or not name.strip():
        raise bad(f"{where}: must be a model name (a string), not {describe(name)}", where)
    try:
        return config.model(name)
    except ConfigError:
        known = [m.name for m in config.models]
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else \
            f" (known: {', '.join(known) or 'none'})"
        raise bad(f"{where}: no model named {describe(name)}{hint}", where,
                  "model_not_found") from None


def _messages(value: Any) -> list[dict[str, Any]]:
    if value is None:
        raise bad("messages: missing (an array of {role, content} objects)", "messages")
    if not isinstance(value, list) or not value:
        raise bad(f"messages: must be a non-empty array of messages, not {describe(value)}",
                  "messages")
    for index, message in enumerate(value):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise bad(f"{where}: must be an object with role and content, not "
                      f"{describe(message)}", where)
        role = message.get("role")
        if role not in ROLES:
            raise bad(f"{where}.role: must be one of {', '.join(ROLES)}, not "
                      f"{describe(role)}", f"{where}.role")
        content = message.get("content")
        if content is None and role in ("system", "developer", "user"):
            raise bad(f"{where}.content: missing", f"{where}.content")
        if content is not None and not isinstance(content, str | list):
            raise bad(f"{where}.content: must be a string or an array of content parts, not "
                      f"{describe(content)}", f"{where}.content")
    return value


def _tools(value: Any) -> list[dict[str, Any]] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise bad(f"tools: must be an array of tools, not {describe(value)}", "tools")
    for index, tool in enumerate(value):
        where = f"tools[{index}]"
        if not isinstance(tool, dict):
            raise bad(f"{where}: must be an object, not {describe(tool)}", where)
        function = tool.get("function")
        if not isinstance(function, dict):
            raise bad(f"{where}.function: must be an object with a name, not "
                      f"{describe(function)}", f"{where}.function")
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise bad(f"{where}.function.name: must be a non-empty string, not "
                      f"{describe(function.get('name'))}", f"{where}.function.name")
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise bad(f"{where}.function.parameters: must be a JSON Schema object, not "
                      f"{describe(parameters)}", f"{where}.function.parameters")
    return value or None


def _stream_options(body: Mapping[str, Any]) -> bool:
    """``stream_options.include_usage`` (fanout always asks the upstream for usage)."""
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise bad(f"stream_options: must be an object, not {describe(options)}",
                  "stream_options")
    include = options.get("include_usage", False)
    if not isinstance(include, bool):
        raise bad(f"stream_options.include_usage: must be true or false, not "
                  f"{describe(include)}", "stream_options.include_usage")
    return include


def _params(body: Mapping[str, Any], fields: Sequence[str]) -> dict[str, Any]:
    params = {key: value for key, value in body.items() if key not in fields}
    for key, value in params.items():
        if key in _NUMBERS and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise bad(f"{key}: must be a number, not {describe(value)}", key)
        if key in _COUNTS and (isinstance(value, bool) or not isinstance(value, int)
                               or value < 1):
            raise bad(f"{key}: must be a whole number >= 1, not {describe(value)}", key)
        if key in _INTEGERS and (isinstance(value, bool) or not isinstance(value, int)):
            raise bad(f"{key}: must be a whole number, not {describe(value)}", key)
        if key in _BOOLEANS and not isinstance(value, bool):
            raise bad(f"{key}: must be true or false, not {describe(value)}", key)
        if key in _STRINGS and not isinstance(value, str):
            raise bad(f"{key}: must be a string, not {describe(value)}", key)
        if key == "stop" and not (isinstance(value, str) or (
                isinstance(value, list) and all(isinstance(s, str) for s in value))):
            raise bad(f"stop: must be a string or an array of strings, not {describe(value)}",
                      key)
    return params


def _count(body: Mapping[str, Any], key: str, default: int) -> int:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise bad(f"{key}: must be a whole number >= 1, not {describe(value)}", key)
    return value


def _boolean(body: Mapping[str, Any], key: str, default: bool) -> bool:
    value = body.get(key, default)
    if not isinstance(value, bool):
        raise bad(f"{key}: must be true or false, not {describe(value)}", key)
    return value
