"""``python`` scorer functions for the scorer tests (imported by ``module:function``)."""

from __future__ import annotations

from typing import Any

from fanout.eval.scorers import Answer, Score


def is_x(answer: Answer) -> bool:
    return answer.text == "x"


def half(answer: Answer) -> float:
    return 0.5


def explained(answer: Answer) -> tuple[float, str]:
    return 0.25, "a quarter of the way"


def a_score(answer: Answer) -> Score:
    return Score("scored", 0.5, True, "made by hand")


def an_error_score(answer: Answer) -> Score:
    return Score("error", None, None, "could not tell")


def with_args(answer: Answer, factor: float = 1.0) -> float:
    return factor


def raises(answer: Answer) -> float:
    scores: dict[str, float] = {}
    return scores["missing"]


def raises_multiline(answer: Answer) -> float:
    raise ValueError("first line\nTraceback (most recent call last): second line")


def exits(answer: Answer) -> float:
    raise SystemExit(3)


def too_big(answer: Answer) -> float:
    return 1.5


def negative(answer: Answer) -> float:
    return -0.1


def nan(answer: Answer) -> float:
    return float("nan")


def nothing(answer: Answer) -> None:
    return None


def a_string(answer: Answer) -> Any:
    return "yes"
