"""The structured kinds: ``json``, ``tool_call``, ``finish``, and ``python`` for the rest."""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import math
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
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
    show,
    string,
    strings,
    table,
)
from ._pattern import (
    Deadline,
    LimitedValidator,
    PatternError,
    PatternTimeout,
    check_schema_patterns,
    timed_out,
)
from ._text import find_json, first_difference, json_equal, json_subset
from ._values import Answer, Score, quote, show_expected, tool_calls

__all__ = ["Finish", "Json", "Python", "ToolCall"]


def _schema(value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError("must be a table (a JSON Schema)")
    return dict(value)


def _check_schema(schema: Mapping[str, Any], option: str, where: str = "") -> None:
    import jsonschema  # only a scorer with a schema needs it

    try:
        jsonschema.validators.validator_for(schema).check_schema(dict(schema))
    except jsonschema.exceptions.SchemaError as exc:
        at = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        raise ValueError(f"option {option!r}: not a valid JSON Schema{where}: at {at}: "
                         f"{exc.message}") from None
    try:
        check_schema_patterns(schema)
    except ValueError as exc:
        raise ValueError(f"option {option!r}{where}: {exc}") from None


def _schema_errors(value: Any, validator: LimitedValidator, deadline: Deadline) -> list[str]:
    errors = sorted(validator.errors(value, deadline), key=lambda e: [str(p) for p in e.path])
    return [f"{'/'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}"
            for e in errors]


class Json(ScorerBase):
    """``json``: the answer is JSON, valid against a schema, equal to ``expected``.

    ``fenced`` (default true): a fenced block (```` ```json ````) is the answer's
    JSON when there is one (``_text.find_json``).  ``schema`` (an inline table) or
    ``schema_file`` (a path, relative to the config's directory, read when the
    scorer is made) is a JSON Schema checked when the scorer is made (a bad one is
    a config error; its dialect from ``$schema``, else the latest); the answer must
    be valid against it.  With ``expected``: equal as JSON values (``1 == 1.0``,
    ``true != 1``), or with ``subset`` true, contained (every key of an expected
    object present with a contained value; arrays equal).  A changed schema file
    changes the scorer's key.  The schema's ``pattern`` and ``patternProperties`` are
    matched within ``regex_timeout`` seconds per answer (default 1; past it, an
    ``error`` score: ``regex timed out after 1 s``); a schema that combines
    ``unevaluatedProperties`` with ``patternProperties`` is refused (jsonschema would
    match those patterns itself, with no limit).
    """

    kind = "json"
    OPTIONS = (Option("fenced", True, boolean), Option("schema", None, _schema),
               Option("schema_file", None, string()), Option("subset", False, boolean),
               THRESHOLD, REGEX_TIMEOUT)

    def __init__(self, name: str, options: Mapping[str, Any], base_dir: Path | None = None
                 ) -> None:
        checked = check_options(options, self.OPTIONS)
        schema = checked["schema"]
        if schema is not None and checked["schema_file"] is not None:
            raise ValueError("options 'schema' and 'schema_file': give one, not both")
        if schema is not None:
            _check_schema(schema, "schema")
        elif checked["schema_file"] is not None:
            schema = _load_schema(checked["schema_file"], base_dir)
        self.schema: dict[str, Any] | None = schema
        self.validator = LimitedValidator(schema) if schema is not None else None
        super().__init__(name, checked, key_extra={"schema": schema})

    def grade(self, answer: Answer) -> Score:
        found = find_json(answer.text, self.options["fenced"])
        if not found.ok:
            return self.passfail(False, f"{found.where} is not JSON: {found.problem}")
        passes = [f"{found.where} is JSON"]
        if self.validator is not None:
            try:
                errors = _schema_errors(found.value, self.validator,
                                        Deadline(self.options["regex_timeout"]))
            except PatternTimeout as exc:
                return timed_out(self.name, exc)
            except PatternError as exc:
                return Score.error(str(exc))
            if errors:
                more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
                return self.passfail(False, f"not valid against the schema: "
                                    f"{errors[0][:100]}{more}")
            passes.append("valid against the schema")
        if answer.has_expected:
            subset = self.options["subset"]
            same = (json_subset if subset else json_equal)(answer.expected, found.value)
            if not same:
                difference = first_difference(answer.expected, found.value, subset)
                return self.passfail(False, f"differs from expected: {difference}")
            passes.append("contains expected" if subset else "equals expected")
        return self.passfail(True, ", ".join(passes))


def _load_schema(name: str, base_dir: Path | None) -> dict[str, Any]:
    path = Path(name)
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"option 'schema_file': no such file: {str(path)!r}") from None
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ValueError(f"option 'schema_file': cannot read {str(path)!r}: {why}") from None
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"option 'schema_file': {str(path)!r} line {exc.lineno} column "
                         f"{exc.colno}: not JSON: {exc.msg}") from None
    if not isinstance(schema, dict):
        raise ValueError(f"option 'schema_file': {str(path)!r} is not a JSON object")
    _check_schema(schema, "schema_file", f" in {str(path)!r}")
    return schema


def _expected_call(expected: Any) -> tuple[str, Mapping[str, Any] | None] | str:
    """(name, arguments or None) of an expected tool call, or what is wrong with it."""
    if isinstance(expected, str) and expected:
        return expected, None
    if isinstance(expected, Mapping) and isinstance(expected.get("name"), str) and set(
            expected) <= {"name", "arguments"}:
        arguments = expected.get("arguments")
        if arguments is None or isinstance(arguments, Mapping):
            return expected["name"], arguments
    return ('expected must be a tool name or {"name": ..., "arguments": {...}}, not '
            + show_expected(expected))


class ToolCall(ScorerBase):
    """``tool_call``: the answer calls the expected tool, with valid arguments.

    ``expected`` (optional): a tool name, or ``{"name": ..., "arguments": {...}}``
    whose argument values must match the call's (``arguments = "subset"``, the
    default: the expected ones present and equal, others allowed; ``"exact"``:
    the same object).  Without ``expected``, any tool will do.  The call's
    arguments must be JSON (``valid_json``) and valid against the request's tool
    schema (``schema_valid``, as checked when the answer streamed); a call with no
    known schema (``schema_valid`` null) passes with that said, or fails with
    ``require_schema``.  ``choice`` (default 0): which choice's calls.  The first
    call with the expected name is scored; with ``all_calls``, every call of the
    choice must pass.
    """

    kind = "tool_call"
    OPTIONS = (Option("choice", 0, number(0, integer=True)),
               Option("all_calls", False, boolean),
               Option("arguments", "subset", one_of("subset", "exact")),
               Option("require_schema", False, boolean), THRESHOLD)

    def __init__(self, name: str, options: Mapping[str, Any]) -> None:
        super().__init__(name, check_options(options, self.OPTIONS))

    def grade(self, answer: Answer) -> Score:
        wanted: tuple[str, Mapping[str, Any] | None] | None = None
        if answer.has_expected:
            parsed = _expected_call(answer.expected)
            if isinstance(parsed, str):
                return Score.error(parsed)
            wanted = parsed
        index = self.options["choice"]
        choice = next((c for c in answer.choices if c.get("index", -1) == index), None)
        if choice is None and index < len(answer.choices):
            choice = answer.choices[index]
        if choice is None:
            return self.passfail(False, f"no choice {index} in the answer")
        calls = tool_calls(choice)
        if not calls:
            return self.passfail(False, f"no tool call in choice {index}"
                                + (f" (text {quote(str(choice.get('text') or ''), 40)})"
                                   if choice.get("text") else ""))
        if self.options["all_calls"]:
            for call in calls:
                problem = self._problem(call, wanted)
                if problem:
                    return self.passfail(False, f"call {_name(call)}: {problem}")
            return self.passfail(True, f"all {len(calls)} calls pass"
                                + self._note(calls))
        name = wanted[0] if wanted else None
        candidates = [c for c in calls if name is None or c.get("name") == name]
        if not candidates:
            names = ", ".join(_name(c) for c in calls[:4])
            return self.passfail(False, f"no call of {quote(name or '')}: called {names}")
        problem = self._problem(candidates[0], wanted)
        if problem:
            return self.passfail(False, f"call {_name(candidates[0])}: {problem}")
        return self.passfail(True, f"called {_name(candidates[0])}" + self._note(candidates[:1]))

    def _problem(self, call: Mapping[str, Any], wanted: tuple[str, Mapping[str, Any] | None]
                 | None) -> str:
        if wanted is not None and call.get("name") != wanted[0]:
            return f"not {quote(wanted[0])}"
        if call.get("valid_json") is False or ("valid_json" not in call
                                               and call.get("parsed") is None):
            why = call.get("parse_error") or "not JSON"
            return f"arguments are not valid JSON ({str(why)[:80]})"
        if call.get("schema_valid") is False:
            errors = call.get("schema_errors")
            first = errors[0] if isinstance(errors, list | tuple) and errors else "invalid"
            return f"arguments not valid against the tool's schema: {str(first)[:100]}"
        if call.get("schema_valid") is None and self.options["require_schema"]:
            return "no schema known for this tool (require_schema)"
        if wanted is not None and wanted[1] is not None:
            arguments = call.get("parsed")
            subset = self.options["arguments"] == "subset"
            if not isinstance(arguments, Mapping) or not (
                    json_subset if subset else json_equal)(dict(wanted[1]), arguments):
                return "arguments differ: " + first_difference(
                    dict(wanted[1]), arguments, subset, "arguments")
        return ""

    @staticmethod
    def _note(calls: list[Mapping[str, Any]]) -> str:
        if any(c.get("schema_valid") is None for c in calls):
            return " (no schema known: arguments checked as JSON only)"
        return ""


def _name(call: Mapping[str, Any]) -> str:
    return quote(str(call.get("name") or "(no name)"), 40)


class Finish(ScorerBase):
    """``finish``: the finish reason is one of ``allowed`` (default ``["stop",
    "tool_calls"]``: ``length`` and ``content_filter`` fail).  Choice 0's, or with
    ``all_choices`` every choice's."""

    kind = "finish"
    OPTIONS = (Option("allowed", ("stop", "tool_calls"), strings()),
               Option("all_choices", False, boolean), THRESHOLD)

    def __init__(self, name: str, options: Mapping[str, Any]) -> None:
        super().__init__(name, check_options(options, self.OPTIONS))
        self.allowed: tuple[str, ...] = tuple(self.options["allowed"])

    def grade(self, answer: Answer) -> Score:
        reasons = ([c.get("finish_reason") for c in answer.choices]
                   if self.options["all_choices"] and answer.choices
                   else [answer.finish_reason])
        allowed = ", ".join(self.allowed)
        for index, reason in enumerate(reasons):
            if reason not in self.allowed:
                which = f"choice {index} " if len(reasons) > 1 else ""
                shown = quote(reason, 30) if isinstance(reason, str) else "none"
                return self.passfail(False, f"{which}finish reason {shown} not in {allowed}")
        return self.passfail(True, f"finish reason {', '.join(str(r) for r in reasons)}")


def _function_spec(value: Any) -> str:
    if (not isinstance(value, str) or value.count(":") != 1
            or not all(part.strip() for part in value.split(":"))):
        raise ValueError("must be 'module:function'")
    return value


class Python(ScorerBase):
    """``python``: ``function = "module:function"``, called with the ``Answer``.

    The module is imported when the scorer is made (an import error is a config
    error naming the spec), with the config's directory first on ``sys.path``
    during the import, so a module beside the config works.  ``args`` (a table) is
    passed as keyword arguments.  The function returns a bool (pass or fail), a
    number in [0, 1], a ``Score``, or ``(value, explanation)``.  An exception is an
    ``error`` score with its one-line message (never a traceback); a value outside
    [0, 1], NaN, or anything else returned is an ``error`` too (``SystemExit`` included:
    a function's ``sys.exit`` ends its score, not the run; Ctrl-C still stops the run).
    The module file's content is part of the scorer's key: editing the function rescores.
    """

    kind = "python"
    OPTIONS = (Option("function", None, _function_spec), Option("args", {}, table),
               THRESHOLD)

    def __init__(self, name: str, options: Mapping[str, Any], base_dir: Path | None = None
                 ) -> None:
        checked = check_options(options, self.OPTIONS)
        spec = checked["function"]
        if spec is None:
            raise ValueError("option 'function': required ('module:function')")
        self.function, source = _import(spec, base_dir)
        self.args: dict[str, Any] = checked["args"]
        super().__init__(name, checked, key_extra={"source": source})

    def grade(self, answer: Answer) -> Score:
        try:
            result = self.function(answer, **self.args)
        except (Exception, SystemExit) as exc:  # a scorer's sys.exit is its answer's error
            return Score.error(f"{self.options['function']} raised {_one_line(exc)}")
        return self._convert(result)

    def _convert(self, result: Any) -> Score:
        spec = self.options["function"]
        explanation = f"{spec} returned {show(result)}"
        if isinstance(result, Score):
            if result.status == "scored" and result.value is not None:
                return self.scored(result.value, result.explanation)
            return result
        if isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], str):
            result, explanation = result
        if isinstance(result, bool):
            return self.passfail(result, explanation)
        if isinstance(result, int | float):
            if math.isnan(result) or not 0 <= result <= 1:
                return Score.error(f"{spec} returned {show(result)}: not in [0, 1]")
            return self.scored(result, explanation)
        return Score.error(f"{spec} returned {type(result).__name__}: expected a bool, a "
                           f"number in [0, 1], a Score or (value, explanation)")


def _one_line(exc: BaseException) -> str:
    message = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {message[0]}" if message else type(exc).__name__
    return text if len(text) <= 200 else text[:200] + "…"


def _import(spec: str, base_dir: Path | None) -> tuple[Callable[..., Any], str]:
    """The function ``spec`` names, and a hash-worthy identity of its module's source."""
    module_name, _, function_name = spec.partition(":")
    added = base_dir is not None and str(base_dir) not in sys.path
    if added:
        sys.path.insert(0, str(base_dir))
    try:
        module = importlib.import_module(module_name.strip())
    except Exception as exc:
        raise ValueError(f"option 'function': cannot import {spec!r}: {_one_line(exc)}"
                         ) from None
    finally:
        if added:
            sys.path.remove(str(base_dir))
    function = getattr(module, function_name.strip(), None)
    if function is None or not callable(function):
        raise ValueError(f"option 'function': module {module_name!r} has no function "
                         f"{function_name!r}")
    try:
        source = inspect.getsource(module)
    except (OSError, TypeError):
        source = ""
    return function, hashlib.sha256(source.encode()).hexdigest()[:16]
