"""Checking a scorer's options, and what every scorer shares (name, key, threshold).

Every kind declares its options as ``Option``s; ``check_options`` turns the
config's table into checked values with the defaults filled in, or raises a
``ValueError`` whose one line names the option and the value at fault:
``option 'tolerance': must be a number >= 0, not 'abc'``.  Unknown names are
refused with the list of the known ones (a typo must not silently become the
default).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from ..core import patterns
from ._values import Answer, Score

__all__ = ["Option", "ScorerBase", "check_options", "scorer_key", "show"]


def show(value: Any) -> str:
    """A config value in an error message: its repr, cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:60] + "…"


@attrs.frozen
class Option:
    """One option: its name, its default, and ``check`` (value -> checked value, or
    ``ValueError`` with what it must be: ``"must be true or false"``)."""

    name: str
    default: Any
    check: Callable[[Any], Any]


def check_options(options: Mapping[str, Any], known: Sequence[Option]) -> dict[str, Any]:
    """``options`` checked against ``known``, every default filled in."""
    by_name = {option.name: option for option in known}
    if not isinstance(options, Mapping):
        raise ValueError(f"options must be a table, not {show(options)}")
    for name in options:
        if name not in by_name:
            names = ", ".join(sorted(by_name))
            raise ValueError(f"unknown option {show(name)} (known: {names})")
    checked: dict[str, Any] = {}
    for option in known:
        if option.name not in options:
            checked[option.name] = option.default
            continue
        value = options[option.name]
        try:
            checked[option.name] = option.check(value)
        except ValueError as exc:
            raise ValueError(f"option {option.name!r}: {exc}, not {show(value)}") from None
    return checked


# ---------------------------------------------------------------- checks

def boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("must be true or false")
    return value


def number(low: float | None = None, high: float | None = None, *, integer: bool = False,
           allow_none: bool = False) -> Callable[[Any], Any]:
    """A check for a number (an integer with ``integer``) in [low, high]."""
    what = "an integer" if integer else "a number"
    if low is not None and high is not None:
        what += f" in [{_num(low)}, {_num(high)}]"
    elif low is not None:
        what += f" >= {_num(low)}"

    def check(value: Any) -> Any:
        if value is None and allow_none:
            return None
        kinds = (int,) if integer else (int, float)
        if (isinstance(value, bool) or not isinstance(value, kinds)
                or (isinstance(value, float) and not math.isfinite(value))
                or (low is not None and value < low) or (high is not None and value > high)):
            raise ValueError(f"must be {what}")
        return value if integer else float(value)  # 1 and 1.0: one option, one key
    return check


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def one_of(*choices: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if value not in choices:
            raise ValueError(f"must be one of {', '.join(repr(c) for c in choices)}")
        return str(value)
    return check


def string(*, allow_none: bool = False, non_empty: bool = True) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if value is None and allow_none:
            return None
        if not isinstance(value, str) or (non_empty and not value):
            raise ValueError("must be a non-empty string" if non_empty else "must be a string")
        return value
    return check


def strings(*, non_empty: bool = True) -> Callable[[Any], tuple[str, ...]]:
    """A list of strings (one string is a list of one)."""
    def check(value: Any) -> tuple[str, ...]:
        if isinstance(value, str):
            value = [value]
        if (not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value)
                or (non_empty and not value)):
            raise ValueError("must be a non-empty list of strings" if non_empty
                             else "must be a list of strings")
        return tuple(value)
    return check


def table(value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError("must be a table")
    return dict(value)


#: The option every kind has: the value at which a score passes.
THRESHOLD = Option("threshold", 1.0, number(0, 1))

#: Seconds a scorer's user patterns may spend on one answer, by default.
DEFAULT_TIMEOUT = patterns.DEFAULT_TIMEOUT


def _seconds(value: Any) -> float:
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not math.isfinite(value) or not 0 < value <= 3600):
        raise ValueError("must be a number of seconds in (0, 3600]")
    return float(value)


#: The option of every kind that matches a user's pattern on an answer.  At its
#: default it is left out of the scorer's key: the scorers written before it keep theirs.
REGEX_TIMEOUT = Option("regex_timeout", DEFAULT_TIMEOUT, _seconds)


def scorer_key(kind: str, options: Mapping[str, Any]) -> str:
    """A stable hash of ``kind`` and its checked options (defaults filled in): the same
    scorer written with its options in another order, or its defaults spelt out, has
    the same key; any changed option gives another."""
    blob = json.dumps([kind, options], sort_keys=True, separators=(",", ":"),
                      ensure_ascii=True, default=_canonical)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _canonical(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, frozenset | set):
        return sorted(value, key=repr)
    return repr(value)  # a TOML date in a schema, say: stable, and never a crash


class ScorerBase:
    """What every scorer shares: ``name``, ``kind``, ``key``, ``threshold``,
    ``options`` (checked, defaults filled in), and ``score``'s common rules.

    ``score(answer)``: an answer whose outcome is not ``completed`` is ``unscored``
    (``"<outcome>: <reason>"``); a kind that needs ``expected`` gives an ``error``
    when the prompt has none; otherwise the kind's ``grade`` decides.
    """

    kind: str = ""
    needs_expected: bool = False
    name: str
    key: str
    threshold: float
    options: Mapping[str, Any]

    def __init__(self, name: str, options: Mapping[str, Any], key_extra: Any = None) -> None:
        self.name = name
        self.options = options
        self.threshold = float(options["threshold"])
        identity: dict[str, Any] = dict(options)
        if identity.get(REGEX_TIMEOUT.name) == DEFAULT_TIMEOUT:
            del identity[REGEX_TIMEOUT.name]
        if key_extra is not None:
            identity["__extra__"] = key_extra
        self.key = scorer_key(self.kind, identity)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} kind={self.kind} key={self.key}>"

    def score(self, answer: Answer) -> Score:
        pre = prescore(answer, self.needs_expected)
        if pre is not None:
            return pre
        return self.grade(answer)

    def grade(self, answer: Answer) -> Score:  # pragma: no cover - every kind overrides it
        raise NotImplementedError

    def scored(self, value: float, explanation: str) -> Score:
        return Score.of(value, self.threshold, explanation)

    def passfail(self, ok: bool, explanation: str) -> Score:
        return Score.of(1.0 if ok else 0.0, self.threshold, explanation)


def prescore(answer: Answer, needs_expected: bool = False) -> Score | None:
    """The score an answer gets before any grading, if it gets one: ``unscored`` when its
    stream did not complete, ``error`` when ``expected`` is needed and missing."""
    if answer.outcome != "completed":
        reason = answer.reason or "the stream did not complete"
        return Score.unscored(f"{answer.outcome or 'no outcome'}: {reason}")
    if needs_expected and not answer.has_expected:
        return Score.error(f"no expected value for prompt {answer.id}")
    return None
