"""What a scorer sees (``Answer``) and what it says (``Score``): plain values, no I/O."""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

import attrs

__all__ = ["NO_EXPECTED", "Answer", "Score", "quote", "show_expected", "tool_calls"]


class _Missing(enum.Enum):
    NO_EXPECTED = "NO_EXPECTED"

    def __repr__(self) -> str:
        return "NO_EXPECTED"

    def __bool__(self) -> bool:
        return False


#: ``Answer.expected`` when the prompt has no ``expected`` value (``None`` is a value:
#: a prompt may expect JSON ``null``).
NO_EXPECTED: Final = _Missing.NO_EXPECTED

#: At most this many characters of untrusted text go into an explanation.
QUOTED = 60


def quote(text: str, limit: int = QUOTED) -> str:
    """``text`` for a one-line explanation: ``repr``-escaped (newlines, controls, bidi
    controls and lone surrogates become escapes), cut to ``limit`` characters with ``…``."""
    if len(text) > limit:
        return repr(text[:limit]) + "…"
    return repr(text)


def show_expected(value: Any, limit: int = 40) -> str:
    """An expected value in an explanation: a string ``quote``d, anything else as JSON
    (non-printable characters escaped), cut to ``limit`` characters."""
    if isinstance(value, str):
        return quote(value, limit)
    text = json.dumps(value, ensure_ascii=False, default=str)
    text = "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in text)
    return text if len(text) <= limit else text[:limit] + "…"


def _text_of(content: Any) -> str:
    """A message's content as text: a string, or the ``text`` of its parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence) and not isinstance(content, bytes):
        return " ".join(str(p.get("text", "")) for p in content
                        if isinstance(p, Mapping) and p.get("type", "text") == "text")
    return ""


def tool_calls(choice: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """A record choice's tool calls (the objects of its ``tool_calls`` list, if it has one)."""
    calls = choice.get("tool_calls")
    if not isinstance(calls, list | tuple):
        return []
    return [call for call in calls if isinstance(call, Mapping)]


def _tuple_of_mappings(value: Any) -> tuple[Mapping[str, Any], ...]:
    if not isinstance(value, Sequence) or isinstance(value, str | bytes):
        return ()
    return tuple(item for item in value if isinstance(item, Mapping))


def _prompt_messages(prompt: Mapping[str, Any]) -> tuple[Mapping[str, Any], ...] | None:
    """The messages a prompts-file line asks (``prompt`` or ``messages``, ``system`` first)."""
    if isinstance(prompt.get("messages"), list):
        messages = _tuple_of_mappings(prompt["messages"])
    elif isinstance(prompt.get("prompt"), str):
        messages = ({"role": "user", "content": prompt["prompt"]},)
    else:
        return None
    if isinstance(prompt.get("system"), str):
        messages = ({"role": "system", "content": prompt["system"]}, *messages)
    return messages


@attrs.frozen
class Answer:
    """One unit's answer as a scorer sees it: a results record, and its prompt's
    ``expected``, ``category`` and ``tags``.

    ``text`` is choice 0's text (``""`` when there is none); ``choices`` are the
    record's choices as they are (``text``, ``finish_reason``, ``tool_calls`` …);
    ``expected`` is ``NO_EXPECTED`` when the prompt has none; ``reason`` is the
    record's one-line reason for an outcome other than ``completed``.
    """

    id: str | int
    model: str
    sample: int
    outcome: str
    text: str
    choices: tuple[Mapping[str, Any], ...] = ()
    finish_reason: str | None = None
    messages: tuple[Mapping[str, Any], ...] = ()
    expected: Any = NO_EXPECTED
    category: str | None = None
    tags: tuple[str, ...] = ()
    reason: str | None = None

    @classmethod
    def from_record(cls, record: Mapping[str, Any], prompt: Mapping[str, Any] | None = None
                    ) -> Answer:
        """The answer of a results-file record.

        ``prompt``, a prompts-file line, overrides what the record says of the
        prompt: its ``expected`` (when the line has the key), ``category``, ``tags``
        and messages (``messages``, or ``prompt`` with ``system``): rescoring a
        results file against a corrected prompts file grades against the new
        expected values.  Missing or mistyped fields take their empty value.
        """
        expected = record.get("expected", NO_EXPECTED)
        messages = _tuple_of_mappings(record.get("messages"))
        category = record.get("category")
        tags = record.get("tags")
        if prompt is not None:
            if "expected" in prompt:
                expected = prompt["expected"]
            if "category" in prompt:
                category = prompt["category"]
            if "tags" in prompt:
                tags = prompt["tags"]
            messages = _prompt_messages(prompt) or messages
        choices = _tuple_of_mappings(record.get("choices"))
        text = record.get("text")
        if not isinstance(text, str):
            first = choices[0].get("text") if choices else None
            text = first if isinstance(first, str) else ""
        finish_reason = record.get("finish_reason")
        if finish_reason is None and choices:
            finish_reason = choices[0].get("finish_reason")
        sample = record.get("sample", 0)
        reason = record.get("reason")
        return cls(
            id=record.get("id", ""),
            model=str(record.get("model", "")),
            sample=sample if isinstance(sample, int) and not isinstance(sample, bool) else 0,
            outcome=str(record.get("outcome", "")),
            text=text,
            choices=choices,
            finish_reason=finish_reason if isinstance(finish_reason, str) else None,
            messages=messages,
            expected=expected,
            category=category if isinstance(category, str) else None,
            tags=tuple(t for t in tags if isinstance(t, str)) if isinstance(tags, list | tuple)
            else (),
            reason=reason if isinstance(reason, str) else None,
        )

    @property
    def has_expected(self) -> bool:
        return self.expected is not NO_EXPECTED

    @property
    def question(self) -> str:
        """What was asked, as text: the last user message; with several turns, every
        non-system message as ``[role] content`` lines."""
        turns = [m for m in self.messages if m.get("role") != "system"]
        if len(turns) > 1:
            return "\n".join(f"[{m.get('role')}] {_text_of(m.get('content'))}" for m in turns)
        return _text_of(turns[0].get("content")) if turns else ""


def _check_value(score: Score, attribute: attrs.Attribute[Any], value: float | None) -> None:
    if score.status == "scored":
        if (value is None or isinstance(value, bool) or not isinstance(value, int | float)
                or math.isnan(value) or not 0 <= value <= 1):
            raise ValueError(f"a scored Score's value must be a number in [0, 1], not {value!r}")
    elif value is not None:
        raise ValueError(f"a {score.status} Score has no value, not {value!r}")


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


@attrs.frozen
class Score:
    """A scorer's verdict on one answer.

    ``scored``: ``value`` in [0, 1] (1 is a pass) and ``passed`` (the value reached
    the scorer's threshold); ``unscored``: the stream did not complete, so there was
    nothing to grade (never a failure of the model's answer); ``error``: the scorer
    could not grade it (no expected value, a judge that answered no verdict, a
    ``python`` scorer that raised).  ``explanation`` is one line; the untrusted
    text in it is ``quote``d, and the writers escape it again.
    """

    status: Literal["scored", "unscored", "error"] = attrs.field(
        validator=attrs.validators.in_(("scored", "unscored", "error")))
    value: float | None = attrs.field(validator=_check_value)
    passed: bool | None
    explanation: str = attrs.field(converter=_one_line)

    @classmethod
    def of(cls, value: float, threshold: float, explanation: str) -> Score:
        """A ``scored`` score; ``passed`` is ``value >= threshold``."""
        value = float(value)
        return cls("scored", value, value >= threshold, explanation)

    @classmethod
    def error(cls, explanation: str) -> Score:
        return cls("error", None, None, explanation)

    @classmethod
    def unscored(cls, explanation: str) -> Score:
        return cls("unscored", None, None, explanation)
