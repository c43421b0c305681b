"""``fanout.batch.merge``: shard files from real ``fanout batch --shard I/N`` runs against the
embedded upstream, merged and checked."""

from __future__ import annotations

import fcntl
import io
import json
import os
from collections import Counter
from pathlib import Path

import pytest

from fanout import ConfigError
from fanout.batch.shards import merge
from fanout.cli.batch import BatchOptions, run_batch
from fanout.cli.report import report as fanout_report
from fanout.store.results import read_results, shard_of

from .shards import (
    keys,
    plan_of,
    records,
    sharded_run,
    stamp,
    write_config,
    write_prompts,
)


@pytest.fixture
def config(tmp_path: Path) -> str:
    return write_config(tmp_path)


@pytest.fixture
def prompts(tmp_path: Path) -> str:
    return write_prompts(tmp_path, 8)


def _planned(prompts: str, config: str, shards: int = 3) -> set[str]:
    return set(plan_of(prompts, config, (), 1, shards)[1])


# ------------------------------------------------------------------ complete


def test_a_complete_merge_holds_every_unit_and_score_once(tmp_path: Path, prompts: str,
                                                          config: str) -> None:
    shards = sharded_run(tmp_path, 3, prompts, config)
    out = tmp_path / "merged.jsonl"
    report = merge([shards], out, prompts=prompts, config=config)
    assert report.exit_code == 0, report
    assert report.planned == 16 and report.present == 16 and report.done == 16
    assert report.present_shards == [0, 1, 2] and not report.missing_shards
    assert report.plan == plan_of(prompts, config, (), 1, 3)[0]
    merged = keys(out)
    assert Counter(merged) == Counter(_planned(prompts, config))
    scored = Counter((json.dumps([s["id"], s["model"], s["sample"]]), s["scorer"])
                     for s in records(report.scores_output or ""))
    assert len(scored) == 16 and set(scored.values()) == {1}
    assert report.scores_output == str(tmp_path / "merged.scores.jsonl")
    # Without the prompts: the records alone show the plan complete (its fingerprint).
    alone = merge([shards], tmp_path / "alone.jsonl")
    assert alone.exit_code == 0 and alone.fingerprint_matches is True
    assert not alone.keys_checked and alone.present_shards == [0, 1, 2]


def test_the_merged_file_resumes_and_reports_complete(tmp_path: Path, prompts: str,
                                                      config: str) -> None:
    shards = sharded_run(tmp_path, 3, prompts, config)
    out = tmp_path / "merged.jsonl"
    assert merge([shards], out, prompts=prompts, config=config).exit_code == 0
    before = out.read_bytes()
    err = io.StringIO()
    status = run_batch(BatchOptions(prompts=prompts, output=str(out), config=config),
                       stdout=io.StringIO(), stderr=err, environ={})
    assert status == 0 and "16 already completed, 0 to run" in err.getvalue()
    assert out.read_bytes() == before  # nothing sent, nothing written
    err = io.StringIO()
    assert fanout_report(str(out), as_json=False, stdout=io.StringIO(), stderr=err) == 0
    assert "complete for its plan" in err.getvalue() and "not complete" not in err.getvalue()
    assert "not fanout records" not in err.getvalue()


def test_old_files_without_fields_merge_by_key(tmp_path: Path, prompts: str,
                                               config: str) -> None:
    shards = sharded_run(tmp_path, 3, prompts, config, fields=False)
    report = merge([shards], tmp_path / "m.jsonl", prompts=prompts, config=config)
    assert report.exit_code == 0 and report.keys_checked and report.present == 16
    assert len(report.old_files) == 3 and report.shards is None
    alone = merge([shards], tmp_path / "m2.jsonl")
    assert not alone.keys_checked and alone.fingerprint_matches is None
    assert alone.exit_code == 0 and alone.records == 16


# ------------------------------------------------------------------ missing and torn


def test_a_missing_shard_is_named_and_exits_75(tmp_path: Path, prompts: str,
                                               config: str) -> None:
    shards = sharded_run(tmp_path, 3, prompts, config)
    gone = set(keys(shards / "results-1.jsonl"))
    for name in ("results-1.jsonl", "results-1.scores.jsonl"):
        (shards / name).unlink()
    report = merge([shards], tmp_path / "m.jsonl", prompts=prompts, config=config)
    assert report.exit_code == 75
    assert report.missing_shards == [1] and set(report.missing_keys) == gone
    alone = merge([shards], tmp_path / "m2.jsonl")
    assert alone.exit_code == 75 and alone.missing_shards == [1]
    assert alone.fingerprint_matches is False


def test_an_unfinished_shard_without_a_torn_tail_is_seen_by_the_fingerprint(
        tmp_path: Path, prompts: str, config: str) -> None:
    shards = sharded_run(tmp_path, 3, prompts, config)
    path = shards / "results-2.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:-1]))  # killed between two writes
    alone = merge([shards], tmp_path / "m.jsonl")
    assert alone.exit_code == 75 and alone.fingerprint_matches is False
    assert not alone.missing_shards  # every shard is there, one unfinished


def test_a_torn_tail_in_the_middle_file_is_cut_and_named(tmp_path: Path, prompts: str,
                                                         config: str) -> None:
    shards = sharded_run(tmp_path, 3, prompts, config)
    middle = shards / "results-1.jsonl"
    data = middle.read_bytes()
    lines = data.splitlines(keepends=True)
    torn_key = keys(middle)[-1]
    middle.write_bytes(data[:len(data) - len(lines[-1]) // 2])  # the last line half written
    out = tmp_path / "m.jsonl"
    report = merge([shards], out, prompts=prompts, config=config)
    assert report.exit_code == 75
    assert [(t.path, t.line) for t in report.torn] == [(str(middle), len(lines))]
    assert report.missing_keys == [torn_key]
    merged = read_results(out)  # a results file with nothing unreadable
    assert not merged.unreadable and not merged.torn_bytes and merged.records == 15
    assert records(shards / "results-2.jsonl")[0] in records(out)  # the next file's first


def test_a_unit_the_server_refuses_fails_for_good(tmp_path: Path, prompts: str,
                                                  config: str) -> None:
    models = ("fast", "refused")
    shards = sharded_run(tmp_path, 2, prompts, config, models=models)
    report = merge([shards], tmp_path / "m.jsonl", prompts=prompts, config=config,
                   models=models)
    assert report.exit_code == 1, report
    assert len(report.failed_keys) == 8 and not report.unfinished_keys
    assert report.not_done == {"error": 8}
    assert all('"refused"' in key for key in report.failed_keys)


def test_a_unit_a_rerun_may_finish_is_unfinished(tmp_path: Path, prompts: str,
                                                 config: str) -> None:
    shards = sharded_run(tmp_path, 2, prompts, config)
    path = shards / "results-0.jsonl"
    rows = records(path)
    rows[0] = {**rows[0], "outcome": "error", "status": 503, "reason": "HTTP 503"}
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    report = merge([shards], tmp_path / "m.jsonl", prompts=prompts, config=config)
    assert report.exit_code == 75 and len(report.unfinished_keys) == 1
    assert not report.failed_keys


# ------------------------------------------------------------------ other plans, conflicts


def test_a_shard_of_another_plan_is_named_and_left_out(tmp_path: Path, prompts: str,
                                                       config: str) -> None:
    shards = sharded_run(tmp_path, 3, prompts, config)
    other_n = sharded_run(tmp_path, 2, prompts, config, folder="two")
    (other_n / "results-0.jsonl").rename(shards / "old-0.jsonl")
    other_prompts = write_prompts(tmp_path, 5, "other.jsonl", "Another")
    third = sharded_run(tmp_path, 3, other_prompts, config, folder="three", score=False)
    (third / "results-2.jsonl").rename(shards / "zz-other.jsonl")
    for form in ({}, {"prompts": prompts, "config": config}):
        out = tmp_path / "m.jsonl"
        report = merge([shards], out, **form)  # type: ignore[arg-type]
        assert report.exit_code == 0, report
        foreign = {(f.path, f.shard) for f in report.foreign_shards}
        assert foreign == {(str(shards / "old-0.jsonl"), "0/2"),
                           (str(shards / "zz-other.jsonl"), "2/3")}
        assert set(keys(out)) == _planned(prompts, config)


def test_conflicts_keep_the_completed_record_and_name_both(tmp_path: Path, prompts: str,
                                                           config: str) -> None:
    shards = sharded_run(tmp_path, 2, prompts, config)
    rows = records(shards / "results-0.jsonl")
    same = rows[0]  # recorded alike twice: kept once
    failed = {**rows[1], "outcome": "error", "status": 502, "text": ""}
    other = {**rows[2], "text": rows[2]["text"] + " (another answer)",
             "finished_at": "2999-01-01T00:00:00.000+00:00"}
    (shards / "results-0-retry.jsonl").write_text(
        "".join(json.dumps(row) + "\n" for row in (same, failed, other)))
    out = tmp_path / "m.jsonl"
    report = merge([shards], out, prompts=prompts, config=config)
    assert report.duplicates == 1
    conflicts = {c.key: c for c in report.conflicts}
    key_failed, key_other = (json.dumps([r["id"], r["model"], r["sample"]])
                             for r in (failed, other))
    assert set(conflicts) == {key_failed, key_other}
    assert conflicts[key_failed].kept == (str(shards / "results-0.jsonl"), "completed")
    assert conflicts[key_failed].others == ((str(shards / "results-0-retry.jsonl"), "error"),)
    # both completed: the later one is kept
    assert conflicts[key_other].kept[0] == str(shards / "results-0-retry.jsonl")
    merged = {json.dumps([r["id"], r["model"], r["sample"]]): r for r in records(out)}
    assert len(merged) == len(keys(out)) == 16
    assert merged[key_other]["text"].endswith("(another answer)")
    assert report.exit_code == 0
    # the score of the answer not kept is dropped; the kept one's stays
    assert report.scores_other_answer == 1


# ------------------------------------------------------------------ inputs refused


def test_a_scores_file_given_as_results_is_refused(tmp_path: Path, prompts: str,
                                                   config: str) -> None:
    shards = sharded_run(tmp_path, 2, prompts, config)
    disguised = tmp_path / "results-9.jsonl"
    disguised.write_bytes((shards / "results-0.scores.jsonl").read_bytes())
    out = tmp_path / "m.jsonl"
    with pytest.raises(ConfigError) as caught:
        merge([shards, disguised], out)
    message = str(caught.value)
    assert len(message.splitlines()) == 1 and message.startswith(f"{disguised}: is a fanout "
                                                                 "scores file")
    assert not out.exists()


def test_a_results_file_given_as_scores_is_refused(tmp_path: Path, prompts: str,
                                                   config: str) -> None:
    shards = sharded_run(tmp_path, 2, prompts, config)
    disguised = shards / "results-1.scores.jsonl"
    disguised.write_bytes((shards / "results-1.jsonl").read_bytes())
    with pytest.raises(ConfigError) as caught:
        merge([shards], tmp_path / "m.jsonl")
    message = str(caught.value)
    assert len(message.splitlines()) == 1 and message.startswith(f"{disguised}: is a fanout "
                                                                 "results file")


def test_a_shell_glob_that_takes_the_scores_files_too_merges_them_as_scores(
        tmp_path: Path, prompts: str, config: str) -> None:
    shards = sharded_run(tmp_path, 2, prompts, config)
    files = sorted(shards.glob("results-*.jsonl"))  # what `results-*.jsonl` expands to
    assert any(name.name.endswith(".scores.jsonl") for name in files)
    report = merge(files, tmp_path / "m.jsonl")
    assert report.exit_code == 0 and report.records == 16 and report.scores == 16
    assert not report.scores_duplicates  # each scores file read once
    twice = merge([shards, shards / "results-0.jsonl", shards / ".." / "shards"],
                  tmp_path / "m2.jsonl")  # one file named three ways: read once
    assert twice.inputs == [str(shards / "results-0.jsonl"), str(shards / "results-1.jsonl")]
    assert not twice.duplicates and not twice.scores_duplicates and twice.scores == 16


def test_the_output_is_written_safely(tmp_path: Path, prompts: str, config: str) -> None:
    shards = sharded_run(tmp_path, 2, prompts, config)
    with pytest.raises(ConfigError, match="is the output"):
        merge([shards / "results-0.jsonl"], shards / "results-0.jsonl")
    target = tmp_path / "elsewhere.jsonl"
    target.write_text("keep me\n")
    link = tmp_path / "link.jsonl"
    link.symlink_to(target)
    with pytest.raises(ConfigError, match="symbolic link"):
        merge([shards], link)
    assert target.read_text() == "keep me\n" and link.is_symlink()
    out = shards / "merged.jsonl"  # inside the input directory: an input the next time
    merge([shards], out)
    inode = out.stat().st_ino
    with pytest.raises(ConfigError, match="is the output and the input"):
        merge([shards], out)
    assert out.stat().st_ino == inode
    report = merge([shards], out, into=True)  # read once, though named and found
    assert report.records == 16 and report.duplicates == 16
    assert report.inputs[0] == str(out) and len(report.inputs) == 3
    assert out.stat().st_ino != inode  # replaced whole, by rename
    assert not [p for p in shards.iterdir() if p.name.startswith(".")]  # no temporary left


def test_a_shard_a_running_batch_holds_is_unfinished(tmp_path: Path, prompts: str,
                                                     config: str) -> None:
    shards = sharded_run(tmp_path, 2, prompts, config)
    with open(shards / "results-1.jsonl", "rb") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        report = merge([shards], tmp_path / "m.jsonl")
    assert report.exit_code == 75 and report.in_use == [str(shards / "results-1.jsonl")]


def test_units_not_in_the_plan_are_left_out(tmp_path: Path, prompts: str,
                                            config: str) -> None:
    shards = sharded_run(tmp_path, 2, prompts, config, fields=False)
    fewer = write_prompts(tmp_path, 6, "fewer.jsonl")
    out = tmp_path / "m.jsonl"
    report = merge([shards], out, prompts=fewer, config=config)
    assert report.not_in_plan == 4 and report.records == 12 and report.exit_code == 0
    assert set(keys(out)) == _planned(fewer, config)


def test_samples_and_models_are_taken_from_the_records(tmp_path: Path, prompts: str,
                                                       config: str) -> None:
    shards = sharded_run(tmp_path, 2, prompts, config, models=("echo",), samples=2)
    report = merge([shards], tmp_path / "m.jsonl", prompts=prompts, config=config)
    assert report.exit_code == 0 and report.planned == 16
    assert report.plan == plan_of(prompts, config, ("echo",), 2, 2)[0]


def test_stamped_fields_name_the_shard_that_owns_each_key(tmp_path: Path, prompts: str,
                                                          config: str) -> None:
    # The helper's fields are the ones brief-20 defines (a check of the test's own tool).
    shards = sharded_run(tmp_path, 3, prompts, config)
    for index in range(3):
        for record in records(shards / f"results-{index}.jsonl"):
            key = json.dumps([str(record["id"]), record["model"], record["sample"]])
            assert record["shard"] == f"{index}/3" and shard_of(key, 3) == index
    stamp(shards / "results-0.jsonl", plan_of(prompts, config, (), 1, 3)[0], 3)
    assert os.path.getsize(shards / "results-0.jsonl") > 0


def test_report_says_whether_a_file_is_complete_for_its_plan(tmp_path: Path, prompts: str,
                                                             config: str) -> None:
    def said(path: Path) -> list[str]:
        err = io.StringIO()
        assert fanout_report(str(path), as_json=False, stdout=io.StringIO(), stderr=err) == 0
        return [line for line in err.getvalue().splitlines() if "plan" in line]

    shards = sharded_run(tmp_path, 3, prompts, config)
    plan = plan_of(prompts, config, (), 1, 3)[0]
    [line] = said(shards / "results-1.jsonl")  # one shard of three
    assert f"not complete for its plan {plan} (3 shards)" in line
    assert "(records of shards 1 of 3)" in line
    assert merge([shards], tmp_path / "all.jsonl").exit_code == 0
    [line] = said(tmp_path / "all.jsonl")
    assert line.endswith(f"complete for its plan {plan} (3 shards): all 16 units are there "
                         "and done")
    old = sharded_run(tmp_path, 1, prompts, config, fields=False, folder="old")
    assert said(old / "results-0.jsonl") == []  # no plan in the records: nothing to tell
