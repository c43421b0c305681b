"""The scores file: its path, answer_key, latest-wins reading, crash safety."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fanout.store.results import ResultsFileError, work_key
from fanout.store.scores import (
    ScoresFile,
    answer_key,
    read_scores,
    score_problem,
    score_record,
    scores_path,
)

RECORD: dict[str, Any] = {
    "id": "q1", "model": "writer", "sample": 0, "outcome": "completed", "content_key": "ck1",
    "text": "Paris", "finish_reason": "stop", "expected": "Paris",
    "choices": [{"index": 0, "text": "Paris", "reasoning": "", "refusal": "",
                 "finish_reason": "stop", "tool_calls": []}],
    "metrics": {"ttft": 0.1}, "usage": {"prompt_tokens": 3}, "finished_at": "t0",
}


def _score(record: dict[str, Any] = RECORD, scorer: str = "exact", value: float = 1.0,
           **fields: Any) -> dict[str, Any]:
    line = score_record(record, scorer, "exact", "sk1", answer=answer_key(record),
                        status="scored", score=value, passed=value >= 1, explanation="ok")
    line.update(fields)
    return line


@pytest.mark.parametrize(("results", "scores"), [
    ("run.jsonl", "run.scores.jsonl"),
    ("dir/run.jsonl", "dir/run.scores.jsonl"),
    ("run", "run.scores.jsonl"),
    ("run.json", "run.json.scores.jsonl"),
    ("a.b.jsonl", "a.b.scores.jsonl"),
])
def test_scores_path(results: str, scores: str) -> None:
    assert scores_path(results) == Path(scores)


def test_answer_key_is_stable_over_what_scoring_does_not_see() -> None:
    key = answer_key(RECORD)
    assert key == answer_key(dict(RECORD))
    assert len(key) == 20
    moved = {**RECORD, "metrics": {"ttft": 9.0}, "usage": None, "finished_at": "t1",
             "cost": 0.5}
    assert answer_key(moved) == key


@pytest.mark.parametrize("change", [
    {"text": "paris"},
    {"outcome": "truncated"},
    {"content_key": "ck2"},
    {"expected": "London"},
    {"expected": None},  # null is not the same as absent, nor as "Paris"
    {"finish_reason": "length"},
    {"choices": [{**RECORD["choices"][0], "finish_reason": "length"}]},
    {"choices": [{**RECORD["choices"][0],
                  "tool_calls": [{"name": "get", "arguments": "{}"}]}]},
])
def test_answer_key_changes_with_the_answer(change: dict[str, Any]) -> None:
    assert answer_key({**RECORD, **change}) != answer_key(RECORD)


def test_answer_key_tells_absent_expected_from_null() -> None:
    absent = {k: v for k, v in RECORD.items() if k != "expected"}
    assert answer_key(absent) != answer_key({**absent, "expected": None})


def test_latest_wins_per_key_and_scorer(tmp_path: Path) -> None:
    path = tmp_path / "r.scores.jsonl"
    lines = [_score(value=0.0), _score(scorer="judged", value=0.5), _score(value=1.0),
             _score({**RECORD, "sample": 1}, value=0.25)]
    path.write_bytes(b"".join(json.dumps(line).encode() + b"\n" for line in lines))
    scores = read_scores(path)
    key = work_key("q1", "writer", 0)
    assert scores.records == 4
    assert set(scores) == {(key, "exact"), (key, "judged"),
                           (work_key("q1", "writer", 1), "exact")}
    assert scores[(key, "exact")]["score"] == 1.0
    assert scores[(key, "judged")]["score"] == 0.5
    assert not scores.unreadable


def test_torn_last_line_is_ignored_and_bad_lines_counted(tmp_path: Path) -> None:
    path = tmp_path / "r.scores.jsonl"
    whole = json.dumps(_score()).encode() + b"\n"
    path.write_bytes(whole + b"not json\n" + b'{"id": 1}\n' + whole[:30])
    scores = read_scores(path)
    assert len(scores) == 1
    assert scores.torn_bytes == 30
    assert scores.unreadable.counts == {"json": 1, "shape": 1}
    assert scores.unreadable.describe() == [
        "1 line is not JSON: line 2",
        "1 line is not a fanout record: line 3 (no model, sample, scorer, status, "
        "answer_key, scorer_key)"]


def test_missing_file_has_no_scores(tmp_path: Path) -> None:
    scores = read_scores(tmp_path / "none.jsonl")
    assert not scores and scores.records == 0


@pytest.mark.parametrize(("change", "problem"), [
    ({"status": "great"}, "status is 'great', not one of scored, unscored, error"),
    ({"score": 1.5}, "score is a number, not a number in [0, 1]"),
    ({"score": None}, "score is null, not a number in [0, 1]"),
    ({"scorer": ""}, "scorer is an empty string, not a non-empty string"),
    ({"answer_key": 3}, "answer_key is a number, not a string"),
])
def test_score_problem(change: dict[str, Any], problem: str) -> None:
    assert score_problem(_score()) is None
    assert score_problem({**_score(), **change}) == problem


def test_unscored_records_need_no_score() -> None:
    line = score_record(RECORD, "exact", "exact", "sk", answer="a", status="unscored",
                        score=None, passed=None, explanation="truncated: cut")
    assert score_problem(line) is None


def test_writer_cuts_a_torn_line_and_knows_what_is_current(tmp_path: Path) -> None:
    path = tmp_path / "r.scores.jsonl"
    whole = json.dumps(_score()).encode() + b"\n"
    path.write_bytes(whole + json.dumps(_score(scorer="judged")).encode()[:40])
    writer = ScoresFile(path)
    try:
        assert writer.existing.torn_bytes == 40
        key = work_key("q1", "writer", 0)
        assert writer.is_current(key, "exact", answer_key(RECORD), "sk1")
        assert not writer.is_current(key, "exact", answer_key(RECORD), "sk2")
        assert not writer.is_current(key, "exact", "other", "sk1")
        assert not writer.is_current(key, "judged", answer_key(RECORD), "sk1")
        assert writer.write(_score(scorer="judged"))
    finally:
        writer.close()
    assert path.read_bytes().startswith(whole)
    assert len(path.read_bytes().splitlines()) == 2
    assert set(read_scores(path)) == {(key, "exact"), (key, "judged")}


def test_writer_refuses_a_results_file_and_leaves_it(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    data = json.dumps(RECORD).encode() + b"\n"
    path.write_bytes(data)
    with pytest.raises(ResultsFileError, match="not a fanout scores file"):
        ScoresFile(path).close()
    assert path.read_bytes() == data


def test_a_second_writer_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "r.scores.jsonl"
    first = ScoresFile(path)
    try:
        with pytest.raises(ResultsFileError, match="in use by another fanout run"):
            ScoresFile(path)
    finally:
        first.close()
