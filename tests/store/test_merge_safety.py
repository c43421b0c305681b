"""What ``fanout merge`` refuses to write over (issue #31 item 1), and the latest record of
every unit across its inputs, the merged file included (item 2): shard files from real
``fanout batch --shard I/N`` runs against the embedded upstream."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from fanout import ConfigError
from fanout.batch.shards import merge
from fanout.cli.batch import BatchOptions, run_batch
from fanout.cli.main import main
from fanout.cli.report import report as fanout_report

from .shards import records, sharded_run, write_config, write_prompts


@pytest.fixture
def shards(tmp_path: Path) -> Path:
    config = write_config(tmp_path)
    prompts = write_prompts(tmp_path, 6)
    return sharded_run(tmp_path, 3, prompts, config)


def _files(root: Path) -> dict[str, str]:
    """Every file under ``root`` (links as links) -> a digest of what it holds."""
    found = {}
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            found[str(path)] = "-> " + os.readlink(path)
        elif path.is_file():
            found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def _merge(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = main(["merge", *argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


# Each attack: what it sets up in tmp_path (shards/ holds results-I.jsonl and their scores,
# 3 shards), the merge's arguments, and the two files its one-line refusal names.
Attack = Callable[[Path], tuple[list[str], str, str]]


def _dir_shard0(t: Path) -> tuple[list[str], str, str]:
    out = t / "shards/results-0.jsonl"
    return ["-o", str(out), str(t / "shards")], str(out), str(out)


def _dir_shard0_scores(t: Path) -> tuple[list[str], str, str]:
    out = t / "shards/results-0.scores.jsonl"
    return ["-o", str(out), str(t / "shards")], str(out), "scores file"


def _dot_name(t: Path) -> tuple[list[str], str, str]:
    out = t / "shards/./results-1.jsonl"
    return (["-o", str(out), str(t / "shards/results-0.jsonl"),
             str(t / "shards/results-1.jsonl")], str(out), str(t / "shards/results-1.jsonl"))


def _glob(t: Path) -> tuple[list[str], str, str]:
    files = sorted(str(p) for p in (t / "shards").glob("results-*.jsonl"))
    out = str(t / "shards/results-2.jsonl")
    return ["-o", out, *files], out, out


def _symlinked_dir(t: Path) -> tuple[list[str], str, str]:
    (t / "link").symlink_to(t / "shards")
    out = t / "shards/results-0.jsonl"
    return ["-o", str(out), str(t / "link")], str(out), str(t / "link/results-0.jsonl")


def _hard_link(t: Path) -> tuple[list[str], str, str]:
    os.link(t / "shards/results-1.jsonl", t / "alias.jsonl")
    return (["-o", str(t / "alias.jsonl"), str(t / "shards")], str(t / "alias.jsonl"),
            str(t / "shards/results-1.jsonl"))


def _hard_link_to_scores(t: Path) -> tuple[list[str], str, str]:
    os.link(t / "shards/results-1.scores.jsonl", t / "alias.jsonl")
    return (["-o", str(t / "alias.jsonl"), str(t / "shards")], str(t / "alias.jsonl"),
            str(t / "shards/results-1.scores.jsonl"))


def _companion_is_input(t: Path) -> tuple[list[str], str, str]:
    # the output's own scores file would be written over an input's results
    os.link(t / "shards/results-0.jsonl", t / "m.scores.jsonl")
    return (["-o", str(t / "m.jsonl"), str(t / "shards")], str(t / "m.scores.jsonl"),
            str(t / "shards/results-0.jsonl"))


def _companion_is_input_scores(t: Path) -> tuple[list[str], str, str]:
    os.link(t / "shards/results-2.scores.jsonl", t / "m.scores.jsonl")
    return (["-o", str(t / "m.jsonl"), str(t / "shards")], str(t / "m.scores.jsonl"),
            str(t / "shards/results-2.scores.jsonl"))


def _scores_of_a_named_input(t: Path) -> tuple[list[str], str, str]:
    out = t / "shards/results-1.scores.jsonl"
    return (["-o", str(out), str(t / "shards/results-0.jsonl"),
             str(t / "shards/results-1.jsonl")], str(out), "scores file")


def _results_over_scores(t: Path) -> tuple[list[str], str, str]:
    shutil.copy(t / "shards/results-0.scores.jsonl", t / "kept.jsonl")  # not an input
    return ["-o", str(t / "kept.jsonl"), str(t / "shards")], str(t / "kept.jsonl"), "scores"


def _scores_over_results(t: Path) -> tuple[list[str], str, str]:
    shutil.copy(t / "shards/results-0.jsonl", t / "m.scores.jsonl")  # a results file
    return (["-o", str(t / "m.jsonl"), str(t / "shards")], str(t / "m.scores.jsonl"),
            str(t / "m.jsonl"))


def _not_fanout(t: Path) -> tuple[list[str], str, str]:
    (t / "README.md").write_text("# notes\n")
    return ["-o", str(t / "README.md"), str(t / "shards")], str(t / "README.md"), "results"


def _results_not_merged(t: Path) -> tuple[list[str], str, str]:
    # an existing results file of units no input holds (shard 2's, merged elsewhere)
    shutil.copy(t / "shards/results-2.jsonl", t / "other.jsonl")
    return (["-o", str(t / "other.jsonl"), str(t / "shards/results-0.jsonl")],
            str(t / "other.jsonl"), "--into")


ATTACKS: dict[str, Attack] = {
    "a directory input holds the output": _dir_shard0,
    "the scores of a directory's input": _dir_shard0_scores,
    "./x for x": _dot_name,
    "a glob that takes the output": _glob,
    "a linked directory": _symlinked_dir,
    "a hard link of an input": _hard_link,
    "a hard link of an input's scores": _hard_link_to_scores,
    "the output's scores file is an input": _companion_is_input,
    "the output's scores file is an input's scores": _companion_is_input_scores,
    "the scores file of a named input": _scores_of_a_named_input,
    "results over a scores file": _results_over_scores,
    "scores over a results file": _scores_over_results,
    "a file not fanout's": _not_fanout,
    "a results file holding units the merge lacks": _results_not_merged,
}


@pytest.mark.parametrize("attack", list(ATTACKS.values()), ids=list(ATTACKS))
def test_merge_never_writes_over_an_input_or_another_kind_of_file(
        tmp_path: Path, shards: Path, capsys: pytest.CaptureFixture[str],
        attack: Attack) -> None:
    argv, first, second = attack(tmp_path)
    before = _files(tmp_path)
    status, out, err = _merge(argv, capsys)
    assert status == 2 and out == "", err
    assert len(err.splitlines()) == 1 and err.startswith(f"fanout merge: {first}: ")
    assert second in err and err.rstrip().endswith("nothing was written")
    assert _files(tmp_path) == before  # nothing written, nothing left beside


def test_an_earlier_merge_of_the_same_shards_is_replaced(tmp_path: Path, shards: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    out = tmp_path / "merged.jsonl"
    assert _merge(["-o", str(out), str(shards)], capsys)[0] == 0
    (tmp_path / "empty.jsonl").write_bytes(b"")
    for target in (out, tmp_path / "empty.jsonl"):  # holds nothing the merge lacks
        status, _, err = _merge(["-o", str(target), str(shards)], capsys)
        assert status == 0, err
        assert len(records(target)) == 12


# ------------------------------------------------------------------ the latest record


def _fail_some(shards: Path, count: int) -> int:
    """Turn ``count`` completed records of the shard files into HTTP 502 errors (a rerun
    may finish them), as if the upstream had failed them."""
    failed = 0
    for path in sorted(shards.glob("results-?.jsonl")):
        rows = records(path)
        for index, row in enumerate(rows):
            if failed < count and index % 2 == 0:
                row.update(outcome="error", status=502, text="", choices=[],
                           error="HTTP 502 Bad Gateway", finish_reason=None)
                failed += 1
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return failed


def _done(path: Path) -> tuple[int, int]:
    latest = {}
    for row in records(path):
        latest[(row["id"], row["model"], row["sample"])] = row["outcome"]
    return sum(outcome == "completed" for outcome in latest.values()), len(latest)


def test_resume_the_merged_file_then_merge_again_loses_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's scenario: 80 units in 4 shards, 25 failed; the merge says to resume
    the merged file; after that, merging again as before must not drop the redone 25."""
    config = write_config(tmp_path)
    prompts = write_prompts(tmp_path, 40)
    shards = sharded_run(tmp_path, 4, prompts, config)
    assert _fail_some(shards, 25) == 25
    merged = tmp_path / "merged.jsonl"
    status, out, _ = _merge(["-o", str(merged), str(shards)], capsys)
    assert status == 75 and "resume the merged file with fanout batch" in out
    assert _done(merged) == (55, 80)
    err = io.StringIO()
    assert run_batch(BatchOptions(prompts=prompts, output=str(merged), config=config),
                     stdout=io.StringIO(), stderr=err, environ={}) == 0, err.getvalue()
    assert _done(merged) == (80, 80)
    resumed = merged.read_bytes()

    # The same merge again: refused, the resumed file as it was.
    status, out, err_text = _merge(["-o", str(merged), str(shards)], capsys)
    assert status == 2 and out == ""
    assert f"{merged}: holds 25 units the merge would lose" in err_text
    assert f"--into {merged}" in err_text
    assert merged.read_bytes() == resumed

    # The merged file named again, as an input: the latest of every unit, and who is newer.
    again = tmp_path / "merged2.jsonl"
    status, out, err_text = _merge(["-o", str(again), str(shards), str(merged)], capsys)
    assert status == 0, err_text
    assert _done(again) == (80, 80)
    newer = [line for line in err_text.splitlines() if " newer than " in line]
    assert sum(int(line.split(" holds ")[1].split()[0]) for line in newer) == 25
    assert all(line.startswith(f"fanout merge: {merged} holds ") for line in newer)
    assert "conflicts 0 (and 25 newer records kept)" in out

    # --into: the shards merged into the resumed file, in place.
    status, out, err_text = _merge(["--into", str(merged), str(shards)], capsys)
    assert status == 0, err_text
    assert _done(merged) == (80, 80)
    assert out.splitlines()[0].startswith(f"wrote {merged} (80 records)")
    # and it is a results file like any other: complete, nothing left to send
    err = io.StringIO()
    assert run_batch(BatchOptions(prompts=prompts, output=str(merged), config=config),
                     stdout=io.StringIO(), stderr=err, environ={}) == 0
    assert "80 already completed, 0 to run" in err.getvalue()
    err = io.StringIO()
    assert fanout_report(str(again), as_json=False, stdout=io.StringIO(), stderr=err) == 0
    assert "complete for its plan" in err.getvalue() and "not complete" not in err.getvalue()


def test_a_later_record_in_another_file_wins_over_a_completed_one(tmp_path: Path,
                                                                  shards: Path) -> None:
    """Across files as within one: the record that finished last is the unit's, whichever
    file holds it and wherever that file is named (``finished_at``)."""
    rows = records(shards / "results-0.jsonl")
    redo = {**rows[0], "text": "a later answer", "finished_at": "2999-01-01T00:00:00.000+00:00",
            "choices": [{**rows[0]["choices"][0], "text": "a later answer"}]
            if rows[0].get("choices") else rows[0].get("choices")}
    (tmp_path / "redo.jsonl").write_text(json.dumps(redo) + "\n")
    key = json.dumps([redo["id"], redo["model"], redo["sample"]])
    for order in ([tmp_path / "redo.jsonl", shards], [shards, tmp_path / "redo.jsonl"]):
        out = tmp_path / f"m{len(list(tmp_path.glob('m*.jsonl')))}.jsonl"
        report = merge(order, out)
        kept = {json.dumps([r["id"], r["model"], r["sample"]]): r for r in records(out)}
        assert kept[key]["text"] == "a later answer"
        assert [(n.path, n.than, n.units) for n in report.newer] == [
            (str(tmp_path / "redo.jsonl"), str(shards / "results-0.jsonl"), 1)]
        assert [c.newer for c in report.conflicts] == [True]
    # A later failure in another file (another run of the unit) loses no completed answer:
    # it is named, not kept.
    failed = {**rows[1], "outcome": "error", "status": 502, "text": "", "choices": [],
              "run": "another", "finished_at": "2999-01-01T00:00:00.000+00:00"}
    (tmp_path / "failed.jsonl").write_text(json.dumps(failed) + "\n")
    report = merge([shards, tmp_path / "failed.jsonl"], tmp_path / "f.jsonl")
    assert report.exit_code == 0 and report.newer[0].path == str(tmp_path / "failed.jsonl")
    assert [c.kept for c in report.conflicts] == [(str(shards / "results-0.jsonl"),
                                                   "completed")]


def test_into_a_file_that_is_not_there_is_a_merge(tmp_path: Path, shards: Path) -> None:
    out = tmp_path / "new.jsonl"
    report = merge([shards], out, into=True)
    assert report.exit_code == 0 and report.records == 12
    with pytest.raises(ConfigError, match="named as a scores file"):
        merge([shards], tmp_path / "x.scores.jsonl", into=True)
