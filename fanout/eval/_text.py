"""Text rules the scorers share: normalisation, and finding numbers, answer letters and
JSON in a model's answer.  Pure functions over strings."""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterator
from typing import Any

import attrs

__all__ = ["Normalise", "find_json", "find_letter", "numbers", "parse_number"]


@attrs.frozen
class Normalise:
    """How two texts are made comparable; applied to both sides.

    Always: Unicode NFC (the same text typed two ways is the same text).  Then,
    in this order, each when asked: ``ignore_case`` (Unicode case folding:
    ``"Straße"`` equals ``"STRASSE"``), ``ignore_punctuation`` (every character of
    a Unicode punctuation category is removed: ``"don't"`` -> ``"dont"``,
    ``"U.S.A."`` -> ``"USA"``), ``collapse_whitespace`` (every run of white space
    becomes one space), ``strip`` (white space around the text goes).  The result
    is a fixed point: normalising it again changes nothing.
    """

    ignore_case: bool = False
    collapse_whitespace: bool = False
    ignore_punctuation: bool = False
    strip: bool = True

    def __call__(self, text: str) -> str:
        for _ in range(4):  # case folding can un-NFC a text; a second round settles it
            before = text
            text = unicodedata.normalize("NFC", text)
            if self.ignore_case:
                text = unicodedata.normalize("NFC", text.casefold())
            if self.ignore_punctuation:
                text = "".join(c for c in text if not unicodedata.category(c).startswith("P"))
            if self.collapse_whitespace:
                text = " ".join(text.split()) if self.strip else re.sub(r"\s+", " ", text)
            if self.strip:
                text = text.strip()
            if text == before:
                break
        return text


# ---------------------------------------------------------------- numbers

_NUMBER = re.compile(
    r"(?<![\w.])"                      # not the tail of a word or of another number
    r"(?P<sign>[-+\u2212]?)"           # -3, +3, and the typographic minus
    r"(?P<currency>[$€£¥]?)"           # $12
    r"(?P<digits>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"  # 1,234.5  12  .5
    r"(?P<exponent>[eE][-+]?\d+)?"     # 1e-3
    r"(?P<percent>\s?%)?"              # 12%
)


@attrs.frozen
class Number:
    """A number found in a text: its value, what it was written as, and whether a
    ``%`` followed it."""

    value: float
    written: str
    percent: bool


def numbers(text: str) -> Iterator[Number]:
    """Every number of ``text``, in order.

    Thousands separators are commas in groups of three (``1,234.5``; ``1,23`` is
    two numbers), a sign counts only where no word or digit precedes it (``2-3``
    is 2 and 3), ``$12`` is 12, ``1e-3`` is 0.001, ``12%`` is 12 with ``percent``.
    A number glued to a word's end (``H2O``) is not one.  Not read: fractions
    (``3/4`` is 3 and 4), spaces as thousands separators (``1 000`` is 1 and 0),
    words (``four``).
    """
    for match in _NUMBER.finditer(text):
        digits = match["digits"].replace(",", "") + (match["exponent"] or "")
        value = float(digits)
        if match["sign"] in ("-", "\u2212"):
            value = -value
        yield Number(value, match.group().strip(), bool(match["percent"]))


def parse_number(value: Any) -> float | None:
    """An expected number: a JSON number, or a string that is exactly one number
    (``"1,234"``, ``"-3"``, ``"12%"`` -> 12).  ``None`` if it is neither."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        number = float(value)
        return number if number == number and abs(number) != float("inf") else None
    if isinstance(value, str):
        found = list(numbers(value.strip()))
        if len(found) == 1 and found[0].written == value.strip():
            return found[0].value
    return None


# ---------------------------------------------------------------- answer letters

_DECOR = "*_`~#>'\"\u201c\u201d\u2018\u2019"


@attrs.frozen
class Letter:
    """The answer letter found in a text (``letter``), or why none was (``problem``)."""

    letter: str | None
    problem: str = ""
    how: str = ""


def find_letter(text: str, letters: str) -> Letter:
    """The answer letter of a multiple-choice answer, case-insensitively.

    In order, the first rule that finds something decides:

    1. an explicit statement: ``answer: B``, ``the answer is (c)``, ``Final
       answer - **D**``, ``correct option is B``, ``choice: C`` (a bare ``option`` or
       ``choice`` needs ``is`` or ``:``: ``Option A is wrong`` states nothing); the
       LAST one in the text wins (a model that changes its mind ends with its answer);
    2. a line that is one letter alone, decorated or not (``B``, ``**C**``,
       ``(d).``); several such lines with different letters are ambiguous;
    3. a letter set apart by brackets or emphasis anywhere (``(c)``, ``**B**``,
       ``[A]``): exactly one distinct letter, else ambiguous;
    4. a capital letter standing alone as a word (``I pick B``): exactly one
       distinct letter, else ambiguous (``A or B``).

    A lower-case letter in running text (``the answer is a bit long``) counts only
    when set apart: bracketed, emphasised, or followed by the end of the line or
    by ``.``, ``)`` or ``:``.  Two letters joined by ``or``/``and``/``/``/``,``
    in the deciding statement are ambiguous, as are two letters on one lone line.
    """
    letter_class = "[" + re.escape(letters) + re.escape(letters.lower()) + "]"
    opening = r"[\s*_`(\[\"'\u201c\u2018]*"
    closing = r"[*_`)\]\"'\u201d\u2019]*"
    verb = r"\s+(?:is|would\s+be|will\s+be|should\s+be)"
    mark = r"[:=\-\u2013\u2014]\s*"
    explicit = re.compile(
        # "answer" needs no verb ("Answer B"); a bare "option"/"choice" does ("Option A is
        # wrong" states nothing), unless qualified ("correct option b")
        r"\b(?:(?:(?:final|correct|best|right)\s+(?:answer|option|choice)|answer)"
        r"(?:" + verb + r")?\s*(?:" + mark + r")?"
        r"|(?:option|choice)(?:" + verb + r"\s*(?:" + mark + r")?|\s*" + mark + r"))"
        + opening + r"(?P<open>[(\[*_`]?)(?P<letter>" + letter_class + r")(?P<close>" + closing
        + r")(?P<after>(?:\s*(?:or|and|/|,|&)\s*" + opening + letter_class + r"\b)?)"
        r"(?=$|[\s.,;:!?)\]*_`\"'\u201d\u2019])",
        re.IGNORECASE | re.MULTILINE)
    statements = []
    for match in explicit.finditer(text):
        letter = match["letter"]
        if letter.islower() and not _set_apart(match, text):
            continue
        statements.append(match)
    if statements:
        last = statements[-1]
        if last["after"]:
            return Letter(None, f"ambiguous: {last.group().strip()[:40]!r}", "statement")
        return Letter(last["letter"].upper(), how="statement")

    lone = re.compile(r"[ \t" + re.escape(_DECOR) + r"(\[]*(?P<letter>" + letter_class
                      + r")[ \t" + re.escape(_DECOR) + r")\].:]*")
    # line by line: a pattern free to cross lines would be quadratic on many blank ones
    found = {m["letter"].upper() for m in map(lone.fullmatch, _short_lines(text)) if m}
    if found:
        return _one(found, "a lone letter line")

    apart = re.compile(r"(?:\((?P<a>" + letter_class + r")\)|\[(?P<b>" + letter_class
                       + r")\]|(?P<mark>\*\*|__|\*|_|`)(?P<c>" + letter_class + r")(?P=mark))")
    found = {(m["a"] or m["b"] or m["c"]).upper() for m in apart.finditer(text)}
    if found:
        return _one(found, "a letter set apart")

    bare = re.compile(r"(?<![\w'\u2019-])(?P<letter>[" + re.escape(letters) + r"])(?![\w'\u2019-])")
    found = {m["letter"] for m in bare.finditer(text)}
    if found:
        return _one(found, "a capital letter alone")
    return Letter(None, "no answer letter found")


def _short_lines(text: str, limit: int = 80) -> Iterator[str]:
    """The lines of ``text`` short enough to be one decorated letter."""
    return (line for line in text.splitlines() if len(line) <= limit)


def _set_apart(match: re.Match[str], text: str) -> bool:
    if match["open"] or match["close"]:
        return True
    rest = text[match.end("letter"):]
    return not rest.strip(" \t") or rest[:1] in ".):\n\r"


def _one(found: set[str], how: str) -> Letter:
    if len(found) > 1:
        return Letter(None, f"ambiguous: {', '.join(sorted(found))} ({how})", how)
    return Letter(found.pop(), how=how)


# ---------------------------------------------------------------- JSON

_FENCE = re.compile(r"^[ \t]*```[ \t]*(?P<label>[\w+-]*)[^\n]*\n(?P<body>.*?)^[ \t]*```",
                    re.MULTILINE | re.DOTALL)


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


@attrs.frozen
class FoundJSON:
    """The JSON value of an answer (``value`` when ``ok``), or why there is none."""

    ok: bool
    value: Any = None
    problem: str = ""
    where: str = "the answer"


def find_json(text: str, fenced: bool = True) -> FoundJSON:
    """The JSON value an answer gives.

    With ``fenced``: the first fenced block labelled ``json`` (```` ```json ````), else
    the first fenced block of any label, else the whole answer; without: the whole
    answer only.  White space around it is ignored.  Strict JSON: ``NaN`` and
    ``Infinity`` are not JSON; nesting too deep to parse is invalid.
    """
    where, body = "the answer", text
    if fenced:
        blocks = list(_FENCE.finditer(text))
        chosen = next((b for b in blocks if b["label"].lower() == "json"),
                      blocks[0] if blocks else None)
        if chosen is not None:
            where, body = "the fenced block", chosen["body"]
    try:
        value = json.loads(body, parse_constant=_no_constants)
    except RecursionError:
        return FoundJSON(False, problem="nested too deep", where=where)
    except ValueError as exc:
        message = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
        position = f" at line {exc.lineno} column {exc.colno}" if isinstance(
            exc, json.JSONDecodeError) else ""
        return FoundJSON(False, problem=f"{message}{position}", where=where)
    return FoundJSON(True, value, where=where)


def json_equal(a: Any, b: Any) -> bool:
    """Equal as JSON values: ``1 == 1.0``, but ``true`` is not ``1``; objects by key."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and bool(a == b)


def json_subset(expected: Any, actual: Any) -> bool:
    """``expected`` is contained in ``actual``: every key of an expected object is in the
    actual one with a contained value (recursively); arrays and scalars are equal."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        return all(k in actual and json_subset(v, actual[k]) for k, v in expected.items())
    return json_equal(expected, actual)


def first_difference(expected: Any, actual: Any, subset: bool, path: str = "$") -> str:
    """Where ``actual`` first departs from ``expected`` (a ``$.a[0]`` path)."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        for key, value in expected.items():
            if key not in actual:
                return f"{path}.{key} missing"
            if not (json_subset if subset else json_equal)(value, actual[key]):
                return first_difference(value, actual[key], subset, f"{path}.{key}")
        if not subset:
            extra = sorted(set(actual) - set(expected))
            if extra:
                return f"{path}.{extra[0]} not expected"
    if (isinstance(expected, list) and isinstance(actual, list)
            and len(expected) == len(actual)):
        for index, (x, y) in enumerate(zip(expected, actual, strict=True)):
            if not (json_subset if subset else json_equal)(x, y):
                return first_difference(x, y, subset, f"{path}[{index}]")
    shown = json.dumps(actual, ensure_ascii=False)
    return f"{path} is {shown[:40] + '…' if len(shown) > 40 else shown}"
