"""The text-matching kinds: ``exact``, ``includes``, ``regex``, ``numeric``, ``choice``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ._options import (
    REGEX_TIMEOUT,
    THRESHOLD,
    Option,
    ScorerBase,
    boolean,
    check_options,
    number,
    one_of,
    string,
)
from ._pattern import FLAGS, Deadline, PatternTimeout, compile_pattern, timed_out
from ._text import Normalise, find_letter, numbers, parse_number
from ._values import Answer, Score, quote, show_expected

__all__ = ["Choice", "Exact", "Includes", "Numeric", "Regex"]

NORMALISE = (
    Option("ignore_case", False, boolean),
    Option("collapse_whitespace", False, boolean),
    Option("ignore_punctuation", False, boolean),
    Option("strip", True, boolean),
)


def _normaliser(options: Mapping[str, Any]) -> Normalise:
    return Normalise(options["ignore_case"], options["collapse_whitespace"],
                     options["ignore_punctuation"], options["strip"])


def _as_text(value: Any) -> str | None:
    """An expected string, or a number as its JSON text (``3`` -> ``"3"``); else None."""
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return json.dumps(value)
    return None


def _expected_texts(expected: Any) -> list[str] | str:
    """The acceptable strings of ``expected``, or what is wrong with it (a ``str``)."""
    items = expected if isinstance(expected, list) else [expected]
    texts = [_as_text(item) for item in items]
    if not items or any(t is None for t in texts):
        bad = expected if not items or not isinstance(expected, list) else next(
            item for item, text in zip(items, texts, strict=True) if text is None)
        where = "" if bad is expected else "a list holding "
        return (f"expected must be a string, a number or a non-empty list of them, "
                f"not {where}{_kind(bad)}")
    return [t for t in texts if t is not None]


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list" if value else "an empty list"
    return type(value).__name__


def _choices(texts: list[str]) -> str:
    shown = ", ".join(quote(t, 30) for t in texts[:3])
    return shown + (f" (+{len(texts) - 3} more)" if len(texts) > 3 else "")


class Exact(ScorerBase):
    """``exact``: the answer equals ``expected`` after normalisation.

    ``expected``: a string, a number (compared as its JSON text: ``3`` matches
    ``"3"``, not ``"3.0"``), or a list of acceptable strings (any one matches).
    Options: ``ignore_case``, ``collapse_whitespace``, ``ignore_punctuation``
    (default false: exact means exact) and ``strip`` (white space around, default
    true), applied to both sides; ``threshold``.
    """

    kind = "exact"
    needs_expected = True
    OPTIONS = (*NORMALISE, THRESHOLD)

    def __init__(self, name: str, options: Mapping[str, Any]) -> None:
        super().__init__(name, check_options(options, self.OPTIONS))
        self.normalise = _normaliser(self.options)

    def grade(self, answer: Answer) -> Score:
        texts = _expected_texts(answer.expected)
        if isinstance(texts, str):
            return Score.error(texts)
        got = self.normalise(answer.text)
        for text in texts:
            if self.normalise(text) == got:
                return self.passfail(True, f"equals {quote(text)}")
        return self.passfail(False, f"{quote(answer.text)} is not {_choices(texts)}")


class Includes(ScorerBase):
    """``includes``: the answer contains ``expected`` after normalisation.

    ``expected``: a string, a number, or a list of them; ``mode = "any"`` (default:
    one of them is enough) or ``"all"``.  An expected string that normalises to
    nothing is an error (every answer contains it).  The normalisation options of
    ``exact``; ``threshold``.
    """

    kind = "includes"
    needs_expected = True
    OPTIONS = (Option("mode", "any", one_of("any", "all")), *NORMALISE, THRESHOLD)

    def __init__(self, name: str, options: Mapping[str, Any]) -> None:
        super().__init__(name, check_options(options, self.OPTIONS))
        self.normalise = _normaliser(self.options)

    def grade(self, answer: Answer) -> Score:
        texts = _expected_texts(answer.expected)
        if isinstance(texts, str):
            return Score.error(texts)
        needles = [self.normalise(t) for t in texts]
        if any(not n for n in needles):
            return Score.error("expected text is empty once normalised: every answer has it")
        got = self.normalise(answer.text)
        present = [t for t, n in zip(texts, needles, strict=True) if n in got]
        missing = [t for t, n in zip(texts, needles, strict=True) if n not in got]
        if self.options["mode"] == "all":
            if missing:
                return self.passfail(False, f"lacks {_choices(missing)} "
                                    f"({len(present)} of {len(texts)} present)")
            return self.passfail(True, f"includes all {len(texts)} of {_choices(texts)}")
        if present:
            return self.passfail(True, f"includes {quote(present[0])}")
        return self.passfail(False, f"includes none of {_choices(texts)}")


def _flags(value: Any) -> str:
    if not isinstance(value, str) or any(c not in FLAGS for c in value):
        raise ValueError("must be a string of the flags i, m, s")
    return "".join(sorted(set(value)))


def _group(value: Any) -> int | str | None:
    if value is None or (isinstance(value, str) and value):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise ValueError("must be a group number >= 0 or a group name")


class Regex(ScorerBase):
    """``regex``: ``pattern`` is found in the answer (a search, as ``re.search``).

    ``pattern`` (required, compiled when the scorer is made: a bad pattern is a
    config error; the syntax of ``re``, matched by the ``regex`` package within
    ``regex_timeout`` seconds of CPU time per answer, default 1: past it the answer's
    score is an ``error``, ``regex timed out after 1 s (scorer ..., pattern ...)``);
    ``flags``: any of ``i`` (ignore case), ``m`` (``^``/``$`` at every line), ``s``
    (``.`` matches newlines); ``match = "first"`` (default) or
    ``"last"``: which match counts.  With ``expected``, the match's ``group``
    (a number or a name; default 0, the whole match) must equal it after the
    normalisation of ``exact`` (same options; a list: any one); without
    ``expected``, a match is a pass.
    """

    kind = "regex"
    OPTIONS = (Option("pattern", None, string()), Option("flags", "", _flags),
               Option("group", None, _group), Option("match", "first", one_of("first", "last")),
               *NORMALISE, THRESHOLD, REGEX_TIMEOUT)

    def __init__(self, name: str, options: Mapping[str, Any]) -> None:
        super().__init__(name, check_options(options, self.OPTIONS))
        pattern = self.options["pattern"]
        if pattern is None:
            raise ValueError("option 'pattern': required (a regular expression)")
        flags = 0
        for flag in self.options["flags"]:
            flags |= FLAGS[flag]
        try:
            self.pattern = compile_pattern(pattern, flags)
        except ValueError as exc:
            raise ValueError(f"option 'pattern': {exc}, not {pattern!r}") from None
        group = self.options["group"]
        if isinstance(group, int) and group > self.pattern.groups:
            raise ValueError(f"option 'group': the pattern has {self.pattern.groups} "
                             f"group(s), not {group}")
        if isinstance(group, str) and group not in self.pattern.groupindex:
            names = ", ".join(self.pattern.groupindex) or "none"
            raise ValueError(f"option 'group': the pattern has no group {group!r} "
                             f"(named groups: {names})")
        self.normalise = _normaliser(self.options)

    def grade(self, answer: Answer) -> Score:
        deadline = Deadline(self.options["regex_timeout"])
        try:
            if self.options["match"] == "first":
                match = deadline.search(self.pattern, answer.text)
            else:
                match = next(reversed(deadline.finditer(self.pattern, answer.text)), None)
        except PatternTimeout as exc:
            return timed_out(self.name, exc)
        if match is None:
            return self.passfail(False, f"no match of {quote(self.pattern.pattern, 40)}")
        group = self.options["group"] if self.options["group"] is not None else 0
        found = match.group(group)
        if not answer.has_expected:
            return self.passfail(True, f"matched {quote(match.group())}")
        texts = _expected_texts(answer.expected)
        if isinstance(texts, str):
            return Score.error(texts)
        if found is None:
            return self.passfail(False, f"group {group!r} did not take part in the match")
        for text in texts:
            if self.normalise(text) == self.normalise(found):
                return self.passfail(True, f"group {group!r} is {quote(found)}")
        return self.passfail(False, f"group {group!r} is {quote(found)}, not {_choices(texts)}")


class Numeric(ScorerBase):
    """``numeric``: the answer's number is ``expected`` within a tolerance.

    ``extract = "last"`` (default: models reason first and conclude last),
    ``"first"`` or ``"only"`` (exactly one number in the answer, else a fail).
    Numbers are read as ``_text.numbers`` says: ``1,234.5``, ``-3``, ``1e-3``,
    ``$12``, ``12%``.  ``percent = "number"`` (default: ``12%`` reads as 12) or
    ``"fraction"`` (0.12).  ``expected``: a number, a string that is one number,
    or a list of them (any one).  Passes when ``|answer - expected| <=
    max(tolerance, relative * |expected|)``: ``tolerance`` (absolute, default
    1e-9) and ``relative`` (default 0).  No number in the answer is a fail with
    its explanation, not an error.
    """

    kind = "numeric"
    needs_expected = True
    OPTIONS = (Option("extract", "last", one_of("last", "first", "only")),
               Option("tolerance", 1e-9, number(0)), Option("relative", 0.0, number(0)),
               Option("percent", "number", one_of("number", "fraction")), THRESHOLD)

    def __init__(self, name: str, options: Mapping[str, Any]) -> None:
        super().__init__(name, check_options(options, self.OPTIONS))

    def grade(self, answer: Answer) -> Score:
        raw = answer.expected if isinstance(answer.expected, list) else [answer.expected]
        wanted = [parse_number(item) for item in raw]
        if not raw or any(w is None for w in wanted):
            return Score.error(f"expected must be a number or a numeric string, not "
                               f"{show_expected(answer.expected)}")
        found = list(numbers(answer.text))
        if not found:
            return self.passfail(False, f"no number in {quote(answer.text)}")
        extract = self.options["extract"]
        if extract == "only" and len(found) > 1:
            return self.passfail(False, f"{len(found)} numbers in the answer, expected only one")
        chosen = found[0] if extract == "first" else found[-1]
        value = chosen.value / 100 if chosen.percent and self.options[
            "percent"] == "fraction" else chosen.value
        for target in wanted:
            assert target is not None
            allowed = max(self.options["tolerance"], self.options["relative"] * abs(target))
            if value == target:
                return self.passfail(True, f"{chosen.written} = {_g(target)}")
            if abs(value - target) <= allowed:
                return self.passfail(True, f"{chosen.written} is within {_g(allowed)} of "
                                     f"{_g(target)}")
        targets = " or ".join(_g(t) for t in wanted if t is not None)
        return self.passfail(False, f"{extract} number {chosen.written} is not {targets}")


def _g(value: float) -> str:
    return f"{value:.15g}"


def _letters(value: Any) -> str:
    if (not isinstance(value, str) or len(value) < 2 or len(set(value.upper())) != len(value)
            or not all(c.isascii() and c.isalnum() for c in value)):
        raise ValueError("must be two or more distinct letters or digits, like 'ABCD'")
    return value.upper()


class Choice(ScorerBase):
    """``choice``: the answer's letter is ``expected`` (multiple choice).

    ``letters`` (default ``"ABCD"``): the possible answers.  How the letter is found
    (``_text.find_letter``): the last explicit statement (``Answer: B``, ``The
    answer is (c).``), else a lone letter line, else one letter set apart
    (``**B**``), else one capital letter alone; several different letters where it
    decides is ambiguous, a fail with its explanation.  Case-insensitive on the
    answer.  ``expected``: one of the letters (``"b"``, ``"(B)"`` are ``B``).
    """

    kind = "choice"
    needs_expected = True
    OPTIONS = (Option("letters", "ABCD", _letters), THRESHOLD)

    def __init__(self, name: str, options: Mapping[str, Any]) -> None:
        super().__init__(name, check_options(options, self.OPTIONS))
        self.letters: str = self.options["letters"]

    def grade(self, answer: Answer) -> Score:
        expected = answer.expected
        letter = (expected.strip().strip("()[].*` ").upper()
                  if isinstance(expected, str) else None)
        if not letter or letter not in self.letters or len(letter) != 1:
            return Score.error(f"expected must be one of the letters {self.letters}, not "
                               f"{show_expected(expected, 20)}")
        found = find_letter(answer.text, self.letters)
        if found.letter is None:
            return self.passfail(False, f"{found.problem} in {quote(answer.text, 40)}")
        if found.letter == letter:
            return self.passfail(True, f"answered {letter} ({found.how})")
        return self.passfail(False, f"answered {found.letter}, not {letter} ({found.how})")
