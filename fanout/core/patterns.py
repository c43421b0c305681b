"""Regular expressions a user wrote, matched on model text with a time limit.

A pattern the user writes (a ``regex`` scorer's ``pattern``, a judge's ``pattern``,
the ``pattern`` and ``patternProperties`` of a ``json`` scorer's schema or of a tool's
``parameters``, against which streamed tool-call arguments are validated) runs on text
a model wrote.  With nested quantifiers (``^(a|aa)+$``) a backtracking engine takes
exponential time on an unlucky answer (40 ``a`` and a ``!``): without a limit, one
answer would stop a whole run.  So every such match runs through the ``regex``
package with its ``timeout=``, counted per answer over all of a scorer's matches
(``Deadline``): past it, ``PatternTimeout``, which a scorer turns into an ``error``
score ``regex timed out after 1 s (scorer 'name', pattern '...')`` and a tool call
into a schema error naming the pattern; the run goes on.  Sans-I/O: ``regex`` and
``jsonschema`` only.

``regex`` is used in its ``VERSION0`` mode, compatible with ``re``: the patterns
users write for ``re`` mean the same (flags ``i``, ``m``, ``s`` are ``re``'s; case
folding is ``re``'s simple one).  It accepts a little more than ``re`` does
(variable-width look-behind, ``\\p{...}`` classes).
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Iterator, Mapping
from typing import Any, Final

import regex

__all__ = ["DEFAULT_TIMEOUT", "FLAGS", "Deadline", "LimitedValidator", "PatternError",
           "PatternTimeout", "check_schema_patterns", "compile_pattern", "quote"]

#: Seconds of CPU time one answer's matches may take, unless configured otherwise.
DEFAULT_TIMEOUT: Final = 1.0

FLAGS: Final = {"i": regex.IGNORECASE, "m": regex.MULTILINE, "s": regex.DOTALL}


class PatternTimeout(Exception):
    """A user's pattern ran past its scorer's ``regex_timeout`` on one answer."""

    def __init__(self, seconds: float, pattern: str) -> None:
        super().__init__(f"regex timed out after {seconds:g} s")
        self.seconds = seconds
        self.pattern = pattern


def quote(text: str, limit: int) -> str:
    """``text`` in a one-line message: ``repr``-escaped, cut to ``limit`` characters."""
    return repr(text[:limit]) + "…" if len(text) > limit else repr(text)


def compile_pattern(text: str, flags: int = 0) -> regex.Pattern[str]:
    """``text`` compiled (``re``-compatible), or ``ValueError('not a regular expression
    (why)')``."""
    try:
        return regex.compile(text, flags | regex.VERSION0)
    except (regex.error, ValueError, OverflowError, RecursionError) as exc:
        raise ValueError(f"not a regular expression ({exc})") from None


class Deadline:
    """The time one answer's matches may still take: ``seconds`` of CPU time from its
    making (``regex`` counts its ``timeout`` in the process's CPU time, so a loaded
    machine stretches it in wall time; it still ends).

    Every match goes through it (``search``, ``finditer``), so a scorer that matches
    many times on one answer stops at the same limit as one that matches once.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._end = time.process_time() + seconds

    def _left(self, pattern: regex.Pattern[str]) -> float:
        left = self._end - time.process_time()
        if left <= 0:
            raise PatternTimeout(self.seconds, pattern.pattern)
        return left

    def search(self, pattern: regex.Pattern[str], text: str) -> regex.Match[str] | None:
        """``pattern.search(text)`` within the deadline (else ``PatternTimeout``)."""
        try:
            return pattern.search(text, timeout=self._left(pattern))
        except TimeoutError:
            raise PatternTimeout(self.seconds, pattern.pattern) from None

    def finditer(self, pattern: regex.Pattern[str], text: str) -> list[regex.Match[str]]:
        """Every match of ``pattern`` in ``text``, within the deadline."""
        try:
            return list(pattern.finditer(text, timeout=self._left(pattern)))
        except TimeoutError:
            raise PatternTimeout(self.seconds, pattern.pattern) from None


# ---------------------------------------------------------------- JSON Schema patterns

#: The deadline of the validation running now (its keyword functions read it).
_CURRENT: contextvars.ContextVar[Deadline] = contextvars.ContextVar("fanout_schema_deadline")
_COMPILED: dict[str, regex.Pattern[str]] = {}


def _search(pattern: str, text: str) -> bool:
    compiled = _COMPILED.get(pattern)
    if compiled is None:
        try:
            compiled = compile_pattern(pattern)
        except ValueError as exc:
            raise PatternError(pattern, str(exc)) from None
        if len(_COMPILED) > 256:
            _COMPILED.clear()
        _COMPILED[pattern] = compiled
    return _CURRENT.get().search(compiled, text) is not None


class PatternError(Exception):
    """A schema's pattern that ``regex`` does not compile (``re`` did, at check time)."""

    def __init__(self, pattern: str, why: str) -> None:
        super().__init__(f"schema pattern {quote(pattern, 40)}: {why}")
        self.pattern = pattern


def _keyword_pattern(validator: Any, pattern: str, instance: Any, schema: Any
                     ) -> Iterator[Any]:
    import jsonschema

    if validator.is_type(instance, "string") and not _search(pattern, instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


def _keyword_pattern_properties(validator: Any, patterns: Mapping[str, Any], instance: Any,
                                schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if _search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _keyword_additional_properties(validator: Any, additional: Any, instance: Any,
                                   schema: Mapping[str, Any]) -> Iterator[Any]:
    import jsonschema

    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extras = [key for key in instance if key not in properties
              and not any(_search(p, key) for p in patterns)]
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif not additional and extras:
        if patterns:
            verb = "does" if len(extras) == 1 else "do"
            joined = ", ".join(repr(each) for each in sorted(extras))
            shown = ", ".join(repr(each) for each in sorted(patterns))
            yield jsonschema.ValidationError(
                f"{joined} {verb} not match any of the regexes: {shown}")
        else:
            listed = ", ".join(repr(each) for each in sorted(extras, key=str))
            verb = "was" if len(extras) == 1 else "were"
            yield jsonschema.ValidationError(
                f"Additional properties are not allowed ({listed} {verb} unexpected)")


_KEYWORDS: Final = {"pattern": _keyword_pattern,
                    "patternProperties": _keyword_pattern_properties,
                    "additionalProperties": _keyword_additional_properties}


def _mentions(value: Any, key: str) -> bool:
    if isinstance(value, Mapping):
        return key in value or any(_mentions(v, key) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_mentions(v, key) for v in value)
    return False


def check_schema_patterns(schema: Mapping[str, Any]) -> None:
    """``ValueError`` for a schema whose patterns could run without a time limit:
    ``unevaluatedProperties`` beside ``patternProperties`` (jsonschema matches those
    itself, with ``re``)."""
    if _mentions(schema, "unevaluatedProperties") and _mentions(schema, "patternProperties"):
        raise ValueError("'unevaluatedProperties' with 'patternProperties' is not supported "
                         "(those patterns would run without the regex_timeout limit)")


class LimitedValidator:
    """A JSON Schema validator whose ``pattern``, ``patternProperties`` and
    ``additionalProperties`` match through ``regex`` within a ``Deadline``."""

    def __init__(self, schema: Mapping[str, Any]) -> None:
        import jsonschema

        base = jsonschema.validators.validator_for(schema)
        cls = jsonschema.validators.extend(base, _KEYWORDS)  # type: ignore[no-untyped-call]
        self._validator = cls(dict(schema))

    def errors(self, value: Any, deadline: Deadline) -> list[Any]:
        """Every validation error of ``value`` (``PatternTimeout`` past the deadline,
        ``PatternError`` for a pattern ``regex`` does not compile)."""
        token = _CURRENT.set(deadline)
        try:
            return list(self._validator.iter_errors(value))
        finally:
            _CURRENT.reset(token)
