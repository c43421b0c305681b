"""The scores file: one JSON line per score, beside the results, append-only, crash-safe.

``results.jsonl`` is scored into ``results.scores.jsonl`` (``scores_path``;
``--scores FILE`` names another).  One record a line::

    {"id": "q1", "model": "writer", "sample": 0, "scorer": "exact", "kind": "exact",
     "scorer_key": "…", "answer_key": "…", "status": "scored", "score": 1.0,
     "passed": true, "explanation": "…", "scored_at": "2026-12-01T11:00:00.000+00:00"}

and, for a judge's score, ``"judge": {"model", "model_id", "outcome", "reason",
"text", "usage", "cost", "cost_source"}``.  ``status`` is ``scored`` (then
``score`` is in [0, 1] and ``passed`` a boolean), ``unscored`` (the answer's
stream did not complete) or ``error`` (the scorer could not score it: no
expected value, an unparseable verdict, a judge that failed); ``score`` and
``passed`` are ``null`` unless scored.

A key (prompt id, model, sample) and a scorer name may have several records
(a changed answer, a changed scorer, ``--rescore``): the latest counts.
``answer_key`` hashes what was scored (``answer_key``), ``scorer_key`` the
scorer's kind and options, so a rerun skips an unchanged (answer, scorer) and
rescores a changed one.

The file is written like the results file (``fanout.store.results.ResultsFile``:
one ``write`` a line, flushed, ``fsync`` at least once a second and at the
end, locked for the run, a crash's torn last line ignored on reading and cut
off before the next run appends).  This module does no network I/O.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from ..records import dumps_bytes
from .results import (
    Existing,
    ResultsFile,
    Unreadable,
    _json_kind,
    _parse,
    read_existing,
    scan,
    unit_problem,
    work_key,
)

__all__ = ["RUN_FIELDS", "STATUSES", "Scores", "ScoresFile", "answer_key", "as_read_back",
           "read_scores", "score_id", "score_problem", "score_record", "scores_path"]

#: The fields that say which batch wrote a record (``"shard": "I/N"``, ``"plan"``: the
#: plan's fingerprint, ``"run"``: the run id): absent from records of older versions.
RUN_FIELDS = ("shard", "plan", "run")
#: What a score record's ``status`` can be.
STATUSES = ("scored", "unscored", "error")


def scores_path(results_path: str | os.PathLike[str]) -> Path:
    """Where the scores of ``results_path`` go by default: ``.jsonl`` becomes
    ``.scores.jsonl`` (``run.jsonl`` -> ``run.scores.jsonl``); a name without
    ``.jsonl`` gets ``.scores.jsonl`` appended (``run`` -> ``run.scores.jsonl``)."""
    path = Path(results_path)
    stem = path.name[:-len(".jsonl")] if path.name.endswith(".jsonl") else path.name
    return path.with_name(stem + ".scores.jsonl")


def as_read_back(value: Any) -> Any:
    """``value`` as a results file gives it back once written: what a scorer must see
    of a prompt's ``expected`` while the batch runs, so that its score is the one
    ``fanout score`` gives and its ``answer_key`` stays current.  Integers past the
    64-bit range read back as floats (``12345678901234567890123`` is
    ``1.2345678901234568e+22``: the project's one JSON behaviour); every other
    JSON value is itself."""
    parsed, problem = _parse(dumps_bytes(value))
    return value if problem is not None else parsed


def answer_key(record: Mapping[str, Any]) -> str:
    """A stable hash of what a scorer sees of a results record: its ``content_key``
    (what was asked), ``outcome``, the answer (every choice's text, refusal, finish
    reason and tool calls' names and arguments) and ``expected`` (absent and
    ``null`` differ).  Equal for an unchanged answer, different when any of those
    change; metrics, timestamps and usage do not count."""
    choices = record.get("choices")
    parts: list[Any] = []
    if isinstance(choices, list):
        for choice in choices:
            if not isinstance(choice, dict):
                parts.append(None)
                continue
            calls = choice.get("tool_calls")
            parts.append([
                choice.get("text"), choice.get("refusal"), choice.get("finish_reason"),
                [[call.get("name"), call.get("arguments")] for call in calls
                 if isinstance(call, dict)] if isinstance(calls, list) else None])
    what = [record.get("content_key"), record.get("outcome"), record.get("text"),
            record.get("finish_reason"), parts,
            ["expected", record["expected"]] if "expected" in record else ["no expected"]]
    blob = json.dumps(what, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()[:20]


def score_id(key: str, scorer: str) -> str:
    """The identity of one score: a unit's ``work_key`` and a scorer name."""
    return json.dumps([key, scorer], ensure_ascii=False)


def score_problem(value: object) -> str | None:
    """Why ``value`` is not a score record (one short phrase), or ``None`` if it is."""
    problem = unit_problem(value, ("id", "model", "sample", "scorer", "status", "answer_key",
                                   "scorer_key"), ("model", "scorer"))
    if problem is not None:
        return problem
    assert isinstance(value, dict)
    if value["status"] not in STATUSES:
        return f"status is {_json_kind(value['status'])}, not one of {', '.join(STATUSES)}"
    for name in ("answer_key", "scorer_key"):
        if not isinstance(value[name], str):
            return f"{name} is {_json_kind(value[name])}, not a string"
    if value["status"] == "scored":
        score = value.get("score")
        if isinstance(score, bool) or not isinstance(score, int | float) \
                or not 0 <= score <= 1:
            return f"score is {_json_kind(score)}, not a number in [0, 1]"
    return None


def score_record(record: Mapping[str, Any], scorer: str, kind: str, scorer_key: str, *,
                 answer: str, status: str, score: float | None, passed: bool | None,
                 explanation: str, judge: Mapping[str, Any] | None = None,
                 stamp: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The scores-file line of one score of the results ``record`` (``answer``: its
    ``answer_key``, with the prompt overrides it was scored with).

    ``stamp``: the ``shard``, ``plan`` and ``run`` of the batch that scores it; without
    one, those of ``record`` (the batch that wrote the answer), where it has them."""
    line: dict[str, Any] = {
        "id": record["id"], "model": record["model"], "sample": record["sample"],
        "scorer": scorer, "kind": kind, "scorer_key": scorer_key, "answer_key": answer,
        "status": status, "score": score, "passed": passed, "explanation": explanation,
        "scored_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds"),
    }
    if judge is not None:
        line["judge"] = dict(judge)
    for field in RUN_FIELDS:
        value = (stamp if stamp is not None else record).get(field)
        if isinstance(value, str):
            line[field] = value
    return line


class Scores(dict[tuple[str, str], dict[str, Any]]):
    """``(work_key, scorer name) -> its latest score record``, in order of latest
    writes; ``records`` counts the records read, ``unreadable`` the whole lines
    that are not score records, ``torn_bytes`` a torn last line (ignored)."""

    def __init__(self) -> None:
        super().__init__()
        self.records = 0
        self.unreadable = Unreadable()
        self.torn_bytes = 0


def read_scores(path: str | os.PathLike[str]) -> Scores:
    """The latest score per (unit, scorer) of the scores file at ``path`` (a missing
    file has none); never raises on the file's content."""
    try:
        file = open(path, "rb")  # noqa: SIM115 (closed just below; missing is no error)
    except FileNotFoundError:
        return Scores()
    with file:
        return read_scores_from(file)


def read_scores_from(file: IO[bytes]) -> Scores:
    """``read_scores`` of an open file, from its start."""
    scores = Scores()
    for line in scan(file, score_problem):
        if line.torn:
            scores.torn_bytes = line.size
        elif line.record is not None:
            record = line.record
            scores.records += 1
            ident = (work_key(record["id"], record["model"], record["sample"]),
                     record["scorer"])
            scores.pop(ident, None)  # re-insert: in order of latest writes
            scores[ident] = record
        elif line.kind is not None:
            scores.unreadable.add(line)
    return scores


_KEPT = ("answer_key", "scorer_key", "status", "passed")


def _keep(existing: Existing, record: dict[str, Any]) -> None:
    existing.records += 1
    ident = score_id(work_key(record["id"], record["model"], record["sample"]),
                     record["scorer"])
    existing.latest.pop(ident, None)
    kept = {name: record.get(name) for name in _KEPT}
    judge = record.get("judge")
    if isinstance(judge, dict):
        kept["judge_outcome"] = judge.get("outcome")
    existing.latest[ident] = kept


class ScoresFile(ResultsFile):
    """A scores file open for one run: locked, checked (only score records, a torn
    last line cut off), appended to.  ``existing.latest`` maps ``score_id(key,
    scorer)`` to the latest record's ``answer_key``, ``scorer_key``, ``status`` and
    ``passed``: what deciding whether to score again needs."""

    WHAT = "fanout scores file"
    USER = "fanout run (fanout score, or fanout batch --score)"

    def _read_existing(self, file: IO[bytes]) -> Existing:
        return read_existing(file, score_problem, _keep)

    def is_current(self, key: str, scorer: str, answer: str, scorer_key: str) -> bool:
        """Whether the file's latest score of (key, scorer) is of this answer by this
        scorer (then scoring it again would give the same).  A judge's ``error`` score
        whose judge stream did not complete is not current: the judge is asked again."""
        kept = self.existing.latest.get(score_id(key, scorer))
        if kept is None or kept.get("answer_key") != answer \
                or kept.get("scorer_key") != scorer_key:
            return False
        return "judge_outcome" not in kept or kept["judge_outcome"] == "completed" \
            or kept.get("status") != "error"
