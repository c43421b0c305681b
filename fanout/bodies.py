"""Request bodies per dialect, built from the same messages, params and tools.

fanout's requests are written in the Chat Completions vocabulary (``messages``
with ``system``/``user``/``assistant``/``tool`` roles, chat params, OpenAI
function tools).  ``build_body`` turns one into the body of the dialect the
endpoint speaks:

- ``"chat"``: ``POST /chat/completions`` as it is, with
  ``stream_options.include_usage``;
- ``"responses"``: ``POST /responses``: system messages become
  ``instructions``, the rest ``input`` items, each with its ``type`` as the API
  reference gives it (``message`` for every turn, the assistant's too; tool calls
  ``function_call``,
  tool results ``function_call_output``), ``max_tokens`` /
  ``max_completion_tokens`` become ``max_output_tokens``, ``reasoning_effort``
  ``reasoning.effort``, ``response_format`` ``text.format``, tools and
  ``tool_choice`` reshaped (a tool's ``strict`` is sent as given, else false,
  the chat default);
- ``"anthropic"``: ``POST /messages``: system messages become the top-level
  ``system``, tool calls ``tool_use`` blocks and tool results ``tool_result``
  blocks of a user turn; ``max_tokens`` is required there, so it is
  ``DEFAULT_MAX_TOKENS`` when neither ``max_tokens`` nor
  ``max_completion_tokens`` is set; ``stop`` becomes ``stop_sequences``,
  ``user`` ``metadata.user_id``, ``parallel_tool_calls = false``
  ``tool_choice.disable_parallel_tool_use``; tools take ``input_schema``.

A parameter a dialect does not have (``REFUSED``: ``n`` for both, ``seed``,
``presence_penalty``, ...) is a ``ValueError`` naming it, never silently
dropped.  Every other parameter goes into the body as it is: the dialect's own
ones (``top_k``, ``thinking``, ``truncation``, ...) work unchanged.

Plain code: no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["APIS", "DEFAULT_MAX_TOKENS", "REFUSED", "build_body", "refused_param"]

#: The dialects fanout speaks, in the order they are documented.
APIS = ("chat", "responses", "anthropic")

#: ``max_tokens`` sent to an Anthropic endpoint when the request sets none (it is required).
DEFAULT_MAX_TOKENS = 4096

#: Chat parameters a dialect does not have, and what to do instead.
REFUSED: Mapping[str, Mapping[str, str]] = {
    "chat": {},
    "responses": {
        "n": "one answer per request: run more samples instead",
        "seed": "the Responses API has no seed",
        "stop": "the Responses API has no stop sequences",
        "presence_penalty": "the Responses API has no presence penalty",
        "frequency_penalty": "the Responses API has no frequency penalty",
        "logit_bias": "the Responses API has no logit bias",
        "logprobs": "use top_logprobs and include = [\"message.output_text.logprobs\"]",
        "stream_options": "usage always comes with response.completed",
        "functions": "use tools",
        "function_call": "use tool_choice",
        "modalities": "not a Responses API parameter",
        "audio": "not a Responses API parameter",
        "prediction": "not a Responses API parameter",
        "web_search_options": "use a web_search tool",
    },
    "anthropic": {
        "n": "one answer per request: run more samples instead",
        "seed": "the Messages API has no seed",
        "presence_penalty": "the Messages API has no presence penalty",
        "frequency_penalty": "the Messages API has no frequency penalty",
        "logit_bias": "the Messages API has no logit bias",
        "logprobs": "the Messages API has no logprobs",
        "top_logprobs": "the Messages API has no logprobs",
        "response_format": "the Messages API has no response format (use a tool)",
        "reasoning_effort": "use thinking = { type = \"enabled\", budget_tokens = ... }",
        "stream_options": "usage always comes with message_start and message_delta",
        "functions": "use tools",
        "function_call": "use tool_choice",
        "modalities": "not a Messages API parameter",
        "audio": "not a Messages API parameter",
        "prediction": "not a Messages API parameter",
        "store": "not a Messages API parameter",
        "web_search_options": "use a web_search tool",
    },
}

#: Body fields fanout writes itself, per dialect: params must not set them.
RESERVED: Mapping[str, tuple[str, ...]] = {
    "chat": ("model", "messages", "stream", "tools"),
    "responses": ("model", "messages", "stream", "tools", "input"),
    "anthropic": ("model", "messages", "stream", "tools"),
}


def check_api(api: object, what: str = "api") -> str:
    """``api`` if it is a dialect fanout speaks; else a ``ValueError`` listing them."""
    if api not in APIS:
        raise ValueError(f"{what} must be one of {', '.join(map(repr, APIS))}, not {api!r}")
    assert isinstance(api, str)
    return api


def refused_param(api: str, params: Mapping[str, Any]) -> tuple[str, str] | None:
    """The first parameter of ``params`` that ``api`` does not have, and why; else None."""
    refused = REFUSED[api]
    for name in params:
        if name in refused:
            return name, refused[name]
    for name in RESERVED[api]:
        if name in params:
            return name, "it is set by fanout"
    return None


def build_body(api: str, model: str, messages: Sequence[Mapping[str, Any]],
               params: Mapping[str, Any], tools: Sequence[Mapping[str, Any]] | None
               ) -> dict[str, Any]:
    """The JSON body of a streaming request in ``api``'s dialect.

    ``ValueError`` for a parameter the dialect lacks, or a message it cannot
    carry (a tool call whose arguments are not a JSON object, for Anthropic).
    """
    if api == "chat":
        body: dict[str, Any] = {"model": model, "messages": list(messages), "stream": True,
                                "stream_options": {"include_usage": True}}
        body.update(params)
        if tools:
            body["tools"] = list(tools)
        return body
    refused = refused_param(check_api(api), params)
    if refused is not None:
        name, why = refused
        raise ValueError(f"the {api} API has no parameter {name!r} ({why})")
    if api == "responses":
        return _responses(model, messages, params, tools)
    return _anthropic(model, messages, params, tools)


# ---------------------------------------------------------------- Responses

def _responses(model: str, messages: Sequence[Mapping[str, Any]], params: Mapping[str, Any],
               tools: Sequence[Mapping[str, Any]] | None) -> dict[str, Any]:
    rest = dict(params)
    instructions = [str(rest.pop("instructions"))] if rest.get("instructions") else []
    items: list[Any] = []
    for index, message in enumerate(messages):
        role = message.get("role")
        content = message.get("content")
        if role == "system":
            text = _text(content)
            if text:
                instructions.append(text)
        elif role == "tool":
            items.append({"type": "function_call_output",
                          "call_id": str(message.get("tool_call_id", "")),
                          "output": _text(content)})
        elif role == "assistant":
            text = _text(content)
            if text:
                items.append({"type": "message", "role": "assistant", "content": text})
            for call, function in _calls(message, f"messages[{index}]"):
                items.append({"type": "function_call", "call_id": str(call.get("id", "")),
                              "name": str(function.get("name", "")),
                              "arguments": str(function.get("arguments") or "{}")})
        elif role is None and "type" in message:
            items.append(dict(message))  # already a Responses input item
        else:
            items.append({"type": "message", "role": role,
                          "content": _responses_content(content)})
    body: dict[str, Any] = {"model": model, "input": items}
    if instructions:
        body["instructions"] = "\n\n".join(instructions)
    limit = _pop_limit(rest)
    if limit is not None:
        body["max_output_tokens"] = limit
    effort = rest.pop("reasoning_effort", None)
    if effort is not None:
        reasoning = _table(rest.pop("reasoning", None), "reasoning")
        reasoning.setdefault("effort", effort)
        body["reasoning"] = reasoning
    response_format = rest.pop("response_format", None)
    if isinstance(response_format, Mapping):
        shown = _table(rest.pop("text", None), "text")
        shown.setdefault("format", _text_format(response_format))
        body["text"] = shown
    if "tool_choice" in rest:
        body["tool_choice"] = _responses_tool_choice(rest.pop("tool_choice"))
    body.update(rest)
    if tools:
        body["tools"] = [_responses_tool(tool) for tool in tools]
    body["stream"] = True
    return body


def _responses_content(content: Any) -> Any:
    if not isinstance(content, list):
        return content if isinstance(content, str) else _text(content)
    parts = []
    for part in content:
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text":
            parts.append({"type": "input_text", "text": part.get("text", "")})
        elif kind == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, Mapping) else image
            detail = image.get("detail", "auto") if isinstance(image, Mapping) else "auto"
            parts.append({"type": "input_image", "image_url": url, "detail": detail})
        else:
            parts.append(part)
    return parts


def _responses_tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    function = tool.get("function")
    if tool.get("type", "function") != "function" or not isinstance(function, Mapping):
        return dict(tool)  # already a Responses tool (or a built-in one)
    shaped: dict[str, Any] = {"type": "function", "name": function.get("name")}
    if function.get("description"):
        shaped["description"] = function["description"]
    shaped["parameters"] = function.get("parameters") or {"type": "object", "properties": {}}
    shaped["strict"] = bool(function.get("strict", False))
    return shaped


def _responses_tool_choice(choice: Any) -> Any:
    if isinstance(choice, Mapping) and isinstance(choice.get("function"), Mapping):
        return {"type": "function", "name": choice["function"].get("name")}
    return choice


def _text_format(response_format: Mapping[str, Any]) -> dict[str, Any]:
    """Chat's ``response_format`` as the Responses ``text.format``."""
    schema = response_format.get("json_schema")
    if response_format.get("type") == "json_schema" and isinstance(schema, Mapping):
        return {"type": "json_schema", **schema}
    return dict(response_format)


# ---------------------------------------------------------------- Anthropic

def _anthropic(model: str, messages: Sequence[Mapping[str, Any]], params: Mapping[str, Any],
               tools: Sequence[Mapping[str, Any]] | None) -> dict[str, Any]:
    rest = dict(params)
    system = [str(rest.pop("system"))] if rest.get("system") else []
    turns: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        role = message.get("role")
        content = message.get("content")
        if role in ("system", "developer"):
            text = _text(content)
            if text:
                system.append(text)
            continue
        if role == "tool":
            block = {"type": "tool_result", "tool_use_id": str(message.get("tool_call_id", "")),
                     "content": _text(content)}
            _append(turns, "user", [block], merge=True)
        elif role == "assistant":
            blocks = _anthropic_blocks(content)
            for number, (call, function) in enumerate(_calls(message, f"messages[{index}]")):
                blocks.append(_tool_use(call, function,
                                        f"messages[{index}].tool_calls[{number}]"))
            _append(turns, "assistant", blocks)
        else:
            merge = bool(turns) and turns[-1]["role"] == "user" and _has_results(turns[-1])
            if isinstance(content, str) and not merge:
                turns.append({"role": "user", "content": content})
            else:
                _append(turns, "user", _anthropic_blocks(content), merge=merge)
    limit = _pop_limit(rest)
    body: dict[str, Any] = {"model": model, "messages": turns,
                            "max_tokens": DEFAULT_MAX_TOKENS if limit is None else limit}
    if system:
        body["system"] = "\n\n".join(system)
    stop = rest.pop("stop", None)
    if stop is not None:
        if not isinstance(stop, str | list | tuple):
            raise ValueError(f"stop must be a string or a list of strings, not {stop!r:.40}")
        body["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    user = rest.pop("user", None)
    if user is not None:
        metadata = _table(rest.pop("metadata", None), "metadata")
        metadata.setdefault("user_id", user)
        body["metadata"] = metadata
    parallel = rest.pop("parallel_tool_calls", None)
    choice = _anthropic_tool_choice(rest.pop("tool_choice", None))
    if parallel is False:
        choice = {**(choice or {"type": "auto"}), "disable_parallel_tool_use": True}
    if choice is not None:
        body["tool_choice"] = choice
    body.update(rest)
    if tools:
        body["tools"] = [_anthropic_tool(tool) for tool in tools]
    body["stream"] = True
    return body


def _append(turns: list[dict[str, Any]], role: str, blocks: list[Any], *,
            merge: bool = False) -> None:
    """A turn of ``blocks``; with ``merge``, onto the previous turn of the same role."""
    if merge and turns and turns[-1]["role"] == role:
        previous = turns[-1]
        if isinstance(previous["content"], str):
            previous["content"] = [{"type": "text", "text": previous["content"]}]
        previous["content"].extend(blocks)
        return
    turns.append({"role": role, "content": blocks})


def _has_results(turn: Mapping[str, Any]) -> bool:
    content = turn.get("content")
    return isinstance(content, list) and any(
        isinstance(b, Mapping) and b.get("type") == "tool_result" for b in content)


def _anthropic_blocks(content: Any) -> list[Any]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if not isinstance(content, list):
        return [{"type": "text", "text": _text(content)}]
    blocks: list[Any] = []
    for part in content:
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text":
            blocks.append({"type": "text", "text": part.get("text", "")})
        elif kind == "image_url":
            image = part.get("image_url")
            url = str(image.get("url", "") if isinstance(image, Mapping) else image)
            blocks.append({"type": "image", "source": _image_source(url)})
        else:
            blocks.append(part)  # already an Anthropic block
    return blocks


def _image_source(url: str) -> dict[str, Any]:
    """A data: URL as a base64 source, anything else as a url source."""
    if url.startswith("data:") and ";base64," in url:
        media_type, _, data = url[len("data:"):].partition(";base64,")
        return {"type": "base64", "media_type": media_type, "data": data}
    return {"type": "url", "url": url}


def _tool_use(call: Mapping[str, Any], function: Mapping[str, Any], where: str
              ) -> dict[str, Any]:
    arguments = function.get("arguments") or "{}"
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        parsed = None
    if not isinstance(parsed, Mapping):
        raise ValueError(f"{where}: the arguments must be a JSON object for the anthropic "
                         "API (tool_use input)")
    return {"type": "tool_use", "id": str(call.get("id", "")),
            "name": str(function.get("name", "")), "input": dict(parsed)}


def _anthropic_tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    function = tool.get("function")
    if tool.get("type", "function") != "function" or not isinstance(function, Mapping):
        return dict(tool)  # already an Anthropic tool (or a server tool)
    shaped: dict[str, Any] = {"name": function.get("name")}
    if function.get("description"):
        shaped["description"] = function["description"]
    shaped["input_schema"] = function.get("parameters") or {"type": "object", "properties": {}}
    return shaped


def _anthropic_tool_choice(choice: Any) -> dict[str, Any] | None:
    if choice is None:
        return None
    if isinstance(choice, str):
        return {"type": {"required": "any"}.get(choice, choice)}
    if isinstance(choice, Mapping) and isinstance(choice.get("function"), Mapping):
        return {"type": "tool", "name": choice["function"].get("name")}
    return dict(choice) if isinstance(choice, Mapping) else {"type": str(choice)}


# ---------------------------------------------------------------- shared

def _calls(message: Mapping[str, Any], where: str
           ) -> list[tuple[Mapping[str, Any], Mapping[str, Any]]]:
    """An assistant message's tool calls with their ``function`` objects; ``ValueError``
    naming the one that is not shaped as a chat tool call."""
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list | tuple):
        raise ValueError(f"{where}.tool_calls: must be a list of tool calls")
    checked = []
    for number, call in enumerate(calls):
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping):
            raise ValueError(f"{where}.tool_calls[{number}]: must be an object with a "
                             "\"function\" object")
        checked.append((call, function))
    return checked


def _table(value: Any, name: str) -> dict[str, Any]:
    """A params table fanout adds a key to (``reasoning``, ``text``, ``metadata``)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{name} must be an object, not {value!r:.40}")
    return dict(value)


def _pop_limit(params: dict[str, Any]) -> Any:
    """``max_completion_tokens`` (chat's current name), else ``max_tokens``; both removed."""
    newer = params.pop("max_completion_tokens", None)
    older = params.pop("max_tokens", None)
    return newer if newer is not None else older


def _text(content: Any) -> str:
    """A message's text: a string as it is, text parts joined, anything else empty."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content
                       if isinstance(p, Mapping) and p.get("type") in ("text", "input_text",
                                                                       "output_text"))
    return ""
