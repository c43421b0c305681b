"""Hypothesis strategies: whole chat-completion streams with their expected results."""

from __future__ import annotations

import json
from typing import Any

import attrs
from hypothesis import strategies as st

FINISH_REASONS = ["stop", "length", "tool_calls", "content_filter", None]

# Text with multibyte characters, emoji, controls and U+2028 (a line end to
# str.splitlines, never to SSE).  Hypothesis leaves out lone surrogates.
fragments = st.text(
    alphabet=st.one_of(
        st.characters(codec="utf-8"),
        st.sampled_from(["\n", "\r", "\u2028", "\x85", "é", "わ", "👍", "☀", "\ufe0f", " ", "\""]),
    ),
    min_size=1,
    max_size=8,
)
comment_text = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="\r\n"), max_size=20
)


@attrs.define
class ExpectedCall:
    id: str
    name: str
    arguments: str = ""


@attrs.define
class ExpectedChoice:
    text: str = ""
    reasoning: str = ""
    finish_reason: str | None = None
    calls: dict[int, ExpectedCall] = attrs.Factory(dict)


@attrs.frozen
class GeneratedStream:
    body: bytes
    choices: dict[int, ExpectedChoice]
    usage_total: int | None
    comments: int
    done: bool


@st.composite
def chat_streams(draw: st.DrawFn) -> GeneratedStream:
    n = draw(st.integers(1, 3))
    choice_index = st.integers(0, n - 1)
    ops = draw(
        st.lists(
            st.one_of(
                st.tuples(st.just("text"), choice_index, fragments),
                st.tuples(st.just("reasoning"), choice_index, fragments),
                st.tuples(st.just("tool"), choice_index, st.integers(0, 2), fragments,
                          st.booleans()),
                st.tuples(st.just("comment"), comment_text),
            ),
            max_size=25,
        )
    )
    choices: dict[int, ExpectedChoice] = {}
    frames: list[Any] = []  # a dict is a chunk, a str a comment
    comments = 0
    for op in ops:
        kind = op[0]
        if kind == "comment":
            frames.append(op[1])
            comments += 1
            continue
        index = op[1]
        expected = choices.setdefault(index, ExpectedChoice())
        if kind == "text":
            expected.text += op[2]
            frames.append({"choices": [{"index": index, "delta": {"content": op[2]}}]})
        elif kind == "reasoning":
            expected.reasoning += op[2]
            frames.append({"choices": [{"index": index, "delta": {"reasoning_content": op[2]}}]})
        else:
            _, _, tool_index, arguments, repeat = op
            call: dict[str, Any] = {"index": tool_index, "function": {"arguments": arguments}}
            if tool_index not in expected.calls or repeat:  # some relays repeat id and name
                call["id"] = f"call_{index}_{tool_index}"
                call["type"] = "function"
                call["function"]["name"] = f"fn_{tool_index}"
            expected.calls.setdefault(
                tool_index, ExpectedCall(f"call_{index}_{tool_index}", f"fn_{tool_index}")
            ).arguments += arguments
            frames.append({"choices": [{"index": index, "delta": {"tool_calls": [call]}}]})
    for index in range(n):
        reason = draw(st.sampled_from(FINISH_REASONS))
        if reason is not None:
            choices.setdefault(index, ExpectedChoice()).finish_reason = reason
            frames.append({"choices": [{"index": index, "delta": {}, "finish_reason": reason}]})
    usage_total = None
    if draw(st.booleans()):
        usage_total = draw(st.integers(0, 10_000))
        frames.append({"choices": [], "usage": {"prompt_tokens": 1,
                                                "completion_tokens": usage_total - 1,
                                                "total_tokens": usage_total}})
    done = draw(st.booleans())

    text = "\ufeff" if draw(st.booleans()) else ""
    for frame in frames:
        end = draw(st.sampled_from(["\n", "\r\n", "\r"]))
        if isinstance(frame, str):
            text += f":{frame}{end}"
            continue
        frame = {"id": "chatcmpl-x", "object": "chat.completion.chunk", **frame}
        encoded = json.dumps(frame, ensure_ascii=draw(st.booleans()),
                             indent=1 if draw(st.booleans()) else None)
        text += "".join(f"data: {line}{end}" for line in encoded.split("\n")) + end
    if done:
        text += "data: [DONE]\n\n"
    return GeneratedStream(text.encode(), choices, usage_total, comments, done)


# -- The three dialects: one scripted answer, rendered as each would stream it ------------

NATURAL = "natural"  # stop, or tool_calls when the answer calls tools
DIALECT_FINISHES = [NATURAL, "length", "content_filter"]

# JSON values whose text has quotes, backslashes and \u escapes to cut through.
_json_leaves = st.one_of(
    st.integers(-10**6, 10**6),
    st.booleans(),
    st.none(),
    st.text(alphabet=st.one_of(st.characters(codec="utf-8"),
                               st.sampled_from(['"', "\\", "/", "\n", "é", "👍", "\u2028"])),
            max_size=10),
)
tool_arguments = st.dictionaries(st.text(alphabet="abcxyz_", min_size=1, max_size=5),
                                 st.one_of(_json_leaves, st.lists(_json_leaves, max_size=3)),
                                 max_size=4)


@attrs.frozen
class ScriptedCall:
    id: str
    name: str
    arguments: str  # JSON text
    fragments: tuple[str, ...]  # ``arguments`` cut anywhere (inside escapes too)


@attrs.frozen
class Script:
    """One answer, independent of the dialect that streams it."""

    reasoning: tuple[str, ...]
    text: tuple[str, ...]
    calls: tuple[ScriptedCall, ...]
    finish: str  # NATURAL, length or content_filter
    prompt_tokens: int
    cached_tokens: int  # of prompt_tokens (Anthropic sends them apart)
    completion_tokens: int
    signature: str

    @property
    def finish_reason(self) -> str:
        """The chat finish reason every dialect must end up with."""
        if self.finish == NATURAL:
            return "tool_calls" if self.calls else "stop"
        return self.finish

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def _cut(draw: st.DrawFn, text: str) -> tuple[str, ...]:
    from itertools import pairwise

    if not text:
        return ()
    points = sorted(set(draw(st.lists(st.integers(1, max(1, len(text) - 1)), max_size=6))))
    bounds = [0, *[p for p in points if 0 < p < len(text)], len(text)]
    return tuple(text[a:b] for a, b in pairwise(bounds))


@st.composite
def scripts(draw: st.DrawFn, *, max_calls: int = 3) -> Script:
    calls = []
    for number in range(draw(st.integers(0, max_calls))):
        arguments = json.dumps(draw(tool_arguments), ensure_ascii=draw(st.booleans()))
        calls.append(ScriptedCall(f"call_{number}", f"fn_{number}", arguments,
                                  _cut(draw, arguments)))
    prompt = draw(st.integers(0, 5000))
    return Script(
        reasoning=tuple(draw(st.lists(fragments, max_size=4))),
        text=tuple(draw(st.lists(fragments, max_size=8))),
        calls=tuple(calls),
        finish=draw(st.sampled_from(DIALECT_FINISHES)),
        prompt_tokens=prompt,
        cached_tokens=draw(st.integers(0, prompt)),
        completion_tokens=draw(st.integers(0, 5000)),
        signature=draw(st.text(alphabet=string_letters, min_size=8, max_size=40)),
    )


string_letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/="


@attrs.frozen
class Rendering:
    """How a dialect's frames become bytes (servers differ in all of these)."""

    named: bool = True  # `event:` lines (Anthropic's SDK needs them; Responses' does not)
    ends: tuple[str, ...] = ("\n",)  # line endings, used in turn
    ascii: bool = False
    indent: bool = False  # multi-line data
    bom: bool = False


renderings = st.builds(
    Rendering,
    named=st.booleans(),
    ends=st.lists(st.sampled_from(["\n", "\r\n", "\r"]), min_size=1, max_size=3).map(tuple),
    ascii=st.booleans(),
    indent=st.booleans(),
    bom=st.booleans(),
)


def serialize(frames: list[Any], rendering: Rendering = Rendering()) -> bytes:
    """Frames (dicts: JSON events named by their ``type``; str: comments) as SSE bytes."""
    text = "\ufeff" if rendering.bom else ""
    for number, frame in enumerate(frames):
        end = rendering.ends[number % len(rendering.ends)]
        if isinstance(frame, str):
            text += f":{frame}{end}"
            continue
        encoded = json.dumps(frame, ensure_ascii=rendering.ascii,
                             indent=1 if rendering.indent else None)
        if rendering.named and isinstance(frame.get("type"), str):
            text += f"event: {frame['type']}{end}"
        text += "".join(f"data: {line}{end}" for line in encoded.split("\n")) + end
    return text.encode()


def chat_frames(script: Script, *, terminal: bool = True) -> list[Any]:
    """The script as chat-completion chunks (``[DONE]`` as the str ``"[DONE]"`` marker)."""
    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
        return {"id": "chatcmpl-s", "object": "chat.completion.chunk", "model": "m",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}

    frames: list[Any] = [chunk({"role": "assistant", "content": ""})]
    frames += [chunk({"reasoning_content": piece}) for piece in script.reasoning]
    frames += [chunk({"content": piece}) for piece in script.text]
    for index, call in enumerate(script.calls):
        frames.append(chunk({"tool_calls": [{"index": index, "id": call.id, "type": "function",
                                             "function": {"name": call.name, "arguments": ""}}]}))
        frames += [chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
                   for piece in call.fragments]
    frames.append(chunk({}, script.finish_reason))
    frames.append({"id": "chatcmpl-s", "object": "chat.completion.chunk", "model": "m",
                   "choices": [], "usage": {"prompt_tokens": script.prompt_tokens,
                                            "completion_tokens": script.completion_tokens,
                                            "total_tokens": script.total_tokens}})
    if terminal:
        frames.append(DONE)
    return frames


DONE = "[DONE]"


def chat_bytes(script: Script, *, terminal: bool = True) -> bytes:
    frames = chat_frames(script, terminal=terminal)
    body = serialize([f for f in frames if f is not DONE], Rendering(named=False))
    return body + (b"data: [DONE]\n\n" if terminal else b"")


def responses_frames(script: Script, *, terminal: bool = True,
                     noise: tuple[Any, ...] = ()) -> list[Any]:
    """The script as a Responses stream; ``noise`` frames go after ``response.created``."""
    seq = iter(range(10**6))
    base = {"id": "resp_s", "object": "response", "created_at": 1795978800, "model": "m",
            "output": [], "usage": None, "error": None, "incomplete_details": None,
            "status": "in_progress"}
    frames: list[Any] = [{"type": "response.created", "response": base},
                         *(dict(f) if isinstance(f, dict) else f for f in noise),
                         {"type": "response.in_progress", "response": base}]
    output: list[dict[str, Any]] = []

    def event(kind: str, **fields: Any) -> dict[str, Any]:
        return {"type": kind, **fields}

    position = 0
    if script.reasoning:
        item = {"id": "rs_0", "type": "reasoning", "summary": [], "status": "in_progress"}
        frames.append(event("response.output_item.added", output_index=position, item=item))
        frames.append(event("response.reasoning_summary_part.added", item_id="rs_0",
                            output_index=position, summary_index=0,
                            part={"type": "summary_text", "text": ""}))
        frames += [event("response.reasoning_summary_text.delta", item_id="rs_0",
                         output_index=position, summary_index=0, delta=piece)
                   for piece in script.reasoning]
        whole = "".join(script.reasoning)
        frames.append(event("response.reasoning_summary_text.done", item_id="rs_0",
                            output_index=position, summary_index=0, text=whole))
        done = {**item, "summary": [{"type": "summary_text", "text": whole}],
                "status": "completed"}
        frames.append(event("response.output_item.done", output_index=position, item=done))
        output.append(done)
        position += 1
    if script.text or not script.calls:
        item = {"id": "msg_0", "type": "message", "role": "assistant", "content": [],
                "status": "in_progress"}
        frames.append(event("response.output_item.added", output_index=position, item=item))
        frames.append(event("response.content_part.added", item_id="msg_0",
                            output_index=position, content_index=0,
                            part={"type": "output_text", "text": "", "annotations": []}))
        frames += [event("response.output_text.delta", item_id="msg_0", output_index=position,
                         content_index=0, delta=piece, logprobs=[]) for piece in script.text]
        whole = "".join(script.text)
        part = {"type": "output_text", "text": whole, "annotations": [], "logprobs": []}
        frames.append(event("response.output_text.done", item_id="msg_0", output_index=position,
                            content_index=0, text=whole, logprobs=[]))
        frames.append(event("response.content_part.done", item_id="msg_0",
                            output_index=position, content_index=0, part=part))
        done = {**item, "content": [part], "status": "completed"}
        frames.append(event("response.output_item.done", output_index=position, item=done))
        output.append(done)
        position += 1
    for number, call in enumerate(script.calls):
        item_id = f"fc_{number}"
        item = {"id": item_id, "type": "function_call", "call_id": call.id, "name": call.name,
                "arguments": "", "status": "in_progress"}
        frames.append(event("response.output_item.added", output_index=position, item=item))
        frames += [event("response.function_call_arguments.delta", item_id=item_id,
                         output_index=position, delta=piece) for piece in call.fragments]
        frames.append(event("response.function_call_arguments.done", item_id=item_id,
                            output_index=position, arguments=call.arguments))
        done = {**item, "arguments": call.arguments, "status": "completed"}
        frames.append(event("response.output_item.done", output_index=position, item=done))
        output.append(done)
        position += 1
    usage = {"input_tokens": script.prompt_tokens,
             "input_tokens_details": {"cached_tokens": script.cached_tokens},
             "output_tokens": script.completion_tokens,
             "output_tokens_details": {"reasoning_tokens": 0},
             "total_tokens": script.total_tokens}
    if terminal:
        if script.finish == NATURAL:
            final = {**base, "status": "completed", "output": output, "usage": usage}
            frames.append(event("response.completed", response=final))
        else:
            reason = "max_output_tokens" if script.finish == "length" else "content_filter"
            final = {**base, "status": "incomplete", "output": output, "usage": usage,
                     "incomplete_details": {"reason": reason}}
            frames.append(event("response.incomplete", response=final))
    for frame in frames:
        if isinstance(frame, dict):
            frame["sequence_number"] = next(seq)
    return frames


ANTHROPIC_STOP = {"length": "max_tokens", "content_filter": "refusal"}


def anthropic_frames(script: Script, *, terminal: bool = True,
                     noise: tuple[Any, ...] = ()) -> list[Any]:
    """The script as a Messages stream; ``noise`` frames go after ``message_start``."""
    usage = {"input_tokens": script.prompt_tokens - script.cached_tokens,
             "cache_creation_input_tokens": 0, "cache_read_input_tokens": script.cached_tokens,
             "output_tokens": 1}
    frames: list[Any] = [{"type": "message_start", "message": {
        "id": "msg_s", "type": "message", "role": "assistant", "model": "m", "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": usage}}, *noise]
    index = 0

    def block(start: dict[str, Any], deltas: list[dict[str, Any]]) -> None:
        nonlocal index
        frames.append({"type": "content_block_start", "index": index, "content_block": start})
        frames.extend({"type": "content_block_delta", "index": index, "delta": d}
                      for d in deltas)
        frames.append({"type": "content_block_stop", "index": index})
        index += 1

    if script.reasoning:
        block({"type": "thinking", "thinking": "", "signature": ""},
              [{"type": "thinking_delta", "thinking": piece} for piece in script.reasoning]
              + [{"type": "signature_delta", "signature": script.signature}])
    if script.text or not script.calls:
        block({"type": "text", "text": ""},
              [{"type": "text_delta", "text": piece} for piece in script.text])
    for call in script.calls:
        block({"type": "tool_use", "id": call.id, "name": call.name, "input": {}},
              [{"type": "input_json_delta", "partial_json": piece} for piece in call.fragments])
    stop = ANTHROPIC_STOP.get(script.finish) or ("tool_use" if script.calls else "end_turn")
    frames.append({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                   "usage": {"output_tokens": script.completion_tokens}})
    if terminal:
        frames.append({"type": "message_stop"})
    return frames


@attrs.frozen
class DialectStream:
    api: str
    script: Script
    body: bytes
    terminal: bool
    comments: int
    ignored: int  # unknown event types in the body


# Frames a server may add that must change nothing but the counters.
_UNKNOWN_RESPONSES = {"type": "response.web_search_call.searching", "output_index": 9,
                      "item_id": "ws_0"}
_UNKNOWN_ANTHROPIC = {"type": "content_block_future", "index": 0}


@st.composite
def dialect_streams(draw: st.DrawFn, api: str,
                    rendering: st.SearchStrategy[Rendering] = renderings) -> DialectStream:
    """A generated Responses or Anthropic stream with its script and noise."""
    script = draw(scripts())
    terminal = draw(st.booleans())
    pings = draw(st.integers(0, 2))
    unknown = draw(st.integers(0, 2))
    comments = draw(st.lists(comment_text, max_size=2))
    if api == "responses":
        noise = (_UNKNOWN_RESPONSES,) * unknown
        frames = responses_frames(script, terminal=terminal, noise=noise)
    else:
        noise = ({"type": "ping"},) * pings + (_UNKNOWN_ANTHROPIC,) * unknown
        frames = anthropic_frames(script, terminal=terminal, noise=noise)
    frames = frames[:1] + list(comments) + frames[1:]
    body = serialize(frames, draw(rendering))
    return DialectStream(api, script, body, terminal, len(comments), unknown)
