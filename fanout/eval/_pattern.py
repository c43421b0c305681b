"""A scorer's side of user patterns: ``fanout.core.patterns`` matches them within a
time limit; a match that times out becomes the answer's ``error`` score."""

from __future__ import annotations

from ..core.patterns import (
    FLAGS,
    Deadline,
    LimitedValidator,
    PatternError,
    PatternTimeout,
    check_schema_patterns,
    compile_pattern,
)
from ._options import DEFAULT_TIMEOUT, REGEX_TIMEOUT
from ._values import Score, quote

__all__ = ["DEFAULT_TIMEOUT", "FLAGS", "REGEX_TIMEOUT", "Deadline", "LimitedValidator",
           "PatternError", "PatternTimeout", "check_schema_patterns", "compile_pattern",
           "timed_out"]


def timed_out(scorer: str, exc: PatternTimeout) -> Score:
    """The ``error`` score of an answer whose match timed out, naming the scorer."""
    return Score.error(f"regex timed out after {exc.seconds:g} s (scorer {scorer!r}, "
                       f"pattern {quote(exc.pattern, 40)})")
