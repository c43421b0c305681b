"""The reported record of a unit (#27 item 7): the latest, except that a redo of the same
run that failed with no output never replaces an attempt that kept some.  The rule
(``supersedes``) and every surface that picks a unit's record: resume, ``fanout report``
(its summary, ``--json`` and the HTML page), ``fanout merge`` (one file, two shards),
``fanout score``, the evaluation."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from fanout.batch.shards import merge
from fanout.cli.main import main
from fanout.cli.report import model_summary, report
from fanout.eval.aggregate import prepare, slim
from fanout.eval.run import as_scored
from fanout.records import dumps_bytes
from fanout.store.plan_check import PlanTally
from fanout.store.results import (
    Attempt,
    attempt_of,
    has_output,
    latest_records,
    read_results,
    state_of,
    supersedes,
    work_key,
)
from fanout.store.scores import answer_key

from .shards import records, run_shard, write_config, write_prompts

KEPT_TEXT = "The capital of France is Par"


def choice(text: str = "", **parts: Any) -> dict[str, Any]:
    return {"index": 0, "text": text, "reasoning": parts.get("reasoning", ""),
            "refusal": parts.get("refusal", ""), "finish_reason": None,
            "tool_calls": parts.get("tool_calls", [])}


def record(state: str, *, run: str | None = "r1", text: str = "", content_key: str = "ck",
           **extra: Any) -> dict[str, Any]:
    """A record of unit ("q0", "fast", 0) in ``state`` as ``fanout batch`` writes it:
    ``truncated`` is a completed stream the server cut (``"cut": true``)."""
    outcome = {"truncated": "completed", "empty": "completed"}.get(state, state)
    rec: dict[str, Any] = {
        "id": "q0", "model": "fast", "sample": 0, "outcome": outcome,
        "reason": None if outcome == "completed" else
        "HTTP 502: upstream connect error (connection refused)",
        "flags": ["empty_answer"] if state == "empty" else [], "cut": state == "truncated",
        "redo": 0, "content_key": content_key,
        "text": text, "choices": [choice(text)] if text or outcome == "completed" else [],
        "status": 502 if state == "error" else 200, **extra}
    if run is not None:
        rec["run"] = run
    assert state_of(rec) == state, (state_of(rec), state)
    return rec


# ------------------------------------------------------------------------ the rule

NOT_DONE = ("truncated", "error", "timed_out", "cancelled")
DONE = ("completed", "empty")


@pytest.mark.parametrize("old_state", NOT_DONE)
@pytest.mark.parametrize("new_state", ("error", "timed_out", "cancelled"))
def test_a_failed_redo_of_the_same_run_without_output_keeps_the_earlier(
        old_state: str, new_state: str) -> None:
    old, new = record(old_state, text=KEPT_TEXT), record(new_state)
    assert has_output(old) and not has_output(new)
    assert not supersedes(old, new)
    assert not supersedes(attempt_of(old), attempt_of(new))  # the cut-down form alike


@pytest.mark.parametrize(("old_run", "new_run"), [
    ("r1", "r2"),  # another run
    (None, None), ("r1", None), (None, "r1"),  # older files: no run field
    ("", ""),  # an empty run names none
])
def test_records_of_different_or_no_runs_go_by_order(old_run: str | None,
                                                      new_run: str | None) -> None:
    assert supersedes(record("truncated", run=old_run, text=KEPT_TEXT),
                      record("error", run=new_run))


def test_a_later_record_of_other_content_wins() -> None:
    assert supersedes(record("truncated", text=KEPT_TEXT, content_key="a"),
                      record("error", content_key="b"))


@pytest.mark.parametrize("old_state", DONE + NOT_DONE)
@pytest.mark.parametrize("new_state", DONE + NOT_DONE)
@pytest.mark.parametrize("old_output", (True, False))
@pytest.mark.parametrize("new_output", (True, False))
def test_every_combination_of_the_same_run(old_state: str, new_state: str, old_output: bool,
                                          new_output: bool) -> None:
    if (old_state == "empty" and old_output) or (new_state == "empty" and new_output):
        return  # an empty answer has no output, by definition
    if (old_state == "completed" and not old_output) or (
            new_state == "completed" and not new_output):
        return  # a completed record without output is "empty"
    old = record(old_state, text=KEPT_TEXT if old_output else "")
    new = record(new_state, text="Par" if new_output else "")
    kept = old_state not in DONE and new_state not in DONE and old_output and not new_output
    assert supersedes(old, new) is not kept


def test_output_is_any_part_of_any_choice() -> None:
    base = record("error")
    assert not has_output(base)
    for parts in ({"reasoning": "hmm"}, {"refusal": "no"},
                  {"tool_calls": [{"name": "f", "arguments": "{}"}]}):
        assert has_output({**base, "choices": [choice(), choice(**parts)]})
        assert not supersedes({**base, "choices": [choice(**parts)]}, base)
    assert not has_output({**base, "choices": [choice("  \n")]})  # blank is none
    assert has_output({**base, "choices": None, "text": "old record"})  # no choices: text


def test_less_output_is_not_none() -> None:
    """A redo with some text is another answer: it is reported (never the longer one)."""
    assert supersedes(record("truncated", text="x" * 300), record("error", text="Paris"))


def test_the_kept_record_keeps_winning_until_a_later_one_has_output(tmp_path: Path) -> None:
    path = _file(tmp_path / "r.jsonl", [
        record("truncated", text=KEPT_TEXT), record("error"), record("timed_out"),
        record("completed", text="Paris", run="r2"), record("error", run="r2")])
    latest, _ = latest_records(path)
    assert [r["outcome"] for r in latest.values()] == ["error"]  # a completed is replaced
    path = _file(tmp_path / "s.jsonl", [
        record("truncated", text=KEPT_TEXT), record("error"), record("timed_out"),
        record("cancelled", text="Pa")])
    latest, _ = latest_records(path)
    assert [r["text"] for r in latest.values()] == ["Pa"]


# ------------------------------------------------------------------------ in memory


def _other(prompt: str) -> dict[str, Any]:
    return {**record("completed", text="yes"), "id": prompt}


def test_every_reader_picks_the_same_record_in_its_place(tmp_path: Path) -> None:
    rows = [record("truncated", text=KEPT_TEXT), _other("q1"), record("error"), _other("q2")]
    path = _file(tmp_path / "r.jsonl", rows)
    key = work_key("q0", "fast", 0)
    latest, _ = latest_records(path)
    assert list(latest) == [key, work_key("q1", "fast", 0), work_key("q2", "fast", 0)]
    assert latest[key]["text"] == KEPT_TEXT
    existing = read_results(path)
    assert list(existing.latest) == list(latest)
    assert existing.latest[key]["state"] == "truncated"
    for given in (rows, [slim(r) for r in rows]):
        run = prepare(given)
        assert list(run.latest) == list(latest)
        assert state_of(run.latest[key]) == "truncated"
    assert model_summary(rows)["fast"]["truncated"] == 1
    tally = PlanTally()
    for row in rows:
        tally.add({**row, "plan": "0123456789abcdef", "shard": "0/1"})
    completeness = tally.check()
    assert completeness is not None and completeness.not_done == {"truncated": 1}


def test_the_attempt_is_what_the_rule_reads() -> None:
    assert attempt_of(record("truncated", text=KEPT_TEXT)) == Attempt(
        "truncated", "r1", "ck", True)
    assert attempt_of(record("error", run="")).run is None


# ------------------------------------------------------------------------ the surfaces


@pytest.fixture
def batch_files(tmp_path: Path) -> tuple[str, str]:
    return write_config(tmp_path), write_prompts(tmp_path, 2)


def _file(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(dumps_bytes(r) for r in rows))
    return path


def _cut_then_dead(tmp_path: Path, config: str, prompts: str, *, later_run: str | None = None,
                   name: str = "results.jsonl") -> tuple[Path, dict[str, Any], dict[str, Any]]:
    """A real batch's file whose q0/fast is then a cut record with text, and a redo of the
    same run (or of ``later_run``) that failed with no output against a dead server."""
    path = tmp_path / name
    run_shard(prompts, str(path), config, (0, 1), ("fast",), score=False)
    rows = records(path)
    first = next(r for r in rows if r["id"] == "q0")
    cut = {**first, "cut": True, "text": KEPT_TEXT, "finish_reason": None,
           "choices": [{**first["choices"][0], "text": KEPT_TEXT}]}
    dead = {**first, "outcome": "error", "redo": 1, "cut": False,
            "reason": "connection refused (http://127.0.0.1:9/v1)", "text": "",
            "finish_reason": None, "choices": [], "usage": None, "status": None,
            "error": {"message": "connection refused"}, "metrics": {},
            "finished_at": "2999-01-01T00:00:00.000+00:00",
            **({"run": later_run} if later_run is not None else {})}
    assert state_of(cut) == "truncated" and state_of(dead) == "error"
    others = [r for r in rows if r["id"] != "q0"]
    _file(path, [cut, *others, dead])
    return path, cut, dead


def _json_report(path: Path) -> dict[str, Any]:
    out, err = io.StringIO(), io.StringIO()
    assert report(str(path), as_json=True, stdout=out, stderr=err) == 0, err.getvalue()
    data: dict[str, Any] = json.loads(out.getvalue())
    return data


def test_report_shows_the_record_with_text_and_says_the_redo_failed(
        tmp_path: Path, batch_files: tuple[str, str]) -> None:
    config, prompts = batch_files
    path, _, _ = _cut_then_dead(tmp_path, config, prompts)
    fast = _json_report(path)["fast"]
    assert (fast["truncated"], fast["error"], fast["completed"]) == (1, 0, 1)
    assert fast["earlier_kept"] == 1
    [reason] = fast["reasons"]
    assert reason["outcome"] == "truncated"
    assert reason["reason"] == (
        "cut by the server while others ran (its output is kept: a later attempt of the "
        "same run ended error with no output: connection refused (http://127.0.0.1:9/v1))")
    out = io.StringIO()
    assert report(str(path), as_json=False, stdout=out, stderr=io.StringIO()) == 0
    assert "fast: 1 truncated: cut by the server while others ran (its output is kept: a " \
        "later attempt of the same run ended error with no output" in " ".join(
            out.getvalue().split())
    page = tmp_path / "r.html"
    assert report(str(path), as_json=False, html=str(page), stdout=io.StringIO(),
                  stderr=io.StringIO()) == 0
    assert KEPT_TEXT in page.read_text()


def test_another_run_s_failed_redo_is_reported_as_before(
        tmp_path: Path, batch_files: tuple[str, str]) -> None:
    config, prompts = batch_files
    path, _, _ = _cut_then_dead(tmp_path, config, prompts, later_run="another run")
    fast = _json_report(path)["fast"]
    assert (fast["truncated"], fast["error"], fast["earlier_kept"]) == (0, 1, 0)
    page = tmp_path / "r.html"
    assert report(str(path), as_json=False, html=str(page), stdout=io.StringIO(),
                  stderr=io.StringIO()) == 0
    assert KEPT_TEXT not in page.read_text()
    merged = tmp_path / "m.jsonl"
    merge([path], merged)
    assert [r["outcome"] for r in records(merged) if r["id"] == "q0"] == ["error"]


def test_merge_keeps_the_record_with_text(tmp_path: Path,
                                          batch_files: tuple[str, str]) -> None:
    config, prompts = batch_files
    path, cut, _ = _cut_then_dead(tmp_path, config, prompts)
    merged = tmp_path / "m.jsonl"
    result = merge([path], merged, prompts=prompts, config=config, models=("fast",))
    assert [r for r in records(merged) if r["id"] == "q0"] == [cut]
    assert result.not_done == {"truncated": 1}
    assert result.unfinished_keys == [work_key("q0", "fast", 0)]


def test_merge_of_two_shards_keeps_the_record_with_text(
        tmp_path: Path, batch_files: tuple[str, str]) -> None:
    config, prompts = batch_files
    path, cut, _ = _cut_then_dead(tmp_path, config, prompts)
    rows = records(path)
    folder = tmp_path / "shards"
    folder.mkdir()
    _file(folder / "results-0.jsonl", [r for r in rows if r["id"] == "q0"])
    _file(folder / "results-1.jsonl", [r for r in rows if r["id"] != "q0"])
    merged = tmp_path / "merged.jsonl"
    merge([folder], merged)
    assert [r for r in records(merged) if r["id"] == "q0"] == [cut]


def test_merge_across_files_keeps_the_record_with_output_whichever_holds_it(
        tmp_path: Path, batch_files: tuple[str, str]) -> None:
    """The same unit in two files (a copy taken mid-run): of the same run and not done,
    the record with output is kept, even over a later one of the same state."""
    config, prompts = batch_files
    path, _, dead = _cut_then_dead(tmp_path, config, prompts)
    rest = [r for r in records(path) if r["id"] != "q0"]
    broke = {**dead, "reason": "the connection broke after 3 events", "text": KEPT_TEXT,
             "choices": [choice(KEPT_TEXT)], "finished_at": "2998-01-01T00:00:00.000+00:00"}
    for first, second in ((broke, dead), (dead, broke)):
        folder = tmp_path / f"shards-{first['text'] or 'none'}"
        folder.mkdir()
        _file(folder / "results-0.jsonl", [first, *rest])
        _file(folder / "results-1.jsonl", [second])
        merged = tmp_path / f"{folder.name}.jsonl"
        result = merge([folder], merged)
        assert [r for r in records(merged) if r["id"] == "q0"] == [broke]
        assert [c.kept for c in result.conflicts] == [
            (str(folder / f"results-{0 if first is broke else 1}.jsonl"), "error")]
    # of different runs, the merge's ranking as before: the later finished
    folder = tmp_path / "runs"
    folder.mkdir()
    _file(folder / "results-0.jsonl", [broke, *rest])
    _file(folder / "results-1.jsonl", [{**dead, "run": "r2"}])
    merged = tmp_path / "runs.jsonl"
    merge([folder], merged)
    assert [r["text"] for r in records(merged) if r["id"] == "q0"] == [""]


def test_resume_still_redoes_the_unit(tmp_path: Path, batch_files: tuple[str, str]) -> None:
    config, prompts = batch_files
    path, _, _ = _cut_then_dead(tmp_path, config, prompts)
    before = len(records(path))
    run_shard(prompts, str(path), config, (0, 1), ("fast",), score=False)
    after = records(path)
    assert len(after) == before + 1  # only q0/fast was sent again
    assert after[-1]["id"] == "q0" and state_of(after[-1]) == "completed"
    latest, _ = latest_records(path)
    assert state_of(latest[work_key("q0", "fast", 0)]) == "completed"


def test_score_scores_the_reported_record(tmp_path: Path,
                                          batch_files: tuple[str, str]) -> None:
    config, prompts = batch_files
    path, cut, dead = _cut_then_dead(tmp_path, config, prompts)
    assert main(["score", str(path), "--score", "exact", "--config", config]) in (0, 1)
    scores = records(tmp_path / "results.scores.jsonl")
    [mine] = [s for s in scores if s["id"] == "q0"]
    assert mine["answer_key"] == answer_key(as_scored(cut)) != answer_key(as_scored(dead))
