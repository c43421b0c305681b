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
