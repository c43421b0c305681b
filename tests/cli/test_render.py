"""The compare view, driven with a recording console: no terminal, no network."""

from __future__ import annotations

import io

import attrs
import pytest
from rich.console import Console
from rich.text import Text

from fanout import (
    ChoiceFinished,
    Flag,
    Outcome,
    ReasoningDelta,
    StreamFinished,
    StreamRetrying,
    StreamStarted,
    TextDelta,
    ToolCallDelta,
    UsageReported,
    parse_stream,
)
from fanout.cli.render import (
    FINISH_STYLES,
    STATUS_STYLES,
    Column,
    CompareView,
    inert,
    summary_table,
)
from fanout.core.parser import StreamParser
from fanout.core.result import StreamError, StreamResult, Usage
from tests.helpers import sse_body

EVIL = "[bold red]not markup[/bold red] :smile: \x1b[2J\x1b]0;pwned\x07\x1b[31mred\x9b1m\r\x07!"


def console(width: int = 120, height: int = 30) -> Console:
    return Console(file=io.StringIO(), width=width, height=height, force_terminal=True,
                   color_system="truecolor", record=True, legacy_windows=False)


@pytest.mark.parametrize(("raw", "shown"), [
    ("plain text, unicode ✓ 👍", "plain text, unicode ✓ 👍"),
    ("tab\tand\nnewline", "tab\tand\nnewline"),
    ("a\r\nb\rc", "a\nb\nc"),
    ("\x1b[31mred\x1b[0m", "red"),
    ("\x1b[38;2;255;0;0mrgb", "rgb"),
    ("title\x1b]0;pwned\x07 done", "title done"),
    ("link \x1b]8;;http://evil\x1b\\x\x1b]8;;\x1b\\", "link x"),
    ("\x9b2Jeight-bit", "eight-bit"),
    ("bell\x07 nul\x00 del\x7f c1\x85", "bell nul del c1"),
    ("\x1bcreset \x1b7save", "reset save"),
    ("abc\u202edcba\u2066x\u2069", "abcdcbax"),
    ("[bold]stays[/bold]", "[bold]stays[/bold]"),
])
def test_inert(raw: str, shown: str) -> None:
    assert inert(raw) == shown


def finished(column: Column, body: bytes, now: float = 2.0) -> StreamResult:
    result = parse_stream([body])
    column.finish(result, now)
    return result


def test_a_column_follows_its_stream() -> None:
    column = Column("fast", "mock/fast", started=0.0)
    assert column.status == "queued"
    assert column.queued(0.04) == pytest.approx(0.04) and column.time(0.04) is None
    column.slot_taken(0.05)  # the request goes out now: TTFT and time count from here
    assert column.status == "connecting"
    column.apply(StreamStarted(attempt=1, status=200), 0.1)
    column.slot_taken(0.1)  # only ever from queued, and the first time counts
    assert column.status == "waiting"
    column.apply(ReasoningDelta(0, "hmm "), 0.2)
    column.apply(TextDelta(0, "Hello"), 0.3)
    column.apply(TextDelta(0, " world"), 0.5)
    assert column.status == "streaming"
    assert column.ttft() == pytest.approx(0.15)
    assert column.queued(0.6) == pytest.approx(0.05) and column.time(0.6) == pytest.approx(0.55)
    assert column.rate(0.6) == (None, True)  # 3 content events: too few for a rate
    column.apply(TextDelta(0, "!"), 0.6)
    rate, estimated = column.rate(0.6)
    assert estimated and rate == pytest.approx(3 / 0.4)
    column.apply(ToolCallDelta(0, 0, "c1", "function", "lookup", '{"q":'), 0.6)
    column.apply(ToolCallDelta(0, 0, None, None, None, ' "x"}'), 0.7)
    column.apply(ChoiceFinished(0, "length"), 0.8)
    column.apply(UsageReported(Usage(3, 4, 7)), 0.8)
    assert column.completion_tokens == 4
    choice = column.choices[0]
    assert choice.order == ["reasoning", "text", "tool:0"]
    assert "".join(choice.text) == "Hello world!"
    assert choice.tools[0].name == "lookup" and choice.tools[0].arguments == '{"q": "x"}'
    assert column.finish_reasons() == ["length"]


def test_retries_show_in_the_column() -> None:
    column = Column("m", "m", started=0.0)
    column.apply(StreamRetrying(1, 0.5, StreamError("HTTP 429: slow down", status=429)), 0.1)
    assert column.status == "retrying" and column.retries == 1
    view = CompareView([column])
    assert "retried 1x" in view.header(column, 0.2).plain
    assert "retrying: HTTP 429: slow down" in view.body(column).plain


@pytest.mark.parametrize(("outcome_body", "status"), [
    (sse_body({"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]}),
     "done"),
    (sse_body({"choices": [{"index": 0, "delta": {"content": "hi"}}]}, done=False), "truncated"),
    (sse_body({"error": {"message": "boom"}}, done=False), "error"),
])
def test_final_status_labels(outcome_body: bytes, status: str) -> None:
    column = Column("m", "m", started=0.0)
    finished(column, outcome_body)
    assert column.status == status
    header = CompareView([column]).header(column, 3.0)
    assert f" {status} " in header.plain
    styles = [str(span.style) for span in header.spans
              if header.plain[span.start:span.end].strip() == status]
    assert styles == [STATUS_STYLES[status]]


def test_timed_out_and_cancelled_labels() -> None:
    column = Column("m", "m", started=0.0)
    parser = StreamParser()
    parser.feed(sse_body({"choices": []}, done=False))
    column.finish(parser.result(outcome=Outcome.TIMED_OUT, timed_out="idle"), 1.0)
    assert column.status == "timed out (idle)"
    other = Column("n", "n", started=0.0)
    other.finish(StreamParser().result(outcome=Outcome.CANCELLED), 1.0)
    assert other.status == "cancelled"
    text = CompareView([column, other]).footer(1.0).plain
    assert "1 timed out" in text and "1 cancelled" in text


def test_length_and_content_filter_never_look_like_stop() -> None:
    view_columns = []
    for reason in ("stop", "length", "content_filter", "tool_calls"):
        column = Column(reason, "m", started=0.0)
        body = sse_body({"choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": reason}]})
        finished(column, body)
        view_columns.append(column)
    view = CompareView(view_columns)
    styles = {}
    for column in view_columns:
        header = view.header(column, 3.0)
        reason = column.key
        start = header.plain.rindex(reason)
        styles[reason] = {str(s.style) for s in header.spans
                          if s.start <= start < s.end}
    assert styles["length"] == {FINISH_STYLES["length"]}
    assert styles["content_filter"] == {FINISH_STYLES["content_filter"]}
    assert styles["length"] != styles["stop"] and styles["content_filter"] != styles["stop"]
    # And in the summary table, the same.
    out = console()
    out.print(summary_table(view_columns, 3.0))
    exported = out.export_text()
    assert all(reason in exported for reason in ("stop", "length", "content_filter"))


def test_a_missing_finish_reason_is_flagged() -> None:
    column = Column("m", "m", started=0.0)
    finished(column, sse_body({"choices": [{"index": 0, "delta": {"content": "x"}}]}))
    header = CompareView([column]).header(column, 3.0)
    assert header.plain.endswith("finish none") or "finish none" in header.plain


def test_model_output_is_inert_on_the_terminal() -> None:
    column = Column("m", "m", started=0.0)
    column.apply(TextDelta(0, EVIL), 0.1)
    column.apply(ReasoningDelta(0, "[link=http://x]r[/link]"), 0.1)
    out = console()
    out.print(CompareView([column]).live(out, 0.2))
    out.print(CompareView([column]).final(out, 0.2))
    raw = out.file.getvalue()  # type: ignore[attr-defined]
    text = out.export_text()
    assert "[bold red]not markup[/bold red]" in text
    assert ":smile:" in text and "😄" not in text
    assert "[link=http://x]r[/link]" in text
    for sequence in ("\x1b[2J", "\x1b]0;pwned", "\x9b", "\x07", "\r"):
        assert sequence not in raw
    assert "\x1b]8;" not in raw  # no hyperlink from the [link] tag


def test_columns_side_by_side_with_their_headers() -> None:
    columns = [Column(f"model-{i}", f"vendor/m{i}", started=0.0) for i in range(3)]
    for i, column in enumerate(columns):
        column.apply(StreamStarted(1, 200), 0.1)
        column.apply(TextDelta(0, f"answer number {i}"), 0.2)
    out = console(width=120)
    out.print(CompareView(columns).live(out, 0.5))
    lines = out.export_text().splitlines()
    header = next(line for line in lines if "model-0" in line)
    assert "model-1" in header and "model-2" in header  # one row, three columns
    assert any("answer number 0" in line and "answer number 2" in line for line in lines)
    assert "3 streaming" in lines[-1]


def test_many_models_wrap_into_rows() -> None:
    columns = [Column(f"m{i}", f"m{i}", started=0.0) for i in range(6)]
    out = console(width=80)
    out.print(CompareView(columns).live(out, 0.0))
    lines = out.export_text().splitlines()
    assert not any("m0" in line and "m3" in line for line in lines)  # 2 per row at 80 columns


def test_live_columns_scroll_and_the_final_screen_shows_everything() -> None:
    column = Column("m", "m", started=0.0)
    lines = [f"line {n:03}" for n in range(200)]
    column.apply(TextDelta(0, "\n".join(lines)), 0.1)
    out = console(width=60, height=20)
    out.print(CompareView([column]).live(out, 0.2))
    live = out.export_text()
    assert "line 199" in live and "line 000" not in live
    assert len(live.splitlines()) <= 20
    out = console(width=60, height=20)
    out.print(CompareView([column]).final(out, 0.2))
    final = out.export_text()  # at most FINAL_LINES lines of a column, then what is left
    assert all(line in final for line in lines[:99]) and "line 099" not in final
    assert "⋯ 101 more lines (--full shows everything)" in final
    out = console(width=60, height=20)
    out.print(CompareView([column], full=True).final(out, 0.2))
    final = out.export_text()
    assert all(line in final for line in lines)


def test_tool_calls_are_pretty_printed_once_complete() -> None:
    column = Column("m", "m", started=0.0)
    column.apply(ToolCallDelta(0, 0, "c", "function", "get_weather", '{"city": "Pa'), 0.1)
    view = CompareView([column])
    assert '→ get_weather({"city": "Pa)' in view.body(column).plain
    column.apply(ToolCallDelta(0, 0, None, None, None, 'ris", "days": 2}'), 0.2)
    column.apply(ChoiceFinished(0, "tool_calls"), 0.3)
    assert '{\n  "city": "Paris",\n  "days": 2\n}' in view.body(column).plain


def test_reasoning_can_be_hidden() -> None:
    column = Column("m", "m", started=0.0)
    column.apply(ReasoningDelta(0, "secret thoughts"), 0.1)
    column.apply(TextDelta(0, "answer"), 0.2)
    assert "secret thoughts" in CompareView([column]).body(column).plain
    shown = CompareView([column], reasoning=False).body(column)
    assert "secret thoughts" not in shown.plain and "answer" in shown.plain
    dim = CompareView([column]).body(column)
    assert any(str(s.style) == "dim italic" for s in dim.spans)


def test_several_choices_are_labelled() -> None:
    column = Column("m", "m", started=0.0)
    column.apply(TextDelta(0, "first"), 0.1)
    column.apply(TextDelta(1, "second"), 0.1)
    body = CompareView([column]).body(column).plain
    assert body.index("choice 0") < body.index("first") < body.index("choice 1") < body.index("second")


def test_a_finished_stream_event_finishes_the_column() -> None:
    column = Column("m", "m", started=0.0)
    result = parse_stream([sse_body({"choices": [{"index": 0, "delta": {"content": "x"},
                                                  "finish_reason": "stop"}]})])
    column.apply(StreamFinished(result), 1.0)
    assert column.done and column.status == "done" and column.elapsed(5.0) == 1.0
    assert column.time(5.0) is None  # the engine's own once finished: this result has no timings


# ---------------------------------------------------------------- reasons, flags, cuts

def _finish(column: Column, result: StreamResult, others: int = 0) -> StreamResult:
    result = attrs.evolve(result, others_running=others)
    column.finish(result, 2.0)
    return result


def _styles(text: Text, part: str) -> set[str]:
    start = text.plain.index(part)
    return {str(s.style) for s in text.spans if s.start <= start < s.end}


def test_a_column_that_did_not_complete_shows_its_reason_on_one_sanitized_line() -> None:
    column = Column("m", "m", started=0.0)
    reason = "the connection broke after 5 events: \x1b]0;pwned\x07Remote\nProtocolError:\r boom"
    _finish(column, StreamResult(Outcome.TRUNCATED, reason=reason))
    header = CompareView([column]).header(column, 3.0)
    lines = header.plain.splitlines()
    assert lines[-1] == "the connection broke after 5 events: Remote ProtocolError: boom"
    assert _styles(header, "the connection broke") == {"bold red"}
    out = console(width=50, height=30)
    out.print(CompareView([column]).live(out, 3.0))
    out.print(CompareView([column]).final(out, 3.0))
    screen = out.export_text()
    assert "│ the connection broke after 5 events: Remote P… │" in screen  # cut to fit
    assert "pwned" not in screen and "\x07" not in out.file.getvalue()  # type: ignore[attr-defined]
    # Without a reason (an old result), the error or the status stands in.
    other = Column("n", "n", started=0.0)
    other.finish(StreamResult(Outcome.ERROR, error=StreamError("boom")), 1.0)
    assert other.notes() == [("boom", "reason")]


def test_flags_show_prominently_on_a_completed_column() -> None:
    column = Column("m", "m", started=0.0, expected_choices=2)
    from fanout import ChoiceResult
    result = StreamResult(Outcome.COMPLETED, choices=(
        ChoiceResult(0, text="hi", finish_reason="stop"), ChoiceResult(1, text="ho")),
        flags=(Flag.UNFINISHED_CHOICE, Flag.MISSING_USAGE, Flag.SKIPPED_FRAMES),
        skipped_frames=3)
    _finish(column, result)
    assert column.notes() == [("⚠ choice 1 unfinished", "flag"), ("missing usage", "quiet"),
                              ("⚠ 3 frames skipped", "flag")]
    header = CompareView([column]).header(column, 3.0)
    assert header.plain.splitlines()[-1] == "⚠ choice 1 unfinished · missing usage · ⚠ 3 frames skipped"
    assert _styles(header, "⚠ choice 1") == {"bold yellow"}
    assert _styles(header, "missing usage") == {"dim"}  # informational: subtle
    one_line = CompareView([column]).header(column, 3.0, one_line=True).plain
    assert "\n" not in one_line and one_line.endswith("· ⚠ 3 frames skipped")
    empty = Column("e", "e", started=0.0, expected_choices=2)
    _finish(empty, StreamResult(Outcome.COMPLETED, choices=(
        ChoiceResult(0, finish_reason="stop"),), flags=(Flag.EMPTY_ANSWER, Flag.MISSING_CHOICES)))
    assert [note for note, _ in empty.notes()] == ["⚠ empty answer", "⚠ fewer choices than asked (1 came)"]


def test_the_summary_table_has_a_note_column_only_when_needed() -> None:
    from fanout import ChoiceResult
    good = Column("good", "m", started=0.0)
    _finish(good, StreamResult(Outcome.COMPLETED, choices=(ChoiceResult(0, "x", "hi", "", "",
                                                                        "stop"),)))
    out = console(width=160)
    out.print(summary_table([good], 3.0))
    assert " note" not in out.export_text()
    empty = Column("empty", "m", started=0.0)
    _finish(empty, StreamResult(Outcome.COMPLETED, flags=(Flag.EMPTY_ANSWER,)))
    cut = Column("cut", "m", started=0.0)
    _finish(cut, StreamResult(Outcome.TRUNCATED, reason="[DONE] arrived but no choice had a "
                              "finish reason (the server cut the stream)"), others=2)
    out = console(width=200)
    out.print(summary_table([good, empty, cut], 3.0))
    table = out.export_text()
    assert " note" in table.splitlines()[0]
    assert "⚠ empty answer" in table
    assert ("[DONE] arrived but no choice had a finish reason (the server cut the stream) · "
            "cut while 2 other streams ran") in table


@pytest.mark.parametrize(("result", "kind", "note"), [
    (StreamResult(Outcome.TRUNCATED, reason="[DONE] arrived but no choice had a finish "
                  "reason (the server cut the stream)"), "cut", "cut while 3 other streams ran"),
    (StreamResult(Outcome.TRUNCATED, reason="the connection broke after 2 events: reset"),
     "broke", "broke off while 3 other streams ran"),
    (StreamResult(Outcome.COMPLETED, flags=(Flag.EMPTY_ANSWER,)), "empty",
     "3 other streams ran"),
])
def test_a_stream_cut_while_others_ran_says_so_and_what_to_do(result: StreamResult, kind: str,
                                                               note: str) -> None:
    column = Column("m", "m", started=0.0)
    _finish(column, result, others=3)
    assert column.cut_while_others_ran == 3 and column.cut_kind == kind
    assert column.notes()[-1] == (note, "cut")
    body = CompareView([column]).body(column).plain
    assert "3 other streams ran" in body and "one stream at a time" in body
    assert body.endswith("compare fewer models at once, or set [concurrency] max = 1")
    alone = Column("a", "a", started=0.0)
    _finish(alone, result, others=0)  # nothing else ran: not a cut, no advice
    assert alone.cut_while_others_ran == 0 and "one stream at a time" not in CompareView(
        [alone]).body(alone).plain


def test_a_completed_answer_or_a_timeout_is_no_cut() -> None:
    from fanout import ChoiceResult
    for result in (StreamResult(Outcome.COMPLETED, choices=(ChoiceResult(0, text="hi",
                                                                         finish_reason="stop"),)),
                   StreamResult(Outcome.TIMED_OUT, reason="no event within 1 s"),
                   StreamResult(Outcome.ERROR, reason="HTTP 500: boom")):
        column = Column("m", "m", started=0.0)
        _finish(column, result, others=4)
        assert column.cut_while_others_ran == 0


def test_the_live_view_makes_room_for_the_note_line() -> None:
    columns = [Column(f"m{i}", "m", started=0.0) for i in range(2)]
    columns[0].apply(TextDelta(0, "\n".join(f"line {n}" for n in range(100))), 0.1)
    _finish(columns[1], StreamResult(Outcome.TRUNCATED, reason="the body ended after 2 events"))
    out = console(width=100, height=20)
    out.print(CompareView(columns).live(out, 0.2))
    screen = out.export_text().splitlines()
    assert len(screen) <= 20 and "Ctrl-C stops all" in screen[-1]
    assert any("the body ended after 2 events" in line for line in screen)
