"""Scorers: how an answer is graded against its prompt's expected value.  Sans-I/O.

A scorer is made once from its config (``make_scorer(name, kind, options)``,
which checks every option and fails with a one-line ``ValueError``) and then
grades answers: ``scorer.score(Answer) -> Score``.  Every kind follows the same
rules: an answer whose stream did not complete is ``unscored`` (never a
failure of the model); a kind that needs ``expected`` gives an ``error`` score
when the prompt has none; ``threshold`` (default 1.0) sets the value at which a
score passes; ``key`` is a stable hash of the kind and its options (defaults
filled in), so a changed scorer is rescored and an unchanged one is not.

The kinds (each class's docstring has its options and surprising cases):

=============  ==========================================================
``exact``      the answer equals ``expected`` (normalisation options)
``includes``   the answer contains ``expected`` (``mode`` any / all)
``regex``      ``pattern`` matches; with ``expected``, its ``group`` equals it
``numeric``    the answer's last (first, only) number is ``expected`` ± tolerance
``choice``     the answer's letter (A/B/C/D) is ``expected``
``json``       the answer is JSON, valid against ``schema``, equal to ``expected``
``tool_call``  the expected tool was called with valid (and expected) arguments
``finish``     the finish reason is ``allowed`` (``length`` fails)
``python``     ``module:function`` decides
``judge``      a model decides (``fanout.eval.judge``; run by the pipeline)
=============  ==========================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, Protocol, runtime_checkable

from ._match import Choice, Exact, Includes, Numeric, Regex
from ._structured import Finish, Json, Python, ToolCall
from ._values import NO_EXPECTED, Answer, Score
from .judge import JudgeScorer

__all__ = ["BUILTIN", "KINDS", "NO_EXPECTED", "Answer", "Score", "Scorer", "make_scorer"]


@runtime_checkable
class Scorer(Protocol):
    """What every scorer has: ``name`` (the config's), ``kind``, ``key`` (a stable hash
    of the kind and its checked options), ``threshold``, and ``score``."""

    name: str
    kind: str
    key: str
    threshold: float

    def score(self, answer: Answer) -> Score:
        """The answer's score.  Never raises for any answer (a judge scorer raises
        ``TypeError``: it needs I/O)."""
        ...


KINDS: Final = ("exact", "includes", "regex", "numeric", "choice", "json", "tool_call",
                "finish", "python", "judge")

_SIMPLE: Final[Mapping[str, Any]] = {
    "exact": Exact, "includes": Includes, "regex": Regex, "numeric": Numeric,
    "choice": Choice, "tool_call": ToolCall, "finish": Finish, "judge": JudgeScorer,
}


def make_scorer(name: str, kind: str, options: Mapping[str, Any] | None = None, *,
                base_dir: Path | None = None) -> Scorer:
    """The scorer ``kind`` with ``options`` (a config table), checked now.

    ``base_dir``: where ``schema_file`` paths and ``python`` modules are found (the
    config file's directory).  Raises ``ValueError`` with one line naming the
    option and the value at fault (``option 'tolerance': must be a number >= 0,
    not 'abc'``); the config prefixes it with the scorer's name.
    """
    options = {} if options is None else options
    if kind == "json":
        return Json(name, options, base_dir)
    if kind == "python":
        return Python(name, options, base_dir)
    factory = _SIMPLE.get(kind)
    if factory is None:
        raise ValueError(f"unknown scorer kind {kind!r} (known: {', '.join(KINDS)})")
    scorer: Scorer = factory(name, options)
    return scorer


#: Ready-made scorers with their default options, for ``--score NAME`` without a config.
BUILTIN: Final[Mapping[str, Scorer]] = {
    kind: make_scorer(kind, kind, {})
    for kind in ("exact", "includes", "numeric", "choice", "json", "finish", "tool_call")
}
