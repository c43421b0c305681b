"""The compare views' text: what is removed, replaced, measured, wrapped and how the summary fits."""

from __future__ import annotations

import io
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console
from rich.text import Text

from fanout import ChoiceResult, Outcome, StreamResult, TextDelta, Usage
from fanout.cli.render import (
    Column,
    CompareView,
    cells,
    collapse_blank_lines,
    inert,
    summary_table,
    wrap,
)
from fanout.core.result import Timings
from tests.cli.test_views_terminal import wcwidth


@pytest.mark.parametrize(("raw", "shown"), [
    ("lone \ud800 high, \udfff low", "lone \ufffd high, \ufffd low"),
    ("\ud83d\ude00 a pair split across deltas", "😀 a pair split across deltas"),
    ("line\u2028separator\u2029paragraph", "line\nseparator\nparagraph"),
    ("zero\u200bwidth \u200eLRM\u200fRLM \u061cALM \ufeffBOM \u2060WJ soft\u00adhyphen",
     "zerowidth LRMRLM ALM BOM WJ softhyphen"),
    ("tag\U000e0041\U000e0042s", "tags"),
    ("kept: 👨\u200d👩\u200d👧 ZWJ, ✍\ufe0f VS16, मी\u200cन ZWNJ",
     "kept: 👨\u200d👩\u200d👧 ZWJ, ✍\ufe0f VS16, मी\u200cन ZWNJ"),
    ("c1 \x85\x9c\x9d and csi \x9b31m", "c1  and csi "),
])
def test_inert_replaces_removes_and_keeps(raw: str, shown: str) -> None:
    assert inert(raw) == shown
    inert(raw).encode("utf-8")  # always encodable


def test_runs_of_blank_lines_collapse() -> None:
    assert collapse_blank_lines("a" + "\n" * 10_000 + "b") == "a\n\nb"
    assert collapse_blank_lines("a\n\nb\n \n\t\n\nc") == "a\n\nb\n\nc"
    assert collapse_blank_lines("a\nb") == "a\nb"


@pytest.mark.parametrize(("text", "at_least"), [
    ("नदी के किनारे एक छोटा सा गाँव था।", 24),  # the vowel signs take a cell on wcwidth terminals
    ("pencil ✍️ sun ☀️", 16),  # VS16 emoji: two cells on emoji terminals
    ("東京の朝", 8),
    ("plain", 5),
])
def test_cells_is_the_most_a_terminal_draws(text: str, at_least: int) -> None:
    assert cells(text) >= at_least
    assert cells(text) >= sum(wcwidth(c) for c in text)
    from rich.cells import cell_len
    assert cells(text) >= cell_len(text)


@given(st.text(alphabet=st.sampled_from(list("ab cdé \u093f\u0915\u0902東✍\ufe0f👍\u200d-\t")),
               max_size=200), st.integers(min_value=1, max_value=40))
def test_no_wrapped_line_is_wider_than_its_width(text: str, width: int) -> None:
    lines = wrap(Text(text), width)
    assert all(cells(line.plain) <= max(width, 2) for line in lines)
    # Nothing is lost but the spaces at the breaks.
    assert "".join(line.plain for line in lines).replace(" ", "") == \
        text.expandtabs(8).replace(" ", "").replace("\n", "") or "\t" in text


def _columns() -> list[Column]:
    columns = []
    for i, (key, usage) in enumerate([("writer", Usage(12, 65, 77)), ("thinker", Usage(12, 60, 72)),
                                      ("tools", Usage(12, 14, 26)), ("smollm2", None)]):
        column = Column(key, f"mock/{key}", started=0.0)
        result = StreamResult(
            Outcome.COMPLETED if i != 3 else Outcome.TRUNCATED,
            choices=(ChoiceResult(0, text="x" * 1577, finish_reason="length" if i else "stop"),),
            usage=usage, reason=None if i != 3 else "the connection broke after 412 events "
                                                   "without [DONE]",
            timings=Timings(queued=0.1234, first_request_sent=0.0, request_sent=0.0,
                            first_content=0.2871, last_event=4.9612, end=4.9612),
            content_events=412)
        column.finish(result, 5.0)
        columns.append(column)
    return columns


@pytest.mark.parametrize("width", [60, 80, 100, 160])
def test_the_summary_fits_with_every_number_whole(width: int) -> None:
    out = Console(file=io.StringIO(), width=width, record=True, force_terminal=True)
    out.print(summary_table(_columns(), 5.0, width=width))
    lines = out.export_text().splitlines()
    assert max(len(line.rstrip()) for line in lines) <= width
    text = "\n".join(lines)
    for number in ("287ms", "14", "13", "3", "≈88", "12", "65", "60", "123ms", "4.96s"):
        assert re.search(rf"(?<![\w.≈]){re.escape(number)}(?![\w.])", text), (number, text)
    assert "…" not in text
    # Unknown is not zero: no usage, no tokens.
    assert re.search(r" smollm2 .*≈88 +- +- ", text)  # tokens in and out


def test_the_widest_summary_lines() -> None:
    widest = {}
    for width in (60, 80):
        out = Console(file=io.StringIO(), width=width, record=True)
        out.print(summary_table(_columns(), 5.0, width=width))
        widest[width] = max(len(line.rstrip()) for line in out.export_text().splitlines())
    assert widest[60] <= 60 and widest[80] <= 80


def test_the_final_screen_collapses_blank_lines_and_caps_each_column() -> None:
    column = Column("m", "m", started=0.0)
    column.apply(TextDelta(0, "top" + "\n" * 10_000 + "bottom"), 0.1)
    out = Console(file=io.StringIO(), width=60, height=20, record=True, force_terminal=True)
    out.print(CompareView([column]).final(out, 0.2))
    lines = out.export_text().splitlines()
    assert len(lines) < 12 and any("bottom" in line for line in lines)
    full = Console(file=io.StringIO(), width=60, height=20, record=True, force_terminal=True)
    full.print(CompareView([column], full=True).final(full, 0.2))
    assert len(full.export_text().splitlines()) < 12  # blank runs collapse in --full too


def test_the_live_view_never_draws_a_line_wider_than_the_terminal() -> None:
    column = Column("m", "m", started=0.0)
    column.apply(TextDelta(0, "नदी के किनारे एक छोटा सा गाँव था। ✍️ ☀️ " * 20), 0.1)
    other = Column("o", "o", started=0.0)
    other.apply(TextDelta(0, "東京の朝は静かで " * 30), 0.1)
    for width in (40, 60, 80, 100):
        out = Console(file=io.StringIO(), width=width, height=30, record=True,
                      force_terminal=True)
        out.print(CompareView([column, other]).live(out, 0.2))
        for line in out.export_text().splitlines():
            assert cells(line) <= width, (width, line)
