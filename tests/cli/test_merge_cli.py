"""``fanout merge`` on the command line: its lines, its exit statuses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fanout.cli.main import main

from ..store.shards import sharded_run, write_config, write_prompts


@pytest.fixture
def shards(tmp_path: Path) -> tuple[Path, str, str]:
    config = write_config(tmp_path)
    prompts = write_prompts(tmp_path, 6)
    return sharded_run(tmp_path, 3, prompts, config), prompts, config


def test_a_complete_merge_says_so_and_exits_0(tmp_path: Path, shards: tuple[Path, str, str],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    folder, prompts, config = shards
    out = tmp_path / "merged.jsonl"
    status = main(["merge", "-o", str(out), "--prompts", prompts, "--config", config,
                   str(folder)])
    captured = capsys.readouterr()
    assert status == 0, captured
    lines = captured.out.splitlines()
    assert lines == [
        f"wrote {out} (12 records) and {tmp_path / 'merged.scores.jsonl'} (12 scores)",
        "units planned 12, present 12, missing 0, failed 0, unfinished 0, conflicts 0, "
        "torn tails cut 0; shards present 3 of 3",
        "complete: every planned unit is there and done (exit 0)"]
    assert captured.err == ""


def test_a_missing_shard_exits_75_and_names_it(tmp_path: Path, shards: tuple[Path, str, str],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    folder, _, _ = shards
    (folder / "results-2.jsonl").unlink()
    status = main(["merge", "-o", str(tmp_path / "m.jsonl"), str(folder)])
    captured = capsys.readouterr()
    assert status == 75
    assert ("fanout merge: missing shard 2 of 3 (numbered 0 to 2; 2 of 3 present): no input "
            "holds a record of it") \
        in captured.err.splitlines()
    assert "shards present 2 of 3" in captured.out
    assert captured.out.splitlines()[-1].endswith("(exit 75)")


def test_a_scores_file_as_results_is_one_line_and_exit_2(
        tmp_path: Path, shards: tuple[Path, str, str],
        capsys: pytest.CaptureFixture[str]) -> None:
    folder, _, _ = shards
    disguised = tmp_path / "r.jsonl"
    disguised.write_bytes((folder / "results-0.scores.jsonl").read_bytes())
    out = tmp_path / "m.jsonl"
    status = main(["merge", "-o", str(out), str(disguised)])
    captured = capsys.readouterr()
    assert status == 2 and captured.out == ""
    assert len(captured.err.splitlines()) == 1
    assert captured.err.startswith(f"fanout merge: {disguised}: is a fanout scores file")
    assert not out.exists()


@pytest.mark.parametrize(("args", "message"), [
    (["--config", "x.toml"], "the plan needs the prompts too"),
    (["--prompts", "nowhere.jsonl"], "nowhere.jsonl: no such file"),
])
def test_usage_errors_exit_2(tmp_path: Path, shards: tuple[Path, str, str],
                             capsys: pytest.CaptureFixture[str], args: list[str],
                             message: str) -> None:
    folder, _, _ = shards
    status = main(["merge", "-o", str(tmp_path / "m.jsonl"), *args, str(folder)])
    err = capsys.readouterr().err
    assert status == 2 and message in err and len(err.splitlines()) == 1


def test_no_such_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["merge", "-o", str(tmp_path / "m.jsonl"), str(tmp_path / "none")])
    assert status == 2
    assert capsys.readouterr().err == (f"fanout merge: {tmp_path / 'none'}: no such file or "
                                       "directory\n")


def test_help_names_the_exit_statuses() -> None:
    text = subprocess.run([sys.executable, "-m", "fanout.cli.main", "merge", "--help"],
                          capture_output=True, text=True, check=True).stdout
    for part in ("0 every planned unit", "1 everything", "2 bad usage", "75 shards"):
        assert part in " ".join(text.split())
