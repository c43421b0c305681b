"""What each model of the embedded upstream answers.

Scripted models (``mock/*``) give deterministic answers from the seed and
the prompt.  Fault models (``fault/*``) break a stream the ways real relays
and hostile servers do.  ``slot/*`` models share one generation slot, as a
llama.cpp server does: a new request cuts the stream that holds it.
``replay/<capture>`` serves a recorded body with its recorded timing.
A model id may carry arguments after ``:`` (``fault/429:3``) and a
fragmenting mode after ``@`` (``mock/fast@byte``).

Every model plans its answer once, as parts; the request's route picks the
encoder that renders them: chat chunks, Responses events or Anthropic events
(``dialects.py``).  A fault means the same on every route it is served on
(``ModelSpec.apis``): ``fault/truncate:5`` cuts the sixth write, whatever its
dialect; ``fault/no-done`` leaves out the terminal event (``[DONE]``,
``response.completed``, ``message_stop``).
"""

from __future__ import annotations

import itertools
import json
import math
import secrets
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import orjson

from ..bodies import APIS
from .bomb import MIB, gzip_bomb
from .capture import Capture
from .corpus import REASONING, cut, example_arguments, fragments, rng_for
from .dialects import (
    AnthropicEncoder,
    ResponsesEncoder,
    anthropic_error_plan,
    chat_stream_parts,
    grouped,
)
from .plans import Abort, ChatRequest, Hang, Pause, Plan, Send, Step, error_plan, json_plan

__all__ = ["ECHO_MARKER", "ECHO_PLACES", "SCRIPTED_MODELS", "Context", "ModelSpec", "Slot",
           "encoder", "plan_replay"]

SSE_HEADERS = (("content-type", "text/event-stream; charset=utf-8"),
               ("cache-control", "no-cache"), ("x-accel-buffering", "no"))
DONE = b"data: [DONE]\n\n"
#: Each dialect's route.
ROUTES = {"chat": "/v1/chat/completions", "responses": "/v1/responses",
          "anthropic": "/v1/messages"}


@attrs.define
class Slot:
    """The one generation slot all ``slot/*`` streams share (llama.cpp's
    ``interrupt_requests``): each request takes it, and the stream that held
    it notices before its next chunk that it was cut."""

    holder: int | None = None  # the ticket of the stream holding the slot, if any
    issued: int = 0  # tickets issued: slot/* requests seen
    cuts: int = 0  # streams cut by a later request

    def take(self) -> int:
        """A new request's ticket: it holds the slot now, whoever held it before."""
        self.issued += 1
        self.holder = self.issued
        return self.issued

    def holds(self, ticket: int) -> bool:
        return self.holder == ticket

    def release(self, ticket: int) -> None:
        """Give the slot back, if ``ticket`` still holds it (a cut stream does not)."""
        if self.holder == ticket:
            self.holder = None


@attrs.define
class Context:
    """What a plan may consult beyond its request: server-wide settings and state."""

    cadence: float | None = None  # the server's cadence, overriding model defaults
    attempts: dict[str, int] = attrs.Factory(dict)  # conversation -> requests seen
    streaming: dict[str, int] = attrs.Factory(dict)  # model -> its streams open now
    captures: Mapping[str, Path] = attrs.Factory(dict)
    cookies_seen: list[str] = attrs.Factory(list)  # every request's Cookie header, in order
    slot: Slot = attrs.Factory(Slot)  # the slot/* models' one slot
    _loaded: dict[str, Capture] = attrs.Factory(dict)

    def capture(self, name: str) -> Capture | None:
        if name not in self._loaded:
            path = self.captures.get(name)
            if path is None:
                return None
            self._loaded[name] = Capture.load(path)
        return self._loaded[name]

    def attempt(self, request: ChatRequest) -> int:
        """Count this request of its conversation; the first is 1."""
        key = f"{request.name}:{request.conversation}"
        self.attempts[key] = self.attempts.get(key, 0) + 1
        return self.attempts[key]


@attrs.frozen
class ModelSpec:
    """A model: its id, what it does, its plan, and the routes (dialects) serving it."""

    id: str
    description: str
    plan: Callable[[ChatRequest, Context], Plan]
    apis: tuple[str, ...] = APIS

    @property
    def routes(self) -> str:
        """The routes serving this model when not all do (``/v1/messages``), else ``""``."""
        if set(self.apis) >= set(APIS):
            return ""
        return ", ".join(ROUTES[api] for api in self.apis)


# ---------------------------------------------------------------- answers

@attrs.define
class _Choice:
    """One choice's answer as the parts a stream sends, in order."""

    # ("content" | "reasoning", text) or ("tool", tool index, id | None, name | None, fragment)
    parts: list[tuple[Any, ...]] = attrs.Factory(list)
    finish_reason: str | None = "stop"  # None: never finished (fault/unfinished-choice)
    billed: int | None = None  # the completion tokens its usage says (None: one a part)

    @property
    def content(self) -> str:
        return "".join(p[1] for p in self.parts if p[0] == "content")

    @property
    def reasoning(self) -> str:
        return "".join(p[1] for p in self.parts if p[0] == "reasoning")


REFUSAL = "I can't help with that request, but I can help with a related question."

def _limit(choice: _Choice, request: ChatRequest, natural: int) -> None:
    """Cut a text answer at ``max_tokens`` (one part is one token) -> finish ``length``."""
    if request.max_tokens is not None and request.max_tokens < natural:
        choice.parts = choice.parts[: request.max_tokens]
        choice.finish_reason = "length"


def _text(request: ChatRequest, index: int, kind: str) -> _Choice:
    rng = rng_for(request.seed, request.name, request.prompt, index)
    choice = _Choice()
    if kind == "echo":
        pieces = cut(rng, request.prompt or "(empty prompt)")
    elif kind == "length":
        count = request.max_tokens or request.tokens or 16
        choice.parts = [("content", f) for f in fragments(rng, count)]
        choice.finish_reason = "length"
        return choice
    else:
        pieces = fragments(rng, request.tokens or rng.randint(30, 90))
    if kind == "reasoning":
        choice.parts = [("reasoning", f) for f in cut(rng, " ".join(REASONING))]
    if kind == "refusal":
        choice.parts = [("refusal", f) for f in cut(rng, REFUSAL)]
        return choice
    choice.parts += [("content", p) for p in pieces]
    _limit(choice, request, len(choice.parts))
    return choice


def _tool_calls(request: ChatRequest, index: int, names: list[str]) -> _Choice:
    """Tool calls with their argument fragments interleaved across calls (0, 1, 0, 1, …)."""
    rng = rng_for(request.seed, request.name, request.prompt, index, "tools")
    schemas = {t.get("function", {}).get("name"): t.get("function", {}).get("parameters") or {}
               for t in request.tools}
    streams = []
    for tool_index, name in enumerate(names):
        schema = schemas.get(name) or {"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city", "days"]}
        arguments = orjson.dumps(example_arguments(schema, rng)).decode()
        call_id = f"call_{rng.getrandbits(48):012x}"
        head: list[tuple[Any, ...]] = [("tool", tool_index, call_id, name, "")]
        streams.append(head + [("tool", tool_index, None, None, f) for f in cut(rng, arguments)])
    choice = _Choice(finish_reason="tool_calls")
    for group in itertools.zip_longest(*streams):
        choice.parts += [part for part in group if part is not None]
    return choice


def _forced_tool(request: ChatRequest) -> str | None:
    """The function ``tool_choice`` forces, if it forces one."""
    if not request.tools:
        return None
    choice = request.tool_choice
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        return name if isinstance(name, str) else None
    if choice == "required":
        return str(request.tools[0].get("function", {}).get("name", "tool"))
    return None


def _answer(request: ChatRequest, kind: str) -> list[_Choice]:
    forced = _forced_tool(request)
    answers = []
    for index in range(request.n):
        if forced is not None:
            answers.append(_tool_calls(request, index, [forced]))
        elif kind == "tools":
            names = [str(t.get("function", {}).get("name")) for t in request.tools[:2]]
            answers.append(_tool_calls(request, index, [*names, "get_weather", "get_time"][:2]))
        else:
            answers.append(_text(request, index, kind))
    return answers


# ---------------------------------------------------------------- streams

class _Chunks:
    """Serializes chat.completion.chunk events for one response."""

    def __init__(self, request: ChatRequest) -> None:
        rng = rng_for(request.seed, request.model, request.prompt, "id")
        self.head: dict[str, Any] = {
            "id": f"chatcmpl-mock{rng.getrandbits(64):016x}", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": request.model,
            "system_fingerprint": "fp_fanout_mock"}

    def event(self, choices: list[dict[str, Any]], usage: Any = None) -> bytes:
        body = {**self.head, "choices": choices}
        if usage is not None:
            body["usage"] = usage
        try:
            data = orjson.dumps(body)
        except TypeError:  # a lone surrogate to echo: JSON escapes it, orjson refuses it
            data = json.dumps(body).encode()
        return b"data: " + data + b"\n\n"

    def role(self, count: int) -> bytes:
        """The first chunk: the assistant role for ``count`` choices."""
        return self.event([{"index": i, "delta": {"role": "assistant", "content": ""},
                            "logprobs": None, "finish_reason": None} for i in range(count)])

    def finish(self, answers: list[_Choice]) -> bytes:
        return self.event([{"index": i, "delta": {}, "logprobs": None,
                            "finish_reason": a.finish_reason} for i, a in enumerate(answers)])

    def start(self, count: int) -> bytes:
        return self.role(count)

    def order(self, answers: list[_Choice]) -> Iterator[tuple[int, tuple[Any, ...]]]:
        return _interleaved(answers)

    def closing(self, answers: list[_Choice], usage: dict[str, Any] | None) -> list[Send]:
        """The finish chunk, the usage chunk (when asked for) and ``[DONE]``."""
        out = [Send(self.finish(answers))]
        if usage is not None:
            out.append(Send(self.event([], usage)))
        out.append(Send(DONE, terminal=True))
        return out

    def error_event(self, error: dict[str, Any], *, failed: bool = False) -> bytes:
        return b"data: " + orjson.dumps({"error": error}) + b"\n\n"

    def overloaded(self) -> bytes:
        return self.error_event({"message": "The server is overloaded (fanout mock).",
                                 "type": "overloaded_error", "code": "overloaded"})

    def ping(self) -> bytes:
        return b": ping - fanout keep-alive\n\n"

    def part(self, index: int, part: tuple[Any, ...]) -> bytes:
        if part[0] == "tool":
            _, tool_index, call_id, name, arguments = part
            call: dict[str, Any] = {"index": tool_index, "function": {"arguments": arguments}}
            if call_id is not None:
                call.update(id=call_id, type="function")
                call["function"]["name"] = name
            delta: dict[str, Any] = {"tool_calls": [call]}
        elif part[0] == "reasoning":
            delta = {"reasoning_content": part[1]}
        elif part[0] == "refusal":
            delta = {"refusal": part[1]}
        else:
            delta = {"content": part[1]}
        return self.event([{"index": index, "delta": delta, "logprobs": None,
                            "finish_reason": None}])


Encoder = _Chunks | ResponsesEncoder | AnthropicEncoder


def encoder(request: ChatRequest, ident: str | None = None) -> Encoder:
    """What renders this request's answer: its route's dialect.  ``ident``: every id
    and the model name replaced by it (``fault/echo-key:meta``)."""
    if request.api == "responses":
        return ResponsesEncoder(request, ident)
    if request.api == "anthropic":
        return AnthropicEncoder(request, ident)
    chunks = _Chunks(request)
    if ident is not None:
        chunks.head.update(id=ident, model=ident, system_fingerprint=ident)
    return chunks


def _error(request: ChatRequest, status: int, message: str, type_: str, *,
           param: str | None = None, code: str | None = None,
           headers: tuple[tuple[str, str], ...] = ()) -> Plan:
    """An error response in the shape of the request's route."""
    if request.api == "anthropic":
        return anthropic_error_plan(status, message, type_, headers)
    return error_plan(status, message, type_, param=param, code=code, headers=headers)


def _usage(request: ChatRequest, answers: list[_Choice]) -> dict[str, Any]:
    completion = sum(len(a.parts) if a.billed is None else a.billed for a in answers)
    reasoning = sum(1 for a in answers for p in a.parts if p[0] == "reasoning")
    return {"prompt_tokens": request.prompt_tokens, "completion_tokens": completion,
            "total_tokens": request.prompt_tokens + completion,
            "completion_tokens_details": {"reasoning_tokens": reasoning}}


def _pauses(request: ChatRequest, context: Context, default: float | tuple[float, float]
            ) -> Iterator[float]:
    """Seconds before each chunk: the request's cadence, else the server's, else the model's."""
    cadence = request.cadence if request.cadence is not None else context.cadence
    if cadence is not None:
        return itertools.repeat(cadence)
    if isinstance(default, tuple):
        rng = rng_for(request.seed, request.model, request.prompt, "cadence")
        low, high = default
        return (rng.uniform(low, high) for _ in itertools.count())
    return itertools.repeat(default)


def _stream(request: ChatRequest, answers: list[_Choice], pauses: Iterator[float]
            ) -> Iterator[Step]:
    chunks = encoder(request)
    yield Send(chunks.start(len(answers)))
    for index, part in chunks.order(answers):
        pause = next(pauses)
        if pause:
            yield Pause(pause)
        yield Send(chunks.part(index, part))
    yield from chunks.closing(answers, _usage(request, answers) if request.include_usage
                              else None)


def _interleaved(answers: list[_Choice]) -> Iterator[tuple[int, tuple[Any, ...]]]:
    """(choice index, part) in sending order: the choices take turns."""
    for group in itertools.zip_longest(*(a.parts for a in answers)):
        for index, part in enumerate(group):
            if part is not None:
                yield index, part


def _completion(request: ChatRequest, answers: list[_Choice]) -> Plan:
    if request.api != "chat":  # the dialect's own non-streamed body
        dialect = ResponsesEncoder(request) if request.api == "responses" else AnthropicEncoder(
            request)
        return json_plan(200, dialect.completion(answers, _usage(request, answers)))
    chunks = _Chunks(request)
    choices = []
    for index, answer in enumerate(answers):
        message: dict[str, Any] = {"role": "assistant", "content": answer.content or None}
        if answer.reasoning:
            message["reasoning_content"] = answer.reasoning
        refusal = "".join(p[1] for p in answer.parts if p[0] == "refusal")
        if refusal:
            message["refusal"] = refusal
        calls: dict[int, dict[str, Any]] = {}
        for part in answer.parts:
            if part[0] == "tool":
                call = calls.setdefault(part[1], {"id": part[2], "type": "function",
                                                  "function": {"name": part[3], "arguments": ""}})
                call["function"]["arguments"] += part[4]
        if calls:
            message["tool_calls"] = [calls[i] for i in sorted(calls)]
        choices.append({"index": index, "message": message, "logprobs": None,
                        "finish_reason": answer.finish_reason})
    return json_plan(200, {**chunks.head, "object": "chat.completion", "choices": choices,
                           "usage": _usage(request, answers)})


def _scripted(kind: str, cadence: float | tuple[float, float] = 0.0, *,
              cadence_arg: bool = True) -> Callable[[ChatRequest, Context], Plan]:
    def plan(request: ChatRequest, context: Context) -> Plan:
        answers = _answer(request, kind)
        if not request.stream:
            return _completion(request, answers)
        pauses = _own_pauses(request, context, cadence) if cadence_arg else _pauses(
            request, context, cadence)
        return Plan(200, SSE_HEADERS, steps=_stream(request, answers, pauses),
                    fragment=request.fragment)
    return plan


def _own_pauses(request: ChatRequest, context: Context, default: float | tuple[float, float]
                ) -> Iterator[float]:
    """``mock/reasoning:0.04``: seconds between chunks for this request, over the
    server's --cadence (only an X-Fanout-Cadence header is more specific)."""
    own = _arg(request, -1.0)
    if own >= 0 and request.cadence is None:
        return itertools.repeat(own)
    return _pauses(request, context, default)


# ---------------------------------------------------------------- faults

def _overcount(request: ChatRequest, context: Context) -> Plan:
    """``fault/overcount:K``: mock/fast's answer (``max_tokens`` honoured), its usage
    saying K times (default 10) the completion tokens it sent: a relay that bills more
    than ``max_tokens`` allows."""
    factor = max(1, int(_arg(request, 10)))
    answers = _answer(request, "text")
    for answer in answers:
        answer.billed = len(answer.parts) * factor
    if not request.stream:
        return _completion(request, answers)
    return Plan(200, SSE_HEADERS, steps=_stream(request, answers, _pauses(request, context, 0.0)),
                fragment=request.fragment)


def _overrun(request: ChatRequest, context: Context) -> Plan:
    """``fault/overrun:N``: N tokens (default 400), 20 ms apart, whatever ``max_tokens``
    says; its usage counts them truly: a server that does not enforce ``max_tokens``."""
    count = max(1, int(_arg(request, 400)))
    answers = _answer(attrs.evolve(request, max_tokens=None, tokens=count), "text")
    if not request.stream:
        return _completion(request, answers)
    return Plan(200, SSE_HEADERS, steps=_stream(request, answers,
                                                _pauses(request, context, 0.02)),
                fragment=request.fragment)


def _arg(request: ChatRequest, default: float) -> float:
    return _arg_at(request, 0, default)


def _arg_at(request: ChatRequest, index: int, default: float) -> float:
    """The ``index``-th ``:ARG`` as a number (``_arg`` is the first), else ``default``."""
    args = request.args
    try:
        return float(args[index]) if len(args) > index and args[index] else default
    except ValueError:
        return default


def _fault(transform: Callable[[ChatRequest, Iterator[Step]], Iterable[Step]]
           ) -> Callable[[ChatRequest, Context], Plan]:
    """A fault model: mock/fast's stream, transformed."""
    base = _scripted("text", cadence_arg=False)  # a fault's :ARG is its own

    def plan(request: ChatRequest, context: Context) -> Plan:
        normal = base(request, context)
        if normal.steps is None:
            return normal
        return attrs.evolve(normal, steps=transform(request, iter(normal.steps)))
    return plan


def _until_sends(steps: Iterator[Step], count: int) -> Iterator[Step]:
    """The steps up to and including the ``count``-th Send."""
    sent = 0
    for step in steps:
        yield step
        if isinstance(step, Send):
            sent += 1
            if sent >= count:
                return


def _next_send(steps: Iterator[Step]) -> Send | None:
    return next((s for s in steps if isinstance(s, Send)), None)


def _truncate(request: ChatRequest, steps: Iterator[Step]) -> Iterator[Step]:
    yield from _until_sends(steps, int(_arg(request, 5)))
    following = _next_send(steps)
    if following is not None:
        yield Send(following.data[: len(following.data) // 2])
    yield Abort()


def _no_done(request: ChatRequest, steps: Iterator[Step]) -> Iterator[Step]:
    for step in steps:
        if isinstance(step, Send) and step.terminal:
            return
        yield step


def _drop_chunked(request: ChatRequest, steps: Iterator[Step]) -> Iterator[Step]:
    yield from _until_sends(steps, int(_arg(request, 5)))
    following = _next_send(steps)
    yield Abort(following.data[: max(1, len(following.data) // 2)] if following else b"data")


def _stall(request: ChatRequest, steps: Iterator[Step]) -> Iterator[Step]:
    yield from _until_sends(steps, int(_arg(request, 5)))
    yield Hang()


def _heartbeat_stall(request: ChatRequest, steps: Iterator[Step]) -> Iterator[Step]:
    yield from _until_sends(steps, int(_arg(request, 5)))
    interval = request.cadence or 0.2
    ping = encoder(request).ping()  # a comment; Anthropic's ping event
    while True:
        yield Pause(interval)
        yield Send(ping)


def _pings(request: ChatRequest, context: Context) -> Plan:
    """The stream's first event, then only keep-alives (Anthropic: ping events; the others:
    comments), ``:SECONDS`` apart (default 0.2), until the client gives up."""
    interval = _arg(request, request.cadence or 0.2) or 0.2
    chunks = encoder(request)

    def steps() -> Iterator[Step]:
        yield Send(chunks.start(1))
        ping = chunks.ping()
        while True:
            yield Pause(interval)
            yield Send(ping)
    if not request.stream:
        return Plan(200, raw=True, steps=[Hang()])
    return Plan(200, SSE_HEADERS, steps=steps(), fragment=request.fragment)


def _ping_then_answer(request: ChatRequest, steps: Iterator[Step]) -> Iterator[Step]:
    """``fault/ping-then-answer:SECONDS:INTERVAL``: llama.cpp evaluating a long prompt.
    The headers, then only keep-alives (``: ping`` comments; Anthropic's ``ping``
    events) INTERVAL apart (default 1; 0: none, silence) for SECONDS (default 2), then
    mock/fast's whole answer, its first event included."""
    seconds = max(0.0, _arg(request, 2.0))
    interval = _arg_at(request, 1, 1.0)
    ping = encoder(request).ping()
    count = 0 if interval <= 0 else max(0, math.ceil(seconds / interval - 1e-9) - 1)
    for _ in range(count):  # none at SECONDS itself: the answer comes then
        yield Pause(interval)
        yield Send(ping)
    yield Pause(seconds - count * interval)
    yield from steps


def _slow_first_token(request: ChatRequest, steps: Iterator[Step]) -> Iterator[Step]:
    yield from _until_sends(steps, 1)  # the role chunk comes at once; content waits
    yield Pause(request.delay if request.delay is not None else _arg(request, 2.0))
    yield from steps


GARBAGE = (b"data: {\"choices\": [{\"index\": 0, \"delta\": {\"content\": \"unterminated\n\n",
           b"data: [1, 2, 3]\n\n", b"data: \"just a string\"\n\n", b"data: nul\n\n",
           b"data: {'single': 'quotes'}\n\n")


def _garbage(request: ChatRequest, steps: Iterator[Step]) -> Iterator[Step]:
    # In the event-named dialects the bad frames come as the commonest event.
    named = {"responses": b"event: response.output_text.delta\n",
             "anthropic": b"event: content_block_delta\n"}.get(request.api, b"")
    sends = 0
    for step in steps:
        if isinstance(step, Send) and not step.terminal:
            sends += 1
            if sends % 4 == 0:
                yield Send(named + GARBAGE[(sends // 4 - 1) % len(GARBAGE)])
        yield step


def _huge_event(request: ChatRequest, steps: Iterator[Step]) -> Iterator[Step]:
    size = int(_arg(request, 16 * 1024 * 1024))
    yield from _until_sends(steps, 3)
    yield Send(b'data: {"choices":[{"index":0,"delta":{"content":"')
    piece = b"x" * 65536
    for _ in range(size // len(piece)):
        yield Send(piece)
        yield Pause(0.001)  # slowly: a limit must hold while the bytes trickle in
    yield Send(b'"},"finish_reason":null}]}\n\n')
    yield from steps


def _bad_utf8(request: ChatRequest, steps: Iterator[Step]) -> Iterator[Step]:
    yield from _until_sends(steps, 3)
    yield Send(b'data: {"choices":[{"index":0,"delta":{"content":" bad \xff\xfe\xc3( bytes "}}]}'
               b"\n\n")
    yield from steps


def _error_event(request: ChatRequest, steps: Iterator[Step]) -> Iterator[Step]:
    yield from _until_sends(steps, 5)
    error = {"message": "The model crashed mid-stream (fanout mock).",
             "type": "server_error", "code": "mock_crash"}
    typed = bool(request.args) and request.args[0] == "typed"
    if request.api != "chat":  # the dialect's error event (:failed: response.failed)
        failed = bool(request.args) and request.args[0] == "failed"
        yield Send(encoder(request).error_event(error, failed=failed))
    elif typed:
        yield Send(b"event: error\ndata: " + orjson.dumps(error) + b"\n\n")
    else:
        yield Send(b"data: " + orjson.dumps({"error": error}) + b"\n\n")


def _fails_first(status: int, default_times: int) -> Callable[[ChatRequest, Context], Plan]:
    """``status`` for the first K requests of a conversation, then mock/fast's answer."""
    base = _scripted("text", cadence_arg=False)  # a fault's :ARG is its own

    def plan(request: ChatRequest, context: Context) -> Plan:
        times = int(_arg(request, default_times))
        attempt = context.attempt(request)
        if attempt > times:
            return base(request, context)
        if status == 429:
            return _rate_limited(request, f"Rate limit reached (fanout mock: attempt {attempt} "
                                 f"of {times} refused).")
        if status in (503, 529):
            return _error(request, status, "The engine is currently overloaded, please try "
                          f"again later (fanout mock: attempt {attempt} of {times}).",
                          "server_error" if status == 503 else "overloaded_error",
                          code="overloaded")
        return _error(request, status, f"The server had an error (fanout mock: attempt "
                      f"{attempt} of {times}).", "server_error")
    return plan


def _rate_limited(request: ChatRequest, message: str) -> Plan:
    """A 429 as OpenAI sends it, with Retry-After (whole seconds) and retry-after-ms."""
    wait = request.retry_after
    return _error(request, 429, f"{message} Please retry after {wait:g} s.", "rate_limit_error",
                  code="rate_limit_exceeded",
                      headers=(("retry-after", str(max(0, round(wait)))),
                               ("retry-after-ms", str(int(wait * 1000)))))


def _busy(request: ChatRequest, context: Context) -> Plan:
    """A relay's per-model concurrency limit under one key: 429 (with Retry-After)
    while N streams of this model are open, else mock text at 5 ms a chunk."""
    limit = max(1, int(_arg(request, 4)))
    model = request.name
    if context.streaming.get(model, 0) >= limit:
        return _rate_limited(request, f"Rate limit reached: {limit} concurrent requests for "
                             "this model are allowed.")
    plan = _scripted("text", 0.005, cadence_arg=False)(request, context)
    if plan.steps is None:
        return plan
    context.streaming[model] = context.streaming.get(model, 0) + 1

    def give_back() -> None:
        context.streaming[model] -= 1

    return attrs.evolve(plan, steps=_OnClose(plan.steps, give_back))


class _OnClose(Iterator[Step]):
    """Steps that run ``callback`` once: at their end, or on ``close()`` (the server
    closes every plan's steps, even one it never started, which a generator's
    ``finally`` would miss)."""

    def __init__(self, steps: Iterable[Step], callback: Callable[[], None]) -> None:
        self._steps = iter(steps)
        self._callback = callback
        self._closed = False

    def __next__(self) -> Step:
        try:
            return next(self._steps)
        except StopIteration:
            self.close()
            raise

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            close = getattr(self._steps, "close", None)
            if close is not None:
                close()
            self._callback()


def _empty_200(request: ChatRequest, context: Context) -> Plan:
    if not request.stream:
        return Plan(200, (("content-type", "application/json"),), b"")
    return Plan(200, SSE_HEADERS, steps=())


# ---------------------------------------------------------------- one slot (llama.cpp)

def _slot(cut: str, answer: Callable[[ChatRequest], list[_Choice]] | None = None
          ) -> Callable[[ChatRequest, Context], Plan]:
    """``slot/<cut>``: mock text (or ``answer``'s choices), at ``:SECONDS`` (default 0.02)
    between chunks, in the server's one slot.  Taking the slot cuts the stream that held
    it, the ``cut`` way of *that* stream's model."""
    def plan(request: ChatRequest, context: Context) -> Plan:
        ticket = context.slot.take()
        answers = _answer(request, "text") if answer is None else answer(request)
        if not request.stream:
            context.slot.release(ticket)  # answered at once: the slot is free again
            return _completion(request, answers)
        steps = _slot_stream(request, answers, _own_pauses(request, context, 0.02),
                             context.slot, ticket, cut)
        return Plan(200, SSE_HEADERS, steps=_OnClose(steps, partial(context.slot.release,
                                                                     ticket)),
                    fragment=request.fragment)
    return plan


def _slot_stream(request: ChatRequest, answers: list[_Choice], pauses: Iterator[float],
                 slot: Slot, ticket: int, cut: str) -> Iterator[Step]:
    """mock text that checks, before each chunk up to the finish, that it still holds the slot."""
    chunks = _Chunks(request)
    due: Iterator[tuple[float, bytes]] = itertools.chain(
        [(0.0, chunks.role(len(answers)))],
        ((next(pauses), chunks.part(index, part)) for index, part in _interleaved(answers)))
    sent = -1  # parts sent (the role chunk is none)
    for pause, data in due:
        if pause:
            yield Pause(pause)
        if not slot.holds(ticket):
            slot.cuts += 1
            yield from _slot_cut(cut, chunks, request, len(answers), sent)
            return
        yield Send(data)
        sent += 1
    slot.release(ticket)  # generation is over: what is left is sent whatever comes in
    yield Send(chunks.finish(answers))
    if request.include_usage:
        yield Send(chunks.event([], _usage(request, answers)))
    yield Send(DONE)


#: LiteLLM 1.108's event, byte for byte, when the connection to its backend closes or
#: resets mid-stream (seen with a server closing with FIN, with RST, and a llama.cpp
#: killed mid-answer); the chunked body then ends cleanly, without [DONE].
LITELLM_CONNECTION_ERROR = (
    b'data: {"error": {"message": "litellm.APIConnectionError: APIConnectionError: '
    b'OpenAIException - Connection error.", "type": null, "param": null, "code": "500"}}'
    b"\n\n")


def _slot_cut(cut: str, chunks: _Chunks, request: ChatRequest, count: int, sent: int
              ) -> Iterator[Step]:
    if cut == "litellm":  # LiteLLM in front: a finish, usage, [DONE], as a real end sends
        yield Send(chunks.finish([_Choice() for _ in range(count)]))
        if request.include_usage:
            yield Send(chunks.event([], {"prompt_tokens": request.prompt_tokens,
                                         "completion_tokens": sent,
                                         "total_tokens": request.prompt_tokens + sent,
                                         "completion_tokens_details": {"reasoning_tokens": 0}}))
        yield Send(DONE)
        return
    if cut == "litellm-error":  # LiteLLM 1.108 when its backend's connection closes or resets
        yield Send(LITELLM_CONNECTION_ERROR)  # then the body ends cleanly: no [DONE]
        return
    if cut == "relay":  # a LiteLLM-style relay in front turns the cut into a finished answer
        yield Send(chunks.event([{"index": i, "delta": {}, "finish_reason": "stop"}
                                 for i in range(count)]))
        yield Send(DONE)
        return
    yield Send(DONE)  # llama.cpp: [DONE], and no finish_reason for the cut choice
    if cut == "broken":
        yield Abort(b'data: {"choices":[{"index":0,"delta":{"content":"')


# ---------------------------------------------------------------- hostile servers

def _empty_stop(request: ChatRequest, context: Context) -> Plan:
    """The role chunk, then ``finish_reason: "stop"`` with no content at all (LiteLLM's
    answer to a context overflow, ``L10_context_overflow_stream``)."""
    answers = [_Choice() for _ in range(request.n)]
    if not request.stream:
        return _completion(request, answers)
    return Plan(200, SSE_HEADERS, steps=_stream(request, answers, iter(())),
                fragment=request.fragment)


def _no_usage(request: ChatRequest, context: Context) -> Plan:
    """mock/fast's answer, but never a usage chunk, even when ``stream_options`` asks
    (what many relays and local servers do): the result is flagged ``missing_usage``."""
    answers = _answer(request, "text")
    if not request.stream:
        return _completion(request, answers)
    steps = _stream(attrs.evolve(request, include_usage=False), answers,
                    _pauses(request, context, 0.0))
    return Plan(200, SSE_HEADERS, steps=steps, fragment=request.fragment)


def _unfinished_choice(request: ChatRequest, context: Context) -> Plan:
    """mock/fast's ``n`` answers, the last of which never gets its finish reason (the
    others do, and usage and ``[DONE]`` come): a server that cut one choice.  With
    ``n`` = 1 the one choice has none: a stream with no finish reason at all."""
    answers = _answer(request, "text")
    answers[-1].finish_reason = None
    if not request.stream:
        return _completion(request, answers)
    steps = _stream(request, answers, _pauses(request, context, 0.0))
    return Plan(200, SSE_HEADERS, steps=steps, fragment=request.fragment)


def _usage_per_choice(request: ChatRequest, context: Context) -> Plan:
    """mock/fast's ``n`` answers as llama.cpp sends them: after each choice's finish
    chunk, a usage chunk of that choice alone (its completion tokens, the prompt's
    tokens again), then ``[DONE]``."""
    answers = _answer(request, "text")
    if not request.stream:
        return _completion(request, answers)

    def steps() -> Iterator[Step]:
        chunks = _Chunks(request)
        yield Send(chunks.role(len(answers)))
        for index, part in _interleaved(answers):
            yield Send(chunks.part(index, part))
        for index, answer in enumerate(answers):
            yield Send(chunks.event([{"index": index, "delta": {}, "logprobs": None,
                                      "finish_reason": answer.finish_reason}]))
            if request.include_usage:
                yield Send(chunks.event([], _usage(request, [answer])))
        yield Send(DONE, terminal=True)

    return Plan(200, SSE_HEADERS, steps=steps(), fragment=request.fragment)


ECHO_MARKER = "fanout-echo-no-authorization-header"  # echoed when no key was sent
ECHO_PLACES = ("stream-error", "event-error", "http", "http-text", "json-200", "headers",
               "meta", "skipped", "escaped", "all")


def _escaped(text: str) -> bytes:
    """``text`` as the inside of a JSON string, every UTF-16 unit a ``\\uXXXX`` escape."""
    units = text.encode("utf-16-be")
    return b"".join(b"\\u%02x%02x" % (units[i], units[i + 1]) for i in range(0, len(units), 2))


def _echo_error(key: str) -> dict[str, Any]:
    return {"message": f"Incorrect API key provided: {key}. You can find your API key at "
            "https://example.invalid/keys (fanout mock echoes it).",
            "type": key, "code": key, "param": key}


def _echo_headers(key: str) -> tuple[tuple[str, str], ...]:
    return (("x-request-id", key), ("openai-model", key), ("retry-after", key),
            ("x-ratelimit-remaining-requests", key), ("set-cookie", f"fanout_echo={key}; Path=/"),
            ("x-echo", key))


def _echo_request(request: ChatRequest, context: Context) -> Plan:
    """``mock/echo-request``: the JSON body the request arrived with (keys sorted, no
    spaces) as the answer's text, whatever it asks for (tools, ``tool_choice``,
    ``max_tokens``): what a client sent, seen from the other side."""
    text = json.dumps(request.body, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    answers = []
    for index in range(request.n):
        rng = rng_for(request.seed, request.name, request.prompt, index)
        answers.append(_Choice(parts=[("content", piece) for piece in cut(rng, text)]))
    if not request.stream:
        return _completion(request, answers)
    return Plan(200, SSE_HEADERS, steps=_stream(request, answers, _own_pauses(request, context,
                                                                                0.0)),
                fragment=request.fragment)


def _echo_key(request: ChatRequest, context: Context) -> Plan:
    """``fault/echo-key:WHERE``: the request's bearer token sent back, at WHERE."""
    key = request.api_key or ECHO_MARKER
    where = request.args[0] if request.args and request.args[0] else "all"
    if where not in ECHO_PLACES:
        return _error(request, 400, f"fault/echo-key: {where!r} is not one of: "
                      f"{', '.join(ECHO_PLACES)}", "invalid_request_error", param="model")
    if where == "http":
        error = _echo_error(key)
        return _error(request, 401, error["message"], key, param=key, code=key)
    if where == "http-text":
        return Plan(500, (("content-type", "text/plain; charset=utf-8"),),
                    f"Internal Server Error: upstream refused Authorization: Bearer {key}\n"
                    .encode())
    headers = _echo_headers(key) if where in ("headers", "all") else ()
    if where == "json-200" or (not request.stream and where != "headers"):
        error = _echo_error(key)
        plan = _error(request, 200, error["message"], key, param=key, code=key)
        return attrs.evolve(plan, headers=(*plan.headers, *headers))
    answers = _answer(request, "text")
    if not request.stream:
        return attrs.evolve(_completion(request, answers), headers=(
            ("content-type", "application/json"), *headers))
    stream = _echo_stream if request.api == "chat" else _echo_dialect_stream
    return Plan(200, (*SSE_HEADERS, *headers), fragment=request.fragment,
                steps=stream(request, answers, _pauses(request, context, 0.0), key, where))


_EVENT_NAMES = {"responses": b"event: response.output_text.delta\n",
                "anthropic": b"event: content_block_delta\n"}


def _echo_dialect_stream(request: ChatRequest, answers: list[_Choice], pauses: Iterator[float],
                         key: str, where: str) -> Iterator[Step]:
    """``fault/echo-key`` in the Responses and Anthropic dialects: the key in ids and the
    model (meta), in frames that are no JSON (skipped), in an error event (stream-error,
    event-error), escaped as \\uXXXX (escaped), or all of them."""
    chunks = encoder(request, key if where in ("meta", "all") else None)
    named = _EVENT_NAMES[request.api]
    yield Send(chunks.start(len(answers)))
    parts = chunks.order(answers)
    for index, part in itertools.islice(parts, 2):
        pause = next(pauses)
        if pause:
            yield Pause(pause)
        yield Send(chunks.part(index, part))
    raw = key.encode("utf-8", "replace")
    if where in ("skipped", "all"):
        yield Send(named + b'data: {"error": {"message": "bad key ' + raw + b'"\n\n')
        yield Send(named + b"data: " + orjson.dumps(f"upstream: your key is {key}") + b"\n\n")
    if where in ("meta", "all"):
        yield Send(chunks.part(0, ("tool", 99, key, key, "{}")))
    if where in ("stream-error", "event-error"):
        yield Send(chunks.error_event(_echo_error(key)))
        return
    if where in ("escaped", "all"):  # all: the key raw in the type and code, escaped in text
        kind = orjson.dumps(key if where == "all" else "authentication_error")
        message = b'"Incorrect API key provided: ' + _escaped(key) + b'"'
        if request.api == "anthropic":
            data = b'{"type": "error", "error": {"type": ' + kind + b', "message": ' + message
            yield Send(b"event: error\ndata: " + data + b"}}\n\n")
        else:
            data = (b'{"type": "error", "code": ' + kind + b', "message": ' + message
                    + b', "param": null, "sequence_number": 9999}')
            yield Send(b"event: error\ndata: " + data + b"\n\n")
        return
    for index, part in parts:  # headers, meta, skipped: the rest of a normal stream
        pause = next(pauses)
        if pause:
            yield Pause(pause)
        yield Send(chunks.part(index, part))
    if where == "meta":
        answers = [attrs.evolve(answers[0], finish_reason="tool_calls"), *answers[1:]]
    yield from chunks.closing(answers, _usage(request, answers))


def _echo_stream(request: ChatRequest, answers: list[_Choice], pauses: Iterator[float],
                 key: str, where: str) -> Iterator[Step]:
    chunks = _Chunks(request)
    if where in ("meta", "all"):
        chunks.head.update(id=key, model=key, system_fingerprint=key)
    yield Send(chunks.role(len(answers)))
    parts = _interleaved(answers)
    for index, part in itertools.islice(parts, 2):
        pause = next(pauses)
        if pause:
            yield Pause(pause)
        yield Send(chunks.part(index, part))
    raw = key.encode("utf-8", "replace")
    if where in ("skipped", "all"):
        yield Send(b'data: {"error": {"message": "bad key ' + raw + b'"\n\n')  # invalid JSON
        yield Send(b"data: " + orjson.dumps(f"upstream: your key is {key}") + b"\n\n")
    if where in ("meta", "all"):
        yield Send(chunks.event([{"index": 0, "delta": {"tool_calls": [{
            "index": 0, "id": key, "type": "function",
            "function": {"name": key, "arguments": "{}"}}]},
            "logprobs": None, "finish_reason": None}]))
    if where == "stream-error":
        yield Send(b"data: " + orjson.dumps({"error": _echo_error(key)}) + b"\n\n")
        return
    if where == "event-error":
        yield Send(b"event: error\ndata: " + orjson.dumps({"error": _echo_error(key)}) + b"\n\n")
        return
    if where == "escaped":
        yield Send(b'data: {"error": {"message": "Incorrect API key provided: ' + _escaped(key)
                   + b'", "type": "invalid_request_error", "code": "invalid_api_key", '
                   b'"param": null}}\n\n')
        return
    if where == "all":  # the key in every field, and once more escaped in the message
        error = _echo_error(key)
        message = orjson.dumps(error.pop("message") + " Escaped: ")[:-1] + _escaped(key) + b'"'
        yield Send(b'data: {"error": {"message": ' + message + b", "
                   + orjson.dumps(error)[1:] + b"}\n\n")
        return
    for index, part in parts:  # headers, meta, skipped: the rest of a normal stream
        pause = next(pauses)
        if pause:
            yield Pause(pause)
        yield Send(chunks.part(index, part))
    if where == "meta":
        answers = [attrs.evolve(answers[0], finish_reason="tool_calls"), *answers[1:]]
    yield Send(chunks.finish(answers))
    if request.include_usage:
        yield Send(chunks.event([], _usage(request, answers)))
    yield Send(DONE)


def _no_response(request: ChatRequest, context: Context) -> Plan:
    """Read the request, then nothing at all: not even a status line."""
    return Plan(200, raw=True, steps=[Hang()])


def _drip_headers(request: ChatRequest, context: Context) -> Plan:
    """A status line, then an endless header, one byte every ``:SECONDS`` (default 0.5)."""
    seconds = _arg(request, 0.5)

    def steps() -> Iterator[Step]:
        yield Send(b"HTTP/1.1 200 OK\r\n")
        for byte in itertools.chain(b"x-fanout-drip: ", itertools.repeat(ord("a"))):
            yield Pause(seconds)
            yield Send(bytes((byte,)))
    return Plan(200, raw=True, steps=steps(), fragment=request.fragment or "event")


DRIP_BODY = b'data: {"choices":[{"index":0,"delta":{"content":"'


def _drip_body(request: ChatRequest, context: Context) -> Plan:
    """SSE headers, then one byte every ``:SECONDS`` (default 0.5) of an event that never ends."""
    seconds = _arg(request, 0.5)

    def steps() -> Iterator[Step]:
        for byte in itertools.chain(DRIP_BODY, itertools.repeat(ord("x"))):
            yield Send(bytes((byte,)))
            yield Pause(seconds)
    return Plan(200, SSE_HEADERS, steps=steps(), fragment=request.fragment)


def _gzipped(request: ChatRequest, context: Context) -> Plan:
    """mock/fast, gzipped as it goes (``Accept-Encoding: identity`` or not)."""
    return attrs.evolve(_scripted("text", cadence_arg=False)(request, context), gzip=True)


def _gzip_bomb_plan(request: ChatRequest, context: Context) -> Plan:
    """``:MB`` (default 1024) MiB of content chunks once inflated; about 1.7 KiB a MiB sent."""
    mib = min(max(1, int(_arg(request, 1024))), 16 * 1024)
    steps = (Send(piece) for piece in gzip_bomb(mib))
    return Plan(200, (*SSE_HEADERS, ("content-encoding", "gzip"),
                      ("x-fanout-inflated-bytes", str(mib * MIB))), steps=steps,
                fragment=request.fragment)


def _endless(request: ChatRequest, context: Context) -> Plan:
    """Small content deltas forever, ``:SECONDS`` (default 0) apart."""
    seconds = request.cadence if request.cadence is not None else _arg(request, 0.0)
    pieces = fragments(rng_for(request.seed, request.name, request.prompt), 64)

    def steps() -> Iterator[Step]:
        chunks = encoder(request)
        yield Send(chunks.start(1))
        for piece in itertools.cycle(pieces):
            if seconds:
                yield Pause(seconds)
            yield Send(chunks.part(0, ("content", piece)))
    return Plan(200, SSE_HEADERS, steps=steps(), fragment=request.fragment)


def _many_choices(request: ChatRequest, context: Context) -> Plan:
    """``:N`` (default 100000) chunks, each a one-character delta of a new choice index."""
    count = max(1, int(_arg(request, 100_000)))

    def steps() -> Iterator[Step]:
        chunks = _Chunks(request)
        for index in range(count):
            yield Send(chunks.event([{"index": index, "delta": {"content": "x"},
                                      "logprobs": None, "finish_reason": None}]))
        yield Send(DONE)
    return Plan(200, SSE_HEADERS, steps=steps(), fragment=request.fragment)


def _many_tools(request: ChatRequest, context: Context) -> Plan:
    """One choice whose ``:N`` (default 100000) tool-call deltas each open a new tool index."""
    count = max(1, int(_arg(request, 100_000)))

    def steps() -> Iterator[Step]:
        chunks = _Chunks(request)
        yield Send(chunks.role(1))
        for index in range(count):
            yield Send(chunks.event([{"index": 0, "delta": {"tool_calls": [{
                "index": index, "id": f"call_{index}", "type": "function",
                "function": {"name": "t", "arguments": "{}"}}]},
                "logprobs": None, "finish_reason": None}]))
        yield Send(chunks.event([{"index": 0, "delta": {}, "logprobs": None,
                                  "finish_reason": "tool_calls"}]))
        yield Send(DONE)
    return Plan(200, SSE_HEADERS, steps=steps(), fragment=request.fragment)


def _negative_index(request: ChatRequest, steps: Iterator[Step]) -> Iterator[Step]:
    chunks = _Chunks(request)
    yield from _until_sends(steps, 3)
    yield Send(chunks.event([{"index": -1, "delta": {"content": "negative choice"},
                              "logprobs": None, "finish_reason": None}]))
    yield Send(chunks.event([{"index": 0, "delta": {"tool_calls": [{
        "index": -1, "id": "call_negative", "type": "function",
        "function": {"name": "negative", "arguments": "{}"}}]},
        "logprobs": None, "finish_reason": None}]))
    yield from steps


BIG_INDEX = 2**64  # 18446744073709551616: one past the largest unsigned 64-bit integer
BIG_COUNT = 10**30


def _big_int(request: ChatRequest, steps: Iterator[Step]) -> Iterator[Step]:
    head = _Chunks(request).head  # orjson refuses integers past 64 bits: json writes them

    def event(body: dict[str, Any]) -> bytes:
        return b"data: " + json.dumps({**head, **body}, separators=(",", ":")).encode() + b"\n\n"

    yield from _until_sends(steps, 3)
    yield Send(event({"choices": [{"index": BIG_INDEX, "delta": {"content": "big"},
                                   "logprobs": None, "finish_reason": None}]}))
    for step in steps:
        if isinstance(step, Send) and step.data == DONE:
            yield Send(event({"choices": [], "usage": {
                "prompt_tokens": BIG_COUNT, "completion_tokens": BIG_COUNT,
                "total_tokens": 2 * BIG_COUNT}}))
        yield step


HTML_PAGE = b"""<!DOCTYPE html>
<html><head><title>Sign in to continue</title></head>
<body><h1>Network login required</h1>
<p>Please sign in to the guest network to continue.</p>
<form method="post" action="/login"><input name="user"><input name="password" type="password">
<button>Sign in</button></form></body></html>
"""


def _html(request: ChatRequest, context: Context) -> Plan:
    """A captive portal's (or a proxy's) login page, 200 text/html, for any request."""
    return Plan(200, (("content-type", "text/html; charset=utf-8"),), HTML_PAGE)


def _json_body(request: ChatRequest, context: Context) -> Plan:
    """A whole ``chat.completion`` as JSON, even when a stream was asked for."""
    return _completion(request, _answer(request, "text"))


def _json_error_200(request: ChatRequest, context: Context) -> Plan:
    plan = _error(request, 500, "The upstream provider returned an error (fanout mock: a 200 "
                  "that is not).", "upstream_error", code="upstream_error")
    return attrs.evolve(plan, status=200)


VALIDATION_MESSAGE = (
    "litellm.InternalServerError: InternalServerError: OpenAIException - 1 validation error:\n"
    "  {'type': 'float_parsing', 'loc': ('body', 'temperature'), 'msg': 'Input should be a "
    "valid number, unable to parse string as a number', 'input': 'hot'}\n\n"
    "LiteLLM: model group 'fanout-mock' failed with the error above. No fallback was attempted.")


def _validation_500(request: ChatRequest, context: Context) -> Plan:
    """A request error dressed as a 500, as LiteLLM sends it (``L11_bad_type``): retrying
    it can never help."""
    return _error(request, 500, VALIDATION_MESSAGE, "internal_server_error", code="500")


def _bad_request(request: ChatRequest, context: Context) -> Plan:
    return _error(request, 400, "Invalid 'messages[0].content': string too long. Expected a "
                  "string with maximum length 1048576 (fanout mock).", "invalid_request_error",
                  param="messages[0].content", code="string_above_max_length")


def _first_k(default_times: int, bad: Callable[[ChatRequest], Iterable[Step]]
             ) -> Callable[[ChatRequest, Context], Plan]:
    """The first K streamed requests of a conversation get ``bad``'s stream, then mock/fast."""
    base = _scripted("text", cadence_arg=False)

    def plan(request: ChatRequest, context: Context) -> Plan:
        times = int(_arg(request, default_times))
        if context.attempt(request) > times or not request.stream:
            return base(request, context)
        return Plan(200, SSE_HEADERS, steps=bad(request), fragment=request.fragment)
    return plan


def _role_only(request: ChatRequest) -> Iterable[Step]:
    return [Send(encoder(request).start(request.n))]


def _overloaded(request: ChatRequest) -> Iterable[Step]:
    """The stream's first event, then the dialect's overloaded error (Anthropic's
    ``overloaded_error`` event), before any content; then the body ends."""
    chunks = encoder(request)
    return [Send(chunks.start(request.n)), Send(chunks.overloaded())]


def _done_only(request: ChatRequest) -> Iterable[Step]:
    return [Send(DONE)]


def _set_cookie(request: ChatRequest, context: Context) -> Plan:
    """mock/fast with a new session cookie each time (``Context.cookies_seen`` records
    the Cookie header of every request, this model's or not)."""
    plan = _scripted("text", cadence_arg=False)(request, context)
    cookie = ("set-cookie", f"fanout_session={secrets.token_hex(16)}; Path=/")
    return attrs.evolve(plan, headers=(*plan.headers, cookie))


# ---------------------------------------------------------------- replay

def plan_replay(request: ChatRequest, context: Context, name: str) -> Plan | None:
    """``replay/<name>[:xSCALE]``: the capture's status, headers, body and read timing."""
    capture = context.capture(name)
    if capture is None:
        return None
    scale = 1.0
    if request.args and request.args[0].startswith("x"):
        try:
            scale = float(request.args[0][1:])
        except ValueError:
            scale = 1.0
    headers = tuple((k, v) for k, v in capture.headers
                    if k.lower() in ("content-type", "x-request-id", "retry-after"))
    if request.api != "chat" and capture.status == 200 and "event-stream" in (
            capture.content_type or "text/event-stream"):
        return Plan(200, SSE_HEADERS, steps=_replay_in_dialect(request, capture, scale),
                    fragment=request.fragment or "event")

    def steps() -> Iterator[Step]:
        previous = next((t for t, n in capture.reads if n == 0), 0.0)
        for at_ms, piece in capture.pieces():
            if scale and at_ms > previous:
                yield Pause((at_ms - previous) / 1000 * scale)
            previous = max(previous, at_ms)
            yield Send(piece)

    return Plan(capture.status, headers, steps=steps(), fragment=request.fragment or "event")


def _replay_in_dialect(request: ChatRequest, capture: Capture, scale: float
                       ) -> Iterator[Step]:
    """A recorded chat stream said again in the request's dialect, at its recorded times:
    each content, reasoning or tool-call delta of choice 0 one write, the finish and
    usage at the end.  A capture that ends without ``[DONE]`` ends here without the
    dialect's terminal event (a cut stays a cut); one whose ``[DONE]`` came without a
    finish reason (llama.cpp's cut) too.  Tool-call fragments are held and sent by call
    at the end: these dialects send one call (block, item) at a time, chat may interleave."""
    chunks = encoder(request)
    answer = _Choice()
    tools = _Choice()
    finish: str | None = None
    usage: dict[str, Any] | None = None
    previous = next((t for t, n in capture.reads if n == 0), 0.0)
    started = False
    kind = ""
    for at_ms, kind, value in chat_stream_parts(capture.pieces()):
        if scale and at_ms > previous:
            yield Pause((at_ms - previous) / 1000 * scale)
        previous = max(previous, at_ms)
        if not started:
            started = True
            yield Send(chunks.start(1))
        if kind == "part" and value[0] == "tool":
            tools.parts.append(value)
        elif kind == "part":
            answer.parts.append(value)
            yield Send(chunks.part(0, value))
        elif kind == "finish":
            finish = value
        elif kind == "usage":
            usage = value
        elif kind == "done":
            break
    for _, part in grouped([tools]):
        answer.parts.append(part)
        yield Send(chunks.part(0, part))
    if kind == "done" and finish is not None:
        answer.finish_reason = finish
        yield from chunks.closing([answer], usage)


# ---------------------------------------------------------------- registry

CHAT_ONLY = ("chat",)  # chat-shaped hostile bytes: no other dialect has these fields

SCRIPTED_MODELS: dict[str, ModelSpec] = {spec.id: spec for spec in [
    ModelSpec("mock/fast", "text as fast as the socket takes it", _scripted("text")),
    ModelSpec("mock/slow", "text at 20-60 ms a token", _scripted("text", (0.02, 0.06))),
    ModelSpec("mock/echo", "repeats the last user message", _scripted("echo")),
    ModelSpec("mock/echo-request", "answers with the JSON body it received (keys sorted)",
              _echo_request),
    ModelSpec("mock/reasoning", "reasoning deltas first, then the answer",
              _scripted("reasoning")),
    ModelSpec("mock/refusal", "refuses: refusal deltas, no content", _scripted("refusal")),
    ModelSpec("mock/tools", "two parallel tool calls, argument fragments interleaved",
              _scripted("tools")),
    ModelSpec("mock/length", "stops at max_tokens (default 16): finish_reason length",
              _scripted("length")),
    ModelSpec("fault/truncate", "connection closed mid-event after N chunks (:N, default 5)",
              _fault(_truncate)),
    ModelSpec("fault/no-done", "clean close after the finish, without the terminal event "
              "([DONE], response.completed, message_stop)", _fault(_no_done)),
    ModelSpec("fault/drop-chunked", "socket closed in the middle of an HTTP chunk (:N)",
              _fault(_drop_chunked)),
    ModelSpec("fault/stall", "stops sending after N chunks, socket kept open (:N)",
              _fault(_stall)),
    ModelSpec("fault/heartbeat-stall", "only keep-alives after N chunks (:N): `: ping` "
              "comments, Anthropic's ping events", _fault(_heartbeat_stall)),
    ModelSpec("fault/pings", "the first event, then only keep-alives (Anthropic: ping events, "
              "the others: comments) :SECONDS apart (default 0.2), forever", _pings),
    ModelSpec("fault/slow-first-token", "the first content after a delay (:SECONDS, default 2)",
              _fault(_slow_first_token)),
    ModelSpec("fault/ping-then-answer", "llama.cpp on a long prompt: only keep-alives "
              "(`: ping` comments, Anthropic's ping events) :INTERVAL apart (default 1; 0: "
              "silence) for :SECONDS (default 2), then the whole answer",
              _fault(_ping_then_answer)),
    ModelSpec("fault/garbage", "a malformed JSON frame after every 4th good one",
              _fault(_garbage)),
    ModelSpec("fault/huge-event", "one event of :BYTES (default 16 MiB), sent slowly",
              _fault(_huge_event), CHAT_ONLY),
    ModelSpec("fault/bad-utf8", "invalid UTF-8 bytes inside a content delta", _fault(_bad_utf8),
              CHAT_ONLY),
    ModelSpec("fault/error-event", "an in-stream error after some text: data: {\"error\"} "
              "(:typed for event: error); the dialect's error event (:failed: "
              "response.failed)", _fault(_error_event)),
    ModelSpec("fault/429", "429 with Retry-After for the first K requests (:K, default 2)",
              _fails_first(429, 2)),
    ModelSpec("fault/500-then-ok", "500 for the first K requests (:K, default 1)",
              _fails_first(500, 1)),
    ModelSpec("fault/529-then-ok", "529 overloaded for the first K requests (:K, default 1)",
              _fails_first(529, 1)),
    ModelSpec("fault/overloaded", "first K streams: the first event, then an overloaded "
              "error event before any content (:K, default 1)", _first_k(1, _overloaded)),
    ModelSpec("fault/busy", "429 + Retry-After while N streams of it are open (:N, default 4)",
              _busy),
    ModelSpec("fault/empty-200", "200 and an empty body", _empty_200),
    ModelSpec("slot/clean", "llama.cpp's one slot: a new slot/* request cuts this stream: "
              "[DONE], no finish_reason (:SECONDS between chunks, default 0.02)",
              _slot("clean"), CHAT_ONLY),
    ModelSpec("slot/broken", "as slot/clean, and after [DONE] the HTTP chunked framing breaks",
              _slot("broken"), CHAT_ONLY),
    ModelSpec("slot/relay", "as slot/clean behind a LiteLLM-style relay: the cut becomes "
              "finish_reason stop, then [DONE]", _slot("relay"), CHAT_ONLY),
    ModelSpec("slot/litellm", "as slot/clean behind LiteLLM: the cut becomes finish_reason "
              "stop, usage (when asked) and [DONE], byte for byte a finished answer",
              _slot("litellm"), CHAT_ONLY),
    ModelSpec("slot/litellm-error", "as slot/clean behind LiteLLM when it reports the cut: "
              "an in-band error event, APIConnectionError ... Connection error.",
              _slot("litellm-error"), CHAT_ONLY),
    ModelSpec("fault/no-usage", "mock/fast's answer without usage, even when asked",
              _no_usage),
    ModelSpec("fault/unfinished-choice", "mock/fast's n answers, the last one never "
              "finished (no finish_reason), then usage and [DONE]", _unfinished_choice,
              CHAT_ONLY),
    ModelSpec("fault/usage-per-choice", "mock/fast's n answers, each choice's finish "
              "followed by a usage chunk of its own (llama.cpp with n > 1)",
              _usage_per_choice, CHAT_ONLY),
    ModelSpec("fault/empty-stop", "the role chunk, then finish_reason stop with no content",
              _empty_stop),
    ModelSpec("fault/echo-key", "echoes the bearer token back (:WHERE: stream-error, "
              "event-error, http, http-text, json-200, headers, meta, skipped, escaped, all)",
              _echo_key),
    ModelSpec("fault/no-response", "reads the request, never sends a byte, keeps the socket",
              _no_response),
    ModelSpec("fault/drip-headers", "a status line, then an endless header, a byte every "
              ":SECONDS (default 0.5)", _drip_headers),
    ModelSpec("fault/drip-body", "SSE headers, then an event that never ends, a byte every "
              ":SECONDS (default 0.5)", _drip_body),
    ModelSpec("fault/gzip", "content-encoding gzip, whatever Accept-Encoding says",
              _gzipped),
    ModelSpec("fault/gzip-bomb", "a small gzip body that inflates to :MB MiB of SSE "
              "(default 1024)", _gzip_bomb_plan, CHAT_ONLY),
    ModelSpec("fault/endless", "content deltas that never end (:SECONDS between, default 0)",
              _endless),
    ModelSpec("fault/many-choices", "a one-character delta for a new choice index every "
              "chunk, :N of them (default 100000)", _many_choices, CHAT_ONLY),
    ModelSpec("fault/many-tools", "tool-call deltas, each a new tool index, :N of them "
              "(default 100000)", _many_tools, CHAT_ONLY),
    ModelSpec("fault/negative-index", "a chunk with choice index -1 and one with tool index -1",
              _fault(_negative_index), CHAT_ONLY),
    ModelSpec("fault/overcount", "mock/fast whose usage says K times the completion tokens "
              "it sent (:K, default 10), past max_tokens", _overcount),
    ModelSpec("fault/overrun", "N tokens 20 ms apart (:N, default 400), ignoring max_tokens; "
              "true usage", _overrun),
    ModelSpec("fault/big-int", "choice index 2**64 and usage counts of 10**30",
              _fault(_big_int), CHAT_ONLY),
    ModelSpec("fault/html", "200 text/html: a captive portal's login page", _html),
    ModelSpec("fault/json-body", "a whole chat.completion as JSON, even for a stream",
              _json_body),
    ModelSpec("fault/json-error-200", "200 application/json with an {\"error\"} body",
              _json_error_200),
    ModelSpec("fault/validation-500", "500 whose JSON error names a validation error "
              "(LiteLLM's L11_bad_type)", _validation_500),
    ModelSpec("fault/400", "an OpenAI-shaped 400 invalid_request_error", _bad_request),
    ModelSpec("fault/503-then-ok", "503 for the first K requests (:K, default 1)",
              _fails_first(503, 1)),
    ModelSpec("fault/cut-before-content", "first K streams: the role chunk, then a clean "
              "close without [DONE] (:K, default 1)", _first_k(1, _role_only)),
    ModelSpec("fault/done-only", "first K streams: data: [DONE] and nothing else (:K, "
              "default 1)", _first_k(1, _done_only), CHAT_ONLY),
    ModelSpec("fault/set-cookie", "mock/fast with Set-Cookie: fanout_session=<random>",
              _set_cookie),
]}
