"""Every scorer kind on its edge cases, the rules all kinds share, and option checking."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fanout.eval._text import Normalise, find_json, find_letter, numbers, parse_number
from fanout.eval._values import quote
from fanout.eval.judge import JudgeScorer
from fanout.eval.scorers import (
    BUILTIN,
    KINDS,
    NO_EXPECTED,
    Answer,
    Score,
    Scorer,
    make_scorer,
)

OUTCOMES = ("truncated", "error", "timed_out", "cancelled")


def answer(text: str = "", expected: Any = NO_EXPECTED, **fields: Any) -> Answer:
    fields.setdefault("outcome", "completed")
    return Answer(id=fields.pop("id", "q1"), model="m", sample=0, text=text,
                  expected=expected, **fields)


def score(kind: str, text: str, expected: Any = NO_EXPECTED, **options: Any) -> Score:
    return make_scorer(kind, kind, options).score(answer(text, expected))


def passes(kind: str, text: str, expected: Any = NO_EXPECTED, **options: Any) -> bool:
    result = score(kind, text, expected, **options)
    assert result.status == "scored", result
    assert result.passed is not None
    return result.passed


# ---------------------------------------------------------------- shared rules

SIMPLE_OPTIONS: dict[str, dict[str, Any]] = {
    "exact": {}, "includes": {}, "regex": {"pattern": "x"}, "numeric": {}, "choice": {},
    "json": {}, "tool_call": {}, "finish": {},
}


@pytest.mark.parametrize("kind", sorted(SIMPLE_OPTIONS))
@pytest.mark.parametrize("outcome", OUTCOMES)
def test_an_answer_that_did_not_complete_is_unscored(kind: str, outcome: str) -> None:
    scorer = make_scorer(kind, kind, SIMPLE_OPTIONS[kind])
    result = scorer.score(answer("42", "42", outcome=outcome, reason="the body ended early"))
    assert result == Score("unscored", None, None, f"{outcome}: the body ended early")


def test_unscored_without_a_reason_still_says_what_happened() -> None:
    result = BUILTIN["exact"].score(answer("x", "x", outcome="cancelled"))
    assert result == Score("unscored", None, None, "cancelled: the stream did not complete")


@pytest.mark.parametrize("kind", ["exact", "includes", "numeric", "choice"])
def test_a_kind_that_needs_expected_errors_without_it(kind: str) -> None:
    result = make_scorer(kind, kind, {}).score(answer("42", id="q3"))
    assert result == Score("error", None, None, "no expected value for prompt q3")


@pytest.mark.parametrize(("kind", "text"), [("regex", "x"), ("json", "{}"), ("finish", "")])
def test_kinds_that_do_not_need_expected_score_without_it(kind: str, text: str) -> None:
    scorer = make_scorer(kind, kind, SIMPLE_OPTIONS[kind])
    result = scorer.score(answer(text, finish_reason="stop"))
    assert result.status == "scored" and result.passed is True, result


def test_kinds_and_builtins() -> None:
    assert KINDS == ("exact", "includes", "regex", "numeric", "choice", "json", "tool_call",
                     "finish", "python", "judge")
    assert set(BUILTIN) == {"exact", "includes", "numeric", "choice", "json", "finish",
                            "tool_call"}
    for name, scorer in BUILTIN.items():
        assert isinstance(scorer, Scorer)
        assert (scorer.name, scorer.kind, scorer.threshold) == (name, name, 1.0)
        assert scorer.key == make_scorer("other name", name, {}).key


def test_the_public_faces() -> None:
    import fanout.eval.judge
    import fanout.eval.scorers

    assert set(fanout.eval.scorers.__all__) == {"BUILTIN", "KINDS", "NO_EXPECTED", "Answer",
                                                "Score", "Scorer", "make_scorer"}
    assert "JudgeScorer" in fanout.eval.judge.__all__
    for name in fanout.eval.scorers.__all__:
        assert getattr(fanout.eval.scorers, name) is not None


def test_key_is_stable_over_option_order_and_spelt_out_defaults() -> None:
    a = make_scorer("a", "numeric", {"tolerance": 0.5, "extract": "first"})
    b = make_scorer("b", "numeric", {"extract": "first", "tolerance": 0.5})
    c = make_scorer("c", "numeric", {"extract": "first", "tolerance": 0.5, "relative": 0.0,
                                     "threshold": 1.0})
    assert a.key == b.key == c.key
    assert len(a.key) == 16 and int(a.key, 16) >= 0
    assert make_scorer("a", "numeric", {"tolerance": 0.25, "extract": "first"}).key != a.key
    assert make_scorer("a", "exact", {}).key != make_scorer("a", "includes", {}).key
    assert make_scorer("a", "numeric", {"tolerance": 1}).key == make_scorer(
        "a", "numeric", {"tolerance": 1.0}).key
    assert make_scorer("a", "finish", {"allowed": ["stop"]}).key == make_scorer(
        "a", "finish", {"allowed": "stop"}).key
    dated = {"type": "object", "examples": [datetime.date(2026, 12, 1)]}  # TOML has dates
    assert make_scorer("a", "json", {"schema": dated}).key == make_scorer(
        "a", "json", {"schema": dict(dated)}).key
    # the key is a pure function of (kind, options): the same in another process
    code = ("from fanout.eval.scorers import make_scorer; print(make_scorer('z', 'numeric', "
            "{'extract': 'first', 'tolerance': 0.5}).key)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={"PYTHONHASHSEED": "123", "PATH": ""})
    assert out.stdout.strip() == a.key


def test_threshold_decides_passed() -> None:
    scorer = make_scorer("n", "python", {"function": "tests.eval.grading:half",
                                         "threshold": 0.5})
    result = scorer.score(answer("x"))
    assert (result.value, result.passed) == (0.5, True)
    strict = make_scorer("n", "python", {"function": "tests.eval.grading:half"})
    assert strict.score(answer("x")).passed is False


@pytest.mark.parametrize(
    ("kind", "options", "message"),
    [
        ("exact", {"ignore_cases": True}, "unknown option 'ignore_cases' (known: "
         "collapse_whitespace, ignore_case, ignore_punctuation, strip, threshold)"),
        ("exact", {"ignore_case": "yes"}, "option 'ignore_case': must be true or false, "
         "not 'yes'"),
        ("exact", {"threshold": 2}, "option 'threshold': must be a number in [0, 1], not 2"),
        ("exact", {"threshold": True}, "option 'threshold': must be a number in [0, 1], "
         "not True"),
        ("numeric", {"tolerance": "abc"}, "option 'tolerance': must be a number >= 0, "
         "not 'abc'"),
        ("numeric", {"tolerance": -1}, "option 'tolerance': must be a number >= 0, not -1"),
        ("numeric", {"tolerance": float("nan")}, "option 'tolerance': must be a number >= 0, "
         "not nan"),
        ("numeric", {"extract": "middle"}, "option 'extract': must be one of 'last', 'first', "
         "'only', not 'middle'"),
        ("includes", {"mode": "some"}, "option 'mode': must be one of 'any', 'all', "
         "not 'some'"),
        ("regex", {}, "option 'pattern': required (a regular expression)"),
        ("regex", {"pattern": "("}, "option 'pattern': not a regular expression (missing ) "
         "at position 1), not '('"),
        ("regex", {"pattern": "(a)", "group": 2}, "option 'group': the pattern has 1 "
         "group(s), not 2"),
        ("regex", {"pattern": "(?P<x>a)", "group": "y"}, "option 'group': the pattern has no "
         "group 'y' (named groups: x)"),
        ("regex", {"pattern": "a", "flags": "ix"}, "option 'flags': must be a string of the "
         "flags i, m, s, not 'ix'"),
        ("regex", {"pattern": "a", "group": -1}, "option 'group': must be a group number >= 0 "
         "or a group name, not -1"),
        ("choice", {"letters": "AA"}, "option 'letters': must be two or more distinct "
         "letters or digits, like 'ABCD', not 'AA'"),
        ("choice", {"letters": "A"}, "option 'letters': must be two or more distinct "
         "letters or digits, like 'ABCD', not 'A'"),
        ("finish", {"allowed": []}, "option 'allowed': must be a non-empty list of strings, "
         "not []"),
        ("finish", {"allowed": [1]}, "option 'allowed': must be a non-empty list of strings, "
         "not [1]"),
        ("tool_call", {"choice": -1}, "option 'choice': must be an integer >= 0, not -1"),
        ("tool_call", {"choice": 1.5}, "option 'choice': must be an integer >= 0, not 1.5"),
        ("tool_call", {"arguments": "some"}, "option 'arguments': must be one of 'subset', "
         "'exact', not 'some'"),
        ("json", {"schema": "x"}, "option 'schema': must be a table (a JSON Schema), not 'x'"),
        ("json", {"schema": {"type": "nope"}}, "option 'schema': not a valid JSON Schema: at "
         "type: 'nope' is not valid under any of the given schemas"),
        ("json", {"schema": {}, "schema_file": "s.json"}, "options 'schema' and "
         "'schema_file': give one, not both"),
        ("python", {}, "option 'function': required ('module:function')"),
        ("python", {"function": "nocolon"}, "option 'function': must be 'module:function', "
         "not 'nocolon'"),
        ("python", {"function": "no_such_module_xyz:f"}, "option 'function': cannot import "
         "'no_such_module_xyz:f': ModuleNotFoundError: No module named 'no_such_module_xyz'"),
        ("python", {"function": "tests.eval.grading:missing"}, "option 'function': module "
         "'tests.eval.grading' has no function 'missing'"),
        ("python", {"function": "tests.eval.grading:half", "args": 3}, "option 'args': must "
         "be a table, not 3"),
        ("nope", {}, "unknown scorer kind 'nope' (known: exact, includes, regex, numeric, "
         "choice, json, tool_call, finish, python, judge)"),
    ],
)
def test_bad_options_are_one_line_errors(kind: str, options: dict[str, Any], message: str
                                         ) -> None:
    with pytest.raises(ValueError) as caught:
        make_scorer("s", kind, options)
    assert str(caught.value) == message
    assert "\n" not in str(caught.value)


def test_options_must_be_a_table() -> None:
    with pytest.raises(ValueError, match=r"^options must be a table, not \[1\]$"):
        make_scorer("s", "exact", [1])  # type: ignore[arg-type]


def test_a_long_bad_value_is_cut_in_the_message() -> None:
    with pytest.raises(ValueError) as caught:
        make_scorer("s", "numeric", {"tolerance": "x" * 500})
    assert len(str(caught.value)) < 120 and str(caught.value).endswith("…")


# ---------------------------------------------------------------- exact

@pytest.mark.parametrize(
    ("text", "expected", "options", "ok"),
    [
        ("Paris", "Paris", {}, True),
        ("  Paris\n", "Paris", {}, True),  # strip is on by default
        ("  Paris\n", "Paris", {"strip": False}, False),
        ("paris", "Paris", {}, False),  # exact means exact
        ("paris", "Paris", {"ignore_case": True}, True),
        ("STRASSE", "Straße", {"ignore_case": True}, True),  # case folding, not lower()
        ("Paris.", "Paris", {}, False),
        ("Paris.", "Paris", {"ignore_punctuation": True}, True),
        ("U.S.A.", "USA", {"ignore_punctuation": True}, True),
        ("New  York", "New York", {}, False),
        ("New \t\n York", "New York", {"collapse_whitespace": True}, True),
        ("new york!", "New   York", {"ignore_case": True, "collapse_whitespace": True,
                                     "ignore_punctuation": True}, True),
        ("Caf\u0065\u0301", "Caf\u00e9", {}, True),  # NFC: the same text typed two ways
        ("3", 3, {}, True),  # a number compares as its JSON text
        ("3.0", 3, {}, False),
        ("2.5", 2.5, {}, True),
        ("Lyon", ["Paris", "Lyon"], {}, True),  # a list: any acceptable string
        ("Nice", ["Paris", "Lyon"], {}, False),
        ("", "", {}, True),
        ("x", "", {}, False),
    ],
)
def test_exact(text: str, expected: Any, options: dict[str, Any], ok: bool) -> None:
    assert passes("exact", text, expected, **options) is ok


def test_exact_explanations_quote_the_answer_briefly() -> None:
    result = score("exact", "Lyon\n" + "x" * 200, "Paris")
    assert result.explanation.startswith("'Lyon\\nxxxx")
    assert result.explanation.endswith("…' is not 'Paris'") or "… is not 'Paris'" in (
        result.explanation)
    assert len(result.explanation) < 120 and "\n" not in result.explanation
    assert score("exact", "Paris", "Paris").explanation == "equals 'Paris'"
    many = score("exact", "x", ["a", "b", "c", "d", "e"]).explanation
    assert many == "'x' is not 'a', 'b', 'c' (+2 more)"


def test_exact_hostile_text_is_escaped_in_the_explanation() -> None:
    result = score("exact", "\x1b[31mred\u202e\x85", "blue")
    assert "\x1b" not in result.explanation and "\u202e" not in result.explanation
    assert "\\x1b" in result.explanation and "\\u202e" in result.explanation


def test_a_lone_surrogate_in_an_answer_is_compared_and_escaped() -> None:
    result = score("exact", "a\ud800", "a\ud800")
    assert result.passed is True and "\\ud800" in result.explanation


@pytest.mark.parametrize("expected", [None, True, {"a": 1}, [], ["a", None], [["a"]]])
def test_exact_refuses_an_expected_it_cannot_compare(expected: Any) -> None:
    result = score("exact", "a", expected)
    assert result.status == "error"
    assert result.explanation.startswith("expected must be a string, a number or a "
                                         "non-empty list of them, not ")


def test_exact_error_names_the_bad_item() -> None:
    assert score("exact", "a", ["a", None]).explanation.endswith("not a list holding null")
    assert score("exact", "a", []).explanation.endswith("not an empty list")
    assert score("exact", "a", True).explanation.endswith("not a boolean")


TEXT = st.text(st.characters(codec="utf-8"), max_size=40)
FLAGS = st.fixed_dictionaries({"ignore_case": st.booleans(),
                               "collapse_whitespace": st.booleans(),
                               "ignore_punctuation": st.booleans(), "strip": st.booleans()})


@given(TEXT, FLAGS)
def test_normalisation_is_idempotent(text: str, flags: dict[str, bool]) -> None:
    normalise = Normalise(**flags)
    once = normalise(text)
    assert normalise(once) == once


@given(TEXT, FLAGS)
def test_exact_of_a_text_against_itself_passes(text: str, flags: dict[str, bool]) -> None:
    assert passes("exact", text, text, **flags)


@given(TEXT)
def test_the_loosest_exact_passes_whatever_the_case(text: str) -> None:
    loose = {"ignore_case": True, "collapse_whitespace": True, "ignore_punctuation": True}
    assert passes("exact", text.upper(), text.lower(), **loose) is (
        Normalise(**loose)(text.upper()) == Normalise(**loose)(text.lower()))


# ---------------------------------------------------------------- includes

@pytest.mark.parametrize(
    ("text", "expected", "options", "ok"),
    [
        ("The capital is Paris.", "Paris", {}, True),
        ("The capital is paris.", "Paris", {}, False),
        ("The capital is paris.", "Paris", {"ignore_case": True}, True),
        ("It is Lyon", ["Paris", "Lyon"], {}, True),
        ("It is Lyon", ["Paris", "Lyon"], {"mode": "all"}, False),
        ("Paris and Lyon", ["Paris", "Lyon"], {"mode": "all"}, True),
        ("Paris and Lyon", "Paris", {"mode": "all"}, True),  # a string is one item
        ("answer: 42", 42, {}, True),
        ("New   York City", "new york", {"ignore_case": True, "collapse_whitespace": True},
         True),
    ],
)
def test_includes(text: str, expected: Any, options: dict[str, Any], ok: bool) -> None:
    assert passes("includes", text, expected, **options) is ok


def test_includes_explanations() -> None:
    assert score("includes", "x", ["a", "b"], mode="all").explanation == (
        "lacks 'a', 'b' (0 of 2 present)")
    assert score("includes", "a b", ["a", "b"], mode="all").explanation == (
        "includes all 2 of 'a', 'b'")
    assert score("includes", "x", ["a", "b"]).explanation == "includes none of 'a', 'b'"


def test_includes_refuses_an_empty_needle() -> None:
    result = score("includes", "anything", "...", ignore_punctuation=True)
    assert result.status == "error" and "empty" in result.explanation


# ---------------------------------------------------------------- regex

def test_regex_without_expected_a_match_passes() -> None:
    assert passes("regex", "order #123 shipped", pattern=r"#\d+")
    assert not passes("regex", "no order", pattern=r"#\d+")
    assert score("regex", "no order", pattern=r"#\d+").explanation == "no match of '#\\\\d+'"


def test_regex_group_is_compared_to_expected_after_normalisation() -> None:
    opts = {"pattern": r"answer:\s*(\w+)", "group": 1, "flags": "i"}
    assert passes("regex", "ANSWER: Paris", "paris", ignore_case=True, **opts)
    assert not passes("regex", "ANSWER: Paris", "paris", **opts)
    assert passes("regex", "Answer: Lyon", ["Paris", "Lyon"], **opts)
    result = score("regex", "answer: Nice", "Paris", **opts)
    assert result.explanation == "group 1 is 'Nice', not 'Paris'"


def test_regex_named_group_first_and_last_match() -> None:
    opts = {"pattern": r"=\s*(?P<n>\d+)", "group": "n"}
    text = "x = 1, then y = 2"
    assert passes("regex", text, "1", **opts)
    assert passes("regex", text, "2", match="last", **opts)
    assert not passes("regex", text, "2", **opts)


def test_regex_whole_match_without_group_and_optional_group() -> None:
    assert passes("regex", "id: AB-12", "AB-12", pattern=r"[A-Z]+-\d+")
    result = score("regex", "b", "x", pattern=r"(a)?b", group=1)
    assert result.passed is False and "did not take part" in result.explanation


def test_regex_flags_m_and_s() -> None:
    assert passes("regex", "one\ntwo", pattern=r"^two$", flags="m")
    assert not passes("regex", "one\ntwo", pattern=r"^two$")
    assert passes("regex", "a\nb", pattern=r"a.b", flags="s")


# patterns users write for re, with texts that tell re's behaviour apart
RE_PATTERNS = [r"answer:\s*(\w+)", r"#\d+", r"^two$", r"a.b", r"(?P<n>\d+)\s*%", r"[A-Z]+-\d+",
               r"\bcolou?r\b", r"straße", r"\w+", r"[^\W\d_]+", r"(?i)paris", r"\$\d+(?:\.\d\d)?",
               r"(a)?b", r"\u00e9t\u00e9", r"[[:alpha:]]", r"x{2,}", r"(?<=\$)\d+"]


@pytest.mark.parametrize("pattern", RE_PATTERNS)
@pytest.mark.parametrize("flags", ["", "i", "m", "s", "ims"])
@settings(max_examples=40)
@given(text=st.lists(st.sampled_from([*"aAbB2#$%.: \nxXéÉßSsK\u212a-_[]", "STRASSE", "answer: ",
                                      "Paris", "colour", "été", "$12.50"]), max_size=12
                     ).map("".join))
def test_regex_matches_as_re_would(pattern: str, flags: str, text: str) -> None:
    import re
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # re on "[[:alpha:]]"
        compiled = re.compile(pattern, sum((getattr(re, f.upper()) for f in flags), 0))
    expected = compiled.search(text)
    if pattern == r"[[:alpha:]]":  # regex reads a POSIX class where re reads a set
        return
    scorer = make_scorer("r", "regex", {"pattern": pattern, "flags": flags})
    result = scorer.score(answer(text))
    assert result.passed is (expected is not None), (pattern, flags, text, result)
    if expected is not None:
        assert result.explanation == f"matched {quote(expected.group())}"


REDOS = "a" * 40 + "!"


@pytest.mark.parametrize("match", ["first", "last"])
def test_a_pattern_past_its_time_limit_is_an_error_naming_the_scorer(match: str) -> None:
    scorer = make_scorer("strict", "regex", {"pattern": "^(a|aa)+$", "match": match,
                                             "regex_timeout": 0.05})
    assert scorer.score(answer(REDOS)) == Score(
        "error", None, None,
        "regex timed out after 0.05 s (scorer 'strict', pattern '^(a|aa)+$')")
    assert scorer.score(answer("aaaa")).passed is True  # the next answer is scored


def test_the_time_limit_is_for_all_of_an_answers_matches() -> None:
    # 40 lines that each take a while: every match fits, all of them do not
    scorer = make_scorer("r", "regex", {"pattern": "^(a|aa)+$", "flags": "m", "match": "last",
                                        "regex_timeout": 0.05})
    result = scorer.score(answer(("a" * 22 + "!\n") * 40))
    assert result.status == "error" and "timed out after 0.05 s" in result.explanation


def test_nested_quantifiers_that_regex_resolves_are_plain_fails() -> None:
    result = score("regex", REDOS, pattern="^(a+)+$")
    assert (result.status, result.passed) == ("scored", False)


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"w": {"type": "string", "pattern": "^(a|aa)+$"}}},
    {"type": "object", "patternProperties": {"^(a|aa)+$": {"type": "string"}}},
    {"type": "object", "properties": {"x": {}},
     "patternProperties": {"^(a|aa)+$": {}}, "additionalProperties": False},
    {"type": "array", "items": {"$ref": "#/$defs/w"},
     "$defs": {"w": {"type": "string", "pattern": "^(a|aa)+$"}}},
])
def test_a_json_schemas_patterns_have_the_time_limit(schema: dict[str, Any]) -> None:
    scorer = make_scorer("shape", "json", {"schema": schema, "regex_timeout": 0.05})
    value = [REDOS] if schema["type"] == "array" else {"w": REDOS, REDOS: "x"}
    assert scorer.score(answer(json.dumps(value))) == Score(
        "error", None, None,
        "regex timed out after 0.05 s (scorer 'shape', pattern '^(a|aa)+$')")


def test_a_json_schemas_patterns_still_decide_as_jsonschema_says() -> None:
    schema = {"type": "object", "properties": {"id": {"type": "string", "pattern": "^[A-Z]+-\\d+$"}},
              "patternProperties": {"^x-": {"type": "integer"}}, "additionalProperties": False}
    assert passes("json", '{"id": "AB-12", "x-n": 3}', schema=schema)
    assert score("json", '{"id": "ab", "x-n": 3}', schema=schema).explanation == (
        "not valid against the schema: id: 'ab' does not match '^[A-Z]+-\\\\d+$'")
    assert score("json", '{"id": "AB-1", "x-n": "3"}', schema=schema).explanation == (
        "not valid against the schema: x-n: '3' is not of type 'integer'")
    assert score("json", '{"id": "AB-1", "y": 1}', schema=schema).explanation == (
        "not valid against the schema: (root): 'y' does not match any of the regexes: '^x-'")
    plain = {"type": "object", "properties": {"a": {}}, "additionalProperties": False}
    assert score("json", '{"a": 1, "b": 2, "c": 3}', schema=plain).explanation == (
        "not valid against the schema: (root): Additional properties are not allowed "
        "('b', 'c' were unexpected)")


def test_a_schema_pattern_regex_cannot_compile_is_said_not_raised() -> None:
    # the schema check compiles patterns with re; one that regex refused at match time
    # (none is known) would be an error score naming it, not a traceback
    from fanout.eval._pattern import Deadline, LimitedValidator, PatternError

    with pytest.raises(PatternError, match=r"^schema pattern '\(': not a regular expression"):
        LimitedValidator({"type": "string", "pattern": "("}).errors("x", Deadline(1.0))


def test_unevaluated_properties_beside_pattern_properties_is_refused() -> None:
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
              "patternProperties": {"^x": {}}, "unevaluatedProperties": False}
    with pytest.raises(ValueError, match=r"^option 'schema': 'unevaluatedProperties' with "
                                         r"'patternProperties' is not supported"):
        make_scorer("s", "json", {"schema": schema})


@pytest.mark.parametrize("value", [0, -1, "1", True, float("inf"), 3601])
def test_regex_timeout_must_be_some_seconds(value: Any) -> None:
    for kind, options in (("regex", {"pattern": "a"}), ("json", {}), ("judge", {"model": "m"})):
        with pytest.raises(ValueError, match=r"^option 'regex_timeout': must be a number of "
                                             r"seconds in \(0, 3600\], not "):
            make_scorer(kind, kind, {**options, "regex_timeout": value})


def test_regex_timeout_at_its_default_leaves_the_key_alone() -> None:
    for kind, options in (("regex", {"pattern": "a"}), ("json", {"schema": {}})):
        plain = make_scorer(kind, kind, options).key
        assert make_scorer(kind, kind, {**options, "regex_timeout": 1}).key == plain
        assert make_scorer(kind, kind, {**options, "regex_timeout": 5}).key != plain
    judge = make_scorer("j", "judge", {"model": "m"}).key
    assert make_scorer("j", "judge", {"model": "m", "regex_timeout": 5}).key == judge


# ---------------------------------------------------------------- numeric

@pytest.mark.parametrize(
    ("text", "expected", "options", "ok"),
    [
        ("The answer is 42.", 42, {}, True),
        ("First 3, then 7, so 10", 10, {}, True),  # the last number by default
        ("First 3, then 7, so 10", 3, {"extract": "first"}, True),
        ("It is 1,234.5 units", 1234.5, {}, True),
        ("It is 1,234,567", "1,234,567", {}, True),  # a numeric string expected
        ("x = -3", -3, {}, True),
        ("x = \u22123", -3, {}, True),  # the typographic minus
        ("x = +3", 3, {}, True),
        ("from 2-3", 3, {}, True),  # a dash between numbers is no sign
        ("tiny: 1e-3", 0.001, {}, True),
        ("tiny: 2.5E+2", 250, {}, True),
        ("costs $12", 12, {}, True),
        ("costs $12.50", "12.5", {}, True),
        ("rate 12%", 12, {}, True),
        ("rate 12 %", 12, {}, True),
        ("rate 12%", 0.12, {"percent": "fraction"}, True),
        ("rate 12%", 12, {"percent": "fraction"}, False),
        ("about .5", 0.5, {}, True),
        ("3.14159", 3.14, {}, False),
        ("3.14159", 3.14, {"tolerance": 0.01}, True),
        ("1010", 1000, {"relative": 0.01}, True),
        ("1011", 1000, {"relative": 0.01}, False),
        ("0.1 + 0.2 = 0.30000000000000004", 0.3, {}, True),  # default tolerance 1e-9
        ("H2O has 3 atoms", 3, {"extract": "first"}, True),  # H2O is no number
        ("Either 4 or 5", [5, 6], {}, True),
        ("1,23", 23, {}, True),  # not a thousands group: two numbers
        ("7", 7, {"extract": "only"}, True),
        ("7 or 8", 8, {"extract": "only"}, False),
        ("p = 3/4", 0.75, {}, False),  # a fraction is two numbers
        ("p = 3/4", 4, {}, True),
        ("version 1.2.3", 1.2, {}, True),  # .3 glued to 1.2 is no number of its own
    ],
)
def test_numeric(text: str, expected: Any, options: dict[str, Any], ok: bool) -> None:
    assert passes("numeric", text, expected, **options) is ok


@given(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e15, max_value=1e15),
       st.sampled_from(["{:.6g}", "{:,.2f}", "{:.3e}", "${:,.0f}", "{:g}%"]),
       st.sampled_from(["", "So the result is ", "Step 1: 3 apples.\nAnswer: "]))
def test_numeric_reads_back_any_number_it_is_shown(value: float, form: str, lead: str) -> None:
    written = form.format(value)
    if written.startswith("$-"):  # "$-5": the sign goes first
        written = "-$" + written[2:]
    shown = float(written.replace("$", "").strip("%").replace(",", ""))
    assert passes("numeric", f"{lead}{written}.", shown, relative=1e-12)


@given(st.sampled_from("ABCD"), st.sampled_from(["Answer: {}", "The answer is ({}).",
                                                 "**{}**", "I reason at length.\n\n{}\n",
                                                 "answer is {}", "Final answer - {}"]),
       st.booleans())
def test_choice_reads_back_the_letter_in_every_form(letter: str, form: str, lower: bool
                                                    ) -> None:
    text = form.format(letter.lower() if lower else letter)
    assert find_letter(text, "ABCD").letter == letter, text


def test_numeric_no_number_is_a_fail_with_its_explanation() -> None:
    result = score("numeric", "I do not know", 4)
    assert (result.status, result.passed) == ("scored", False)
    assert result.explanation == "no number in 'I do not know'"
    only = score("numeric", "7 or 8", 8, extract="only")
    assert only.explanation == "2 numbers in the answer, expected only one"
    assert score("numeric", "It is 1,234.5", 1234.5).explanation == "1,234.5 = 1234.5"
    assert score("numeric", "About $1,009.50", 1000, relative=0.01).explanation == (
        "$1,009.50 is within 10 of 1000")
    wrong = score("numeric", "It is 1,234.5", 3)
    assert wrong.explanation == "last number 1,234.5 is not 3"


@pytest.mark.parametrize("expected", ["about four", "1 2", True, None, {"n": 1}, [],
                                      float("nan")])
def test_numeric_refuses_a_non_numeric_expected(expected: Any) -> None:
    result = score("numeric", "4", expected)
    assert result.status == "error"
    assert result.explanation.startswith("expected must be a number or a numeric string")


def test_numbers_and_parse_number() -> None:
    found = list(numbers("a -1,000.5e2 b $3 c 40% d x2 e 5."))
    assert [(n.value, n.written, n.percent) for n in found] == [
        (-100050.0, "-1,000.5e2", False), (3.0, "$3", False), (40.0, "40%", True),
        (5.0, "5", False)]
    assert parse_number(" 12% ") == 12 and parse_number("1,234") == 1234
    assert parse_number("12 apples") is None and parse_number(float("inf")) is None


# ---------------------------------------------------------------- choice

@pytest.mark.parametrize(
    ("text", "letter"),
    [
        ("Answer: B", "B"),
        ("answer: b", "B"),
        ("(c)", "C"),
        ("**B**", "B"),
        ("The answer is C.", "C"),
        ("The correct answer is (d) because ...", "D"),
        ("Final answer - **A**", "A"),
        ("Reasoning...\nB\n", "B"),
        ("  `C`  ", "C"),
        ("I first thought the answer is A. On reflection, the answer is B.", "B"),  # last wins
        ("Options (A) and (B) are wrong; the answer is D", "D"),
        ("The answer is a bit tricky. Answer: C", "C"),  # a lower-case word is no letter
        ("I pick B, definitely", "B"),
        ("Correct option: b)", "B"),
        ("The answer is B. Option A is wrong.", "B"),  # "Option A" states nothing
        ("Option A is wrong; choice: C", "C"),
        ("The best choice is (d).", "D"),
        ("The answer depends on context. Answer: A", "A"),
    ],
)
def test_choice_finds_the_letter(text: str, letter: str) -> None:
    found = find_letter(text, "ABCD")
    assert found.letter == letter, found
    assert passes("choice", text, letter)
    assert passes("choice", text, letter.lower())
    assert not passes("choice", text, "A" if letter != "A" else "B")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("A or B", "ambiguous: A, B (a capital letter alone)"),
        ("The answer is A or B", "ambiguous: 'answer is A or B'"),
        ("Answer: C/D", "ambiguous: 'Answer: C/D'"),
        ("A\nB", "ambiguous: A, B (a lone letter line)"),
        ("Maybe (a), maybe (c)", "ambiguous: A, C (a letter set apart)"),
        ("I do not know", "no answer letter found"),
        ("Answer: E", "no answer letter found"),
    ],
)
def test_choice_ambiguity_and_absence_fail_with_explanation(text: str, problem: str) -> None:
    found = find_letter(text, "ABCD")
    assert (found.letter, found.problem) == (None, problem)
    result = score("choice", text, "A")
    assert (result.status, result.passed) == ("scored", False)
    assert result.explanation.startswith(problem)


def test_choice_custom_letters_and_expected_forms() -> None:
    assert passes("choice", "Answer: E", "e", letters="ABCDE")
    assert passes("choice", "Answer: 3", "3", letters="1234")
    assert passes("choice", "(B)", "(b)")
    assert score("choice", "Answer: B", "B").explanation == "answered B (statement)"
    assert score("choice", "Answer: C", "B").explanation == "answered C, not B (statement)"
    result = score("choice", "B", "E")
    assert result.status == "error"
    assert result.explanation == "expected must be one of the letters ABCD, not 'E'"
    listed = score("choice", "B", ["B", "\x85"]).explanation
    assert listed == 'expected must be one of the letters ABCD, not ["B", "\\u0085"]'


# ---------------------------------------------------------------- json

def test_json_plain_and_fenced() -> None:
    assert passes("json", '{"a": 1}')
    assert passes("json", 'Here:\n```json\n{"a": 1}\n```\nDone.')
    assert passes("json", 'Here:\n```\n[1, 2]\n```')
    assert not passes("json", 'Here:\n```json\n{"a": 1}\n```', fenced=False)
    assert not passes("json", "{'a': 1}")
    assert not passes("json", "NaN")
    assert not passes("json", "")


def test_json_prefers_the_json_labelled_block() -> None:
    text = "```python\nx = 1\n```\nand\n```json\n{\"b\": 2}\n```"
    assert find_json(text).value == {"b": 2}
    assert passes("json", text, {"b": 2})


def test_json_explanations() -> None:
    bad = score("json", '{"a": }')
    assert bad.explanation == "the answer is not JSON: Expecting value at line 1 column 7"
    fenced = score("json", "```json\n{\"a\": }\n```")
    assert fenced.explanation.startswith("the fenced block is not JSON: ")
    deep = score("json", "[" * 100_000)
    assert deep.passed is False


SCHEMA = {"type": "object", "properties": {"name": {"type": "string"},
                                           "age": {"type": "integer"}},
          "required": ["name"]}


def test_json_schema_inline() -> None:
    assert passes("json", '{"name": "Ada", "age": 36}', schema=SCHEMA)
    result = score("json", '{"age": "old"}', schema=SCHEMA)
    assert result.passed is False
    assert result.explanation == ("not valid against the schema: (root): 'name' is a "
                                  "required property (+1 more)")


def test_json_schema_file_relative_to_base_dir(tmp_path: Path) -> None:
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "person.json").write_text(json.dumps(SCHEMA))
    scorer = make_scorer("j", "json", {"schema_file": "schemas/person.json"},
                         base_dir=tmp_path)
    assert scorer.score(answer('{"name": "Ada"}')).passed is True
    assert scorer.score(answer('{"name": 3}')).passed is False
    # a changed schema file is a changed scorer
    (tmp_path / "schemas" / "person.json").write_text(json.dumps({**SCHEMA, "required": []}))
    again = make_scorer("j", "json", {"schema_file": "schemas/person.json"}, base_dir=tmp_path)
    assert again.key != scorer.key


def test_json_schema_file_errors_are_config_errors(tmp_path: Path) -> None:
    def error(options: dict[str, Any]) -> str:
        with pytest.raises(ValueError) as caught:
            make_scorer("j", "json", options, base_dir=tmp_path)
        return str(caught.value)

    missing = str(tmp_path / "none.json")
    assert error({"schema_file": "none.json"}) == (
        f"option 'schema_file': no such file: {missing!r}")
    (tmp_path / "bad.json").write_text('{"type": \n')
    assert error({"schema_file": "bad.json"}) == (
        f"option 'schema_file': {str(tmp_path / 'bad.json')!r} line 2 column 1: not JSON: "
        "Expecting value")
    (tmp_path / "list.json").write_text("[]")
    assert error({"schema_file": "list.json"}).endswith("is not a JSON object")
    (tmp_path / "invalid.json").write_text('{"properties": {"a": {"type": 3}}}')
    assert error({"schema_file": "invalid.json"}).startswith(
        f"option 'schema_file': not a valid JSON Schema in {str(tmp_path / 'invalid.json')!r}:"
        " at properties/a/type: 3 is not valid")


def test_json_expected_equal_and_subset() -> None:
    assert passes("json", '{"a": 1, "b": [1, 2]}', {"b": [1, 2], "a": 1.0})
    assert not passes("json", '{"a": 1, "b": 2}', {"a": 1})
    assert passes("json", '{"a": 1, "b": 2}', {"a": 1}, subset=True)
    assert passes("json", '{"a": {"x": 1, "y": 2}, "b": 2}', {"a": {"x": 1}}, subset=True)
    assert not passes("json", '{"a": [1, 2, 3]}', {"a": [1, 2]}, subset=True)  # arrays equal
    assert not passes("json", '{"a": true}', {"a": 1})  # true is not 1
    assert not passes("json", '{"a": 1}', {"a": True})
    assert passes("json", '"text"', "text")  # an expected string is a JSON string value
    result = score("json", '{"a": 1, "b": {"c": 2}}', {"a": 1, "b": {"c": 3}})
    assert result.explanation == "differs from expected: $.b.c is 2"
    missing = score("json", '{"a": 1}', {"a": 1, "z": 0}, subset=True)
    assert missing.explanation == "differs from expected: $.z missing"
    extra = score("json", '{"a": 1, "q": 0}', {"a": 1})
    assert extra.explanation == "differs from expected: $.q not expected"


# ---------------------------------------------------------------- tool_call

def call(name: str = "get_weather", arguments: Any = None, *, valid_json: bool = True,
         schema_valid: bool | None = True, schema_errors: list[str] | None = None
         ) -> dict[str, Any]:
    arguments = {"city": "Paris", "days": 3} if arguments is None else arguments
    return {"index": 0, "id": "call_1", "name": name, "arguments": json.dumps(arguments),
            "parsed": arguments if valid_json else None, "valid_json": valid_json,
            "parse_error": None if valid_json else "Expecting value at 1:2",
            "schema_valid": schema_valid, "schema_errors": schema_errors or []}


def tool_answer(*calls: dict[str, Any], expected: Any = NO_EXPECTED, index: int = 0,
                text: str = "") -> Answer:
    choices = ({"index": index, "text": text, "finish_reason": "tool_calls",
                "tool_calls": list(calls)},)
    return answer(text, expected, choices=choices, finish_reason="tool_calls")


def tool_score(a: Answer, **options: Any) -> Score:
    return make_scorer("t", "tool_call", options).score(a)


def test_tool_call_name_and_validity() -> None:
    assert tool_score(tool_answer(call(), expected="get_weather")).passed is True
    assert tool_score(tool_answer(call())).passed is True  # no expected: any valid call
    wrong = tool_score(tool_answer(call("get_time"), expected="get_weather"))
    assert (wrong.passed, wrong.explanation) == (False, "no call of 'get_weather': called "
                                                 "'get_time'")
    broken = tool_score(tool_answer(call(valid_json=False), expected="get_weather"))
    assert broken.passed is False
    assert broken.explanation == ("call 'get_weather': arguments are not valid JSON "
                                  "(Expecting value at 1:2)")
    invalid = tool_score(tool_answer(call(schema_valid=False, schema_errors=[
        "days: 'x' is not of type 'integer'"])))
    assert invalid.explanation == ("call 'get_weather': arguments not valid against the "
                                   "tool's schema: days: 'x' is not of type 'integer'")


def test_tool_call_unknown_schema_is_said() -> None:
    result = tool_score(tool_answer(call(schema_valid=None), expected="get_weather"))
    assert result.passed is True
    assert result.explanation == ("called 'get_weather' (no schema known: arguments checked "
                                  "as JSON only)")
    strict = tool_score(tool_answer(call(schema_valid=None)), require_schema=True)
    assert strict.passed is False and "require_schema" in strict.explanation


def test_tool_call_expected_arguments_subset_by_default() -> None:
    expected = {"name": "get_weather", "arguments": {"city": "Paris"}}
    assert tool_score(tool_answer(call(), expected=expected)).passed is True
    exact = tool_score(tool_answer(call(), expected=expected), arguments="exact")
    assert exact.passed is False
    assert exact.explanation == ("call 'get_weather': arguments differ: arguments.days not "
                                 "expected")
    other = tool_score(tool_answer(call(arguments={"city": "Lyon", "days": 3}),
                                   expected=expected))
    assert other.explanation == "call 'get_weather': arguments differ: arguments.city is \"Lyon\""
    full = {"name": "get_weather", "arguments": {"city": "Paris", "days": 3.0}}
    assert tool_score(tool_answer(call(), expected=full), arguments="exact").passed is True


def test_tool_call_first_matching_or_all_calls() -> None:
    two = tool_answer(call("get_time", {"zone": "UTC"}), call(), expected="get_weather")
    assert tool_score(two).passed is True
    assert tool_score(two, all_calls=True).passed is False
    both_valid = tool_answer(call("get_time", {"zone": "UTC"}), call())
    assert tool_score(both_valid, all_calls=True).explanation == "all 2 calls pass"
    one_broken = tool_answer(call("get_time", valid_json=False), call())
    assert tool_score(one_broken, all_calls=True).passed is False


def test_tool_call_choice_and_no_calls() -> None:
    none = tool_score(tool_answer(text="It is sunny."))
    assert (none.passed, none.explanation) == (False, "no tool call in choice 0 (text "
                                               "'It is sunny.')")
    missing = tool_score(tool_answer(call()), choice=1)
    assert missing.explanation == "no choice 1 in the answer"
    second = answer("", choices=({"index": 0, "tool_calls": []},
                                 {"index": 1, "tool_calls": [call()]}))
    assert tool_score(second, choice=1).passed is True


@pytest.mark.parametrize("expected", [3, {"arguments": {}}, {"name": "x", "other": 1},
                                      {"name": "x", "arguments": [1]}, ""])
def test_tool_call_refuses_a_bad_expected(expected: Any) -> None:
    result = tool_score(tool_answer(call(), expected=expected))
    assert result.status == "error" and result.explanation.startswith("expected must be a "
                                                                       "tool name")


# ---------------------------------------------------------------- finish

def test_finish() -> None:
    def finish(reason: str | None, **options: Any) -> Score:
        return make_scorer("f", "finish", options).score(answer("x", finish_reason=reason))

    assert finish("stop").passed is True
    assert finish("tool_calls").passed is True
    result = finish("length")
    assert (result.passed, result.explanation) == (False, "finish reason 'length' not in "
                                                   "stop, tool_calls")
    assert finish("content_filter").passed is False
    assert finish(None).explanation == "finish reason none not in stop, tool_calls"
    assert finish("length", allowed=["stop", "length"]).passed is True
    assert finish("stop", allowed="length").passed is False  # a string is a list of one


def test_finish_all_choices() -> None:
    choices = ({"index": 0, "finish_reason": "stop"}, {"index": 1, "finish_reason": "length"})
    a = answer("x", choices=choices, finish_reason="stop")
    assert make_scorer("f", "finish", {}).score(a).passed is True
    every = make_scorer("f", "finish", {"all_choices": True}).score(a)
    assert (every.passed, every.explanation) == (False, "choice 1 finish reason 'length' not "
                                                 "in stop, tool_calls")


# ---------------------------------------------------------------- python

def python(function: str, text: str = "x", **options: Any) -> Score:
    scorer = make_scorer("p", "python", {"function": f"tests.eval.grading:{function}",
                                         **options})
    return scorer.score(answer(text, "x"))


def test_python_return_values() -> None:
    assert python("is_x") == Score("scored", 1.0, True,
                                   "tests.eval.grading:is_x returned True")
    assert python("is_x", "y").passed is False
    assert python("half") == Score("scored", 0.5, False,
                                   "tests.eval.grading:half returned 0.5")
    assert python("explained") == Score("scored", 0.25, False, "a quarter of the way")
    assert python("a_score").explanation == "made by hand"
    assert python("a_score", threshold=0.5).passed is True  # the scorer's threshold decides
    with pytest.raises(ValueError, match="unknown option 'factor'"):
        python("with_args", factor=1)  # arguments go in args
    assert python("with_args", args={"factor": 0.5}).value == 0.5


@pytest.mark.parametrize(
    ("function", "explanation"),
    [
        ("raises", "tests.eval.grading:raises raised KeyError: 'missing'"),
        ("raises_multiline", "tests.eval.grading:raises_multiline raised ValueError: first "
         "line"),
        ("exits", "tests.eval.grading:exits raised SystemExit: 3"),
        ("too_big", "tests.eval.grading:too_big returned 1.5: not in [0, 1]"),
        ("negative", "tests.eval.grading:negative returned -0.1: not in [0, 1]"),
        ("nan", "tests.eval.grading:nan returned nan: not in [0, 1]"),
        ("nothing", "tests.eval.grading:nothing returned NoneType: expected a bool, a number "
         "in [0, 1], a Score or (value, explanation)"),
        ("a_string", "tests.eval.grading:a_string returned str: expected a bool, a number in "
         "[0, 1], a Score or (value, explanation)"),
        ("an_error_score", "could not tell"),
    ],
)
def test_python_errors_are_error_scores(function: str, explanation: str) -> None:
    result = python(function)
    assert result == Score("error", None, None, explanation)


def test_python_module_beside_the_config(tmp_path: Path) -> None:
    (tmp_path / "local_grader_7f3a.py").write_text(textwrap.dedent("""
        def grade(answer):
            return answer.text.endswith("!")
    """))
    before = list(sys.path)
    scorer = make_scorer("p", "python", {"function": "local_grader_7f3a:grade"},
                         base_dir=tmp_path)
    assert sys.path == before  # the config's directory was on sys.path for the import only
    assert scorer.score(answer("yes!")).passed is True
    assert scorer.score(answer("no")).passed is False
    # a module that fails on import is a config error naming the spec
    (tmp_path / "broken_grader_7f3a.py").write_text("raise RuntimeError('boom\\nmore')\n")
    with pytest.raises(ValueError) as caught:
        make_scorer("p", "python", {"function": "broken_grader_7f3a:grade"}, base_dir=tmp_path)
    assert str(caught.value) == ("option 'function': cannot import 'broken_grader_7f3a:grade':"
                                 " RuntimeError: boom")


def test_python_key_follows_the_module_source(tmp_path: Path) -> None:
    a = make_scorer("p", "python", {"function": "tests.eval.grading:half"})
    b = make_scorer("p", "python", {"function": "tests.eval.grading:half"})
    assert a.key == b.key
    assert make_scorer("p", "python", {"function": "tests.eval.grading:is_x"}).key != a.key


# ---------------------------------------------------------------- hostile sizes

def test_hostile_answers_take_linear_time() -> None:
    # A hang guard, not a measurement: each of these inputs once took minutes (a pattern
    # free to cross lines, quadratic on blank lines); linear, all of them together take
    # well under a second.  bench numbers: see the scorers' README fragment.
    script = textwrap.dedent("""
        from fanout.eval.scorers import Answer, make_scorer
        n = 400_000
        texts = ["\\n" * n, "```\\n" * (n // 4), " \\n" * (n // 2) + "B", "answer " + "*" * n,
                 "answer is " * (n // 10), "1," * (n // 2), "GRADE:" + " " * n,
                 "VERDICT 0123456789abcdef:" + " " * n, "0123456789abcdef" * (n // 16),
                 "<<<BEGIN ANSWER>>>" * (n // 18),
                 "A or B, (c) **d** " * (n // 18), "[" * n, "1e" * (n // 2), "<" * n]
        scorers = [make_scorer(k, k, {}) for k in ("exact", "includes", "numeric", "choice",
                                                   "json", "tool_call", "finish")]
        judge = make_scorer("j", "judge", {"model": "m"})
        for text in texts:
            answer = Answer("q", "m", 0, "completed", text, expected="B")
            for scorer in scorers:
                assert scorer.score(answer).status in ("scored", "error")
            assert judge.verdict(text, "0123456789abcdef").status in ("scored", "error")
            judge.request(answer)
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


# ---------------------------------------------------------------- Answer

def test_answer_from_a_results_record() -> None:
    record = {"id": "q1", "model": "writer", "sample": 2, "outcome": "completed",
              "reason": None, "text": "Paris", "finish_reason": "stop",
              "choices": [{"index": 0, "text": "Paris", "finish_reason": "stop",
                           "tool_calls": []}],
              "messages": [{"role": "system", "content": "Be brief."},
                           {"role": "user", "content": "Capital of France?"}],
              "expected": "Paris", "category": "geo", "tags": ["easy", 3]}
    a = Answer.from_record(record)
    assert (a.id, a.model, a.sample, a.outcome, a.text, a.finish_reason) == (
        "q1", "writer", 2, "completed", "Paris", "stop")
    assert (a.expected, a.category, a.tags) == ("Paris", "geo", ("easy",))
    assert a.question == "Capital of France?" and a.has_expected


def test_answer_absent_expected_is_not_null() -> None:
    a = Answer.from_record({"id": 1, "outcome": "completed", "text": "x"})
    assert a.expected is NO_EXPECTED and not a.has_expected and repr(a.expected) == (
        "NO_EXPECTED")
    b = Answer.from_record({"id": 1, "outcome": "completed", "text": "x", "expected": None})
    assert b.expected is None and b.has_expected


def test_answer_prompt_overrides_the_record() -> None:
    record = {"id": "q1", "outcome": "completed", "text": "Lyon", "expected": "Paris",
              "category": "old", "messages": [{"role": "user", "content": "old?"}]}
    prompt = {"id": "q1", "prompt": "Second city of France?", "system": "Be brief.",
              "expected": "Lyon", "tags": ["fixed"]}
    a = Answer.from_record(record, prompt)
    assert (a.expected, a.category, a.tags) == ("Lyon", "old", ("fixed",))
    assert a.messages[0] == {"role": "system", "content": "Be brief."}
    assert a.question == "Second city of France?"
    assert BUILTIN["exact"].score(a).passed is True
    keeps = Answer.from_record(record, {"id": "q1", "prompt": "x"})
    assert keeps.expected == "Paris"  # a prompt line without expected keeps the record's


def test_answer_from_a_sparse_or_odd_record() -> None:
    a = Answer.from_record({"outcome": "completed", "text": None, "sample": True,
                            "choices": [{"index": 0, "text": "from choice",
                                         "finish_reason": "length"}, "junk"]})
    assert (a.text, a.finish_reason, a.sample, len(a.choices)) == ("from choice", "length",
                                                                   0, 1)
    turns = Answer.from_record({"outcome": "completed", "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
        {"role": "user", "content": [{"type": "text", "text": "and"},
                                     {"type": "image_url", "image_url": {}}]}]})
    assert turns.question == "[user] hi\n[assistant] hello\n[user] and"


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                 max_size=3),
    max_leaves=8)
FIELDS = ("id", "model", "sample", "outcome", "reason", "text", "finish_reason", "choices",
          "messages", "expected", "category", "tags")
CALLS = st.lists(st.dictionaries(st.sampled_from(
    ("name", "arguments", "parsed", "valid_json", "parse_error", "schema_valid",
     "schema_errors")), JSON, max_size=7) | JSON, max_size=3)
CHOICES = st.lists(st.dictionaries(st.sampled_from(("index", "text", "finish_reason",
                                                    "tool_calls")),
                                   JSON | CALLS, max_size=4) | JSON, max_size=3)
RECORDS = st.dictionaries(st.sampled_from(FIELDS), JSON | st.just("completed"),
                          max_size=12).flatmap(
    lambda record: st.fixed_dictionaries({"choices": CHOICES}).map(
        lambda extra: {**record, **extra}))


@given(RECORDS, st.one_of(st.none(), RECORDS))
def test_any_record_makes_an_answer_every_builtin_can_score(record: dict[str, Any],
                                                            prompt: dict[str, Any] | None
                                                            ) -> None:
    record.setdefault("outcome", "completed")
    a = Answer.from_record(record, prompt)
    for scorer in BUILTIN.values():
        result = scorer.score(a)
        assert result.status in ("scored", "unscored", "error")
        assert "\n" not in result.explanation
    grader = make_scorer("j", "judge", {"model": "m"})
    assert isinstance(grader, JudgeScorer)
    assert [m["role"] for m in grader.request(a).messages] == ["system", "user"]


@pytest.mark.parametrize("choice", [
    {"tool_calls": 5, "text": 3}, {"tool_calls": "call"}, {"tool_calls": [1, None, "x"]},
    {"tool_calls": [{"name": ["x"], "parsed": 5, "valid_json": "yes", "schema_valid": 0,
                     "schema_errors": 7}]},
    {"index": "0", "finish_reason": {"a": 1}}, {"tool_calls": None, "text": None},
    {"tool_calls": [{"name": "get_weather", "valid_json": True, "schema_valid": False,
                     "schema_errors": 7}]},
    {"tool_calls": [{"name": "get_weather", "valid_json": False, "parse_error": {"x": 1}}]},
])
def test_odd_choices_are_scored_without_raising(choice: dict[str, Any]) -> None:
    record = {"outcome": "completed", "choices": [choice], "expected": "get_weather"}
    a = Answer.from_record(record)
    for kind in SIMPLE_OPTIONS:
        result = make_scorer(kind, kind, SIMPLE_OPTIONS[kind]).score(a)
        assert result.status in ("scored", "error")
    tool = make_scorer("t", "tool_call", {"all_calls": True}).score(a)
    assert tool.passed is not True
    grader = make_scorer("j", "judge", {"model": "m"})
    assert isinstance(grader, JudgeScorer)
    grader.request(a)


def test_score_values_are_checked() -> None:
    with pytest.raises(ValueError):
        Score("scored", 1.5, True, "x")
    with pytest.raises(ValueError):
        Score("scored", None, None, "x")
    with pytest.raises(ValueError):
        Score("error", 0.0, None, "x")
    assert Score("error", None, None, "two\nlines").explanation == "two lines"


# ---------------------------------------------------------------- sans-I/O

def test_scorers_and_judge_import_neither_trio_nor_httpx() -> None:
    # A fresh interpreter where trio and httpx cannot be imported, and the package's
    # __init__ (which imports the I/O layers) is skipped: the scorers must not care.
    package = Path(__file__).resolve().parents[2] / "fanout"
    script = textwrap.dedent(f"""
        import importlib.abc, sys, types

        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split('.')[0] in ('trio', 'httpx', 'httpcore', 'anyio'):
                    raise ImportError('blocked: ' + name)
                return None

        sys.meta_path.insert(0, Block())
        stub = types.ModuleType('fanout')
        stub.__path__ = [{str(package)!r}]
        sys.modules['fanout'] = stub
        import fanout.eval.scorers as scorers, fanout.eval.judge as judge
        answer = scorers.Answer('q1', 'm', 0, 'completed', 'Answer: B', expected='b')
        assert scorers.BUILTIN['choice'].score(answer).passed is True
        grader = scorers.make_scorer('j', 'judge', {{'model': 'judge'}})
        assert grader.verdict('VERDICT 0123456789abcdef: PASS', '0123456789abcdef').passed
        assert grader.verdict('GRADE: PASS', '0123456789abcdef').status == 'error'
        loaded = sorted(m for m in sys.modules
                        if m.split('.')[0] in ('trio', 'httpx', 'httpcore', 'anyio'))
        print(loaded)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_judge_kind_is_a_judge_scorer() -> None:
    scorer = make_scorer("j", "judge", {"model": "judge"})
    assert isinstance(scorer, JudgeScorer) and isinstance(scorer, Scorer)
