"""The prompts file of ``fanout batch``: JSON Lines, checked whole before anything is sent.

One prompt a line::

    {"id": "q1", "prompt": "What is 2 + 2?"}
    {"id": "q2", "messages": [{"role": "user", "content": "Hi"}], "system": "Be brief.",
     "params": {"temperature": 0}, "tools": [{"type": "function", "function": {...}}]}

``id`` (a non-empty string or an integer, unique), then ``prompt`` (a
string) or ``messages`` (a non-empty list of ``{"role", "content"}``
objects), not both.  Optional: ``system`` (a system message put first),
``params`` (request parameters, over the model's), ``tools``.  For
evaluation: ``expected`` (what the answer is graded against: any JSON value,
a string, a list of acceptable strings, a number, an object; ``null`` is a
value too), ``category`` (a non-empty string) and ``tags`` (a list of
non-empty strings); they are never sent, and do not change what was asked
(a results file resumes across them).  Other keys are allowed and ignored
(datasets carry metadata).  Blank lines are skipped.  Every bad line is
reported, with its number.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

__all__ = ["Prompt", "PromptFileError", "load_prompts"]

_RESERVED_PARAMS = ("model", "messages", "stream", "tools")
#: At most this many bad lines are listed; the rest are counted.
MAX_LISTED = 50


@attrs.frozen
class Prompt:
    """One checked line of the prompts file."""

    id: str | int
    messages: tuple[Mapping[str, Any], ...]
    params: Mapping[str, Any] = attrs.field(factory=dict)
    tools: tuple[Mapping[str, Any], ...] | None = None
    line: int = 0
    #: Whether the line has ``expected`` (``expected`` may be ``None``: JSON null).
    has_expected: bool = False
    expected: Any = None
    category: str | None = None
    tags: tuple[str, ...] = ()

    def eval_fields(self) -> dict[str, Any]:
        """What a results record carries of it for scoring: ``expected`` (only when the
        line has one), ``category`` and ``tags`` (only when set)."""
        fields: dict[str, Any] = {}
        if self.has_expected:
            fields["expected"] = self.expected
        if self.category is not None:
            fields["category"] = self.category
        if self.tags:
            fields["tags"] = list(self.tags)
        return fields


class PromptFileError(Exception):
    """The prompts file is unusable; ``problems`` holds one line per fault."""

    def __init__(self, path: str, problems: Sequence[str], total: int | None = None) -> None:
        self.path = path
        self.problems = list(problems)
        #: How many lines are bad (0: the file itself is, and ``problems`` says how).
        self.total = total or 0
        super().__init__(f"{path}: {self.total} bad line{'s' if self.total != 1 else ''}"
                         if self.total else self.problems[0])


def load_prompts(path: str | Path) -> list[Prompt]:
    """Every prompt of ``path``, or ``PromptFileError`` listing every bad line."""
    name = str(path)
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise PromptFileError(name, [f"{name}: no such file"]) from None
    except IsADirectoryError:
        raise PromptFileError(name, [f"{name}: is a directory"]) from None
    except OSError as exc:
        raise PromptFileError(name, [f"{name}: cannot read: {exc.strerror or exc}"]) from None
    problems: list[str] = []
    prompts: list[Prompt] = []
    seen: dict[str, int] = {}
    count = 0
    for number, line in enumerate(raw.split(b"\n"), 1):
        if not line.strip():
            continue
        count += 1
        try:
            prompt = _prompt(line, number)
        except ValueError as exc:
            problems.append(f"{name}:{number}: {exc}")
            continue
        canonical = str(prompt.id)
        if canonical in seen:
            problems.append(f"{name}:{number}: duplicate id {prompt.id!r} "
                            f"(first on line {seen[canonical]})")
            continue
        seen[canonical] = number
        prompts.append(prompt)
    if problems:
        listed = problems[:MAX_LISTED]
        if len(problems) > MAX_LISTED:
            listed.append(f"{name}: ... and {len(problems) - MAX_LISTED} more bad lines")
        raise PromptFileError(name, listed, len(problems))
    if not count:
        raise PromptFileError(name, [f"{name}: no prompts (the file is empty)"])
    return prompts


def _prompt(line: bytes, number: int) -> Prompt:
    try:
        data = json.loads(line)
    except UnicodeDecodeError:
        raise ValueError("not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"bad JSON: {exc.msg} (column {exc.colno})") from None
    except RecursionError:
        raise ValueError("bad JSON: nested too deeply") from None
    if not isinstance(data, dict):
        raise ValueError(f"must be a JSON object, not {_kind(data)}")
    if "id" not in data:
        raise ValueError("missing id")
    prompt_id = data["id"]
    if isinstance(prompt_id, bool) or not isinstance(prompt_id, str | int) or (
            isinstance(prompt_id, str) and not prompt_id.strip()):
        raise ValueError(f"id must be a non-empty string or an integer, not {_kind(prompt_id)}")
    has_prompt, has_messages = "prompt" in data, "messages" in data
    if has_prompt == has_messages:
        raise ValueError("needs exactly one of prompt or messages" if not has_prompt
                         else "has both prompt and messages: give one")
    messages: list[Mapping[str, Any]]
    if has_prompt:
        text = data["prompt"]
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"prompt must be a non-empty string, not {_kind(text)}")
        messages = [{"role": "user", "content": text}]
    else:
        messages = data["messages"]
        if not isinstance(messages, list) or not messages:
            raise ValueError(f"messages must be a non-empty list, not {_kind(messages)}")
        for index, message in enumerate(messages):
            if not isinstance(message, dict):
                raise ValueError(f"messages[{index}] must be an object, not {_kind(message)}")
            if not isinstance(message.get("role"), str):
                raise ValueError(f"messages[{index}].role must be a string, "
                                 f"not {_kind(message.get('role'))}")
            if "content" not in message and "tool_calls" not in message:
                raise ValueError(f"messages[{index}] has no content")
    system = data.get("system")
    if system is not None:
        if not isinstance(system, str):
            raise ValueError(f"system must be a string, not {_kind(system)}")
        messages = [{"role": "system", "content": system}, *messages]
    params = data.get("params", {})
    if not isinstance(params, dict):
        raise ValueError(f"params must be an object, not {_kind(params)}")
    for reserved in _RESERVED_PARAMS:
        if reserved in params:
            raise ValueError(f"params must not set {reserved!r}")
    tools = data.get("tools")
    if tools is not None and (not isinstance(tools, list)
                              or not all(isinstance(t, dict) for t in tools)):
        raise ValueError(f"tools must be a list of objects, not {_kind(tools)}")
    if "expected" in data:
        try:
            json.dumps(data["expected"], allow_nan=False)
        except ValueError:
            raise ValueError("expected must be JSON (NaN and Infinity are not)") from None
        except RecursionError:
            raise ValueError("expected is nested too deeply") from None
    category = data.get("category")
    if category is not None and (not isinstance(category, str) or not category.strip()):
        raise ValueError(f"category must be a non-empty string, not {_kind(category)}")
    tags = data.get("tags", [])
    if not isinstance(tags, list):
        raise ValueError(f"tags must be a list of strings, not {_kind(tags)}")
    for index, tag in enumerate(tags):
        if not isinstance(tag, str) or not tag.strip():
            raise ValueError(f"tags[{index}] must be a non-empty string, not {_kind(tag)}")
    return Prompt(prompt_id, tuple(messages), params, tuple(tools) if tools else None, number,
                  has_expected="expected" in data, expected=data.get("expected"),
                  category=category, tags=tuple(dict.fromkeys(tags)))


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return repr(value) if len(value) <= 30 else f"a string of {len(value)} characters"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, dict):
        return "an object"
    return "a list" if isinstance(value, list) else type(value).__name__
