"""``fanout merge --check`` and ``fanout report --watch`` (issue #31 item 5): shards written by
real ``fanout batch --shard I/N`` runs against the embedded upstream, one still running."""

from __future__ import annotations

import fcntl
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fanout.cli.main import main
from fanout.cli.report import watch

from ..store.shards import run_shard, write_prompts

CONFIG = """
[endpoint]
base_url = "embedded"

[deadlines]
idle = 10
total = 60

[batch]
models = ["fast", "refused", "slow"]

[[models]]
name = "fast"
id = "mock/fast"

[[models]]
name = "refused"
id = "fault/400"

[[models]]
name = "slow"
id = "mock/slow:0.03"
"""


@pytest.fixture
def batch(tmp_path: Path) -> tuple[str, str, Path]:
    config = tmp_path / "fanout.toml"
    config.write_text(CONFIG)
    prompts = write_prompts(tmp_path, 4)
    folder = tmp_path / "shards"
    folder.mkdir()
    return str(config), prompts, folder


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def _locked(path: Path) -> bool:
    with open(path, "rb") as file:
        try:
            fcntl.flock(file.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(file.fileno(), fcntl.LOCK_UN)
    return False


def test_check_shows_each_shard_and_writes_nothing(batch: tuple[str, str, Path],
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    config, prompts, folder = batch
    run_shard(prompts, str(folder / "results-0.jsonl"), config, (0, 2), score=False)
    before = sorted(os.listdir(folder))
    status = main(["merge", "--check", "--prompts", prompts, "--config", config, str(folder)])
    out = capsys.readouterr().out.splitlines()
    assert status == 75
    assert sorted(os.listdir(folder)) == before  # read only
    shard0 = [line for line in out if line.startswith(f"{folder / 'results-0.jsonl'}: ")]
    assert len(shard0) == 1 and "shard 0/2: planned " in shard0[0]
    planned = int(shard0[0].split("planned ")[1].split(",")[0])
    failed = int(shard0[0].split("failed ")[1].split(",")[0])
    assert failed > 0 and "left 0" in shard0[0]  # every fault/400 unit failed for good
    assert "shard 1/2: no file holds a record of it" in out
    assert out[-2].startswith("total: units planned 12, done ")
    assert out[-2].endswith(f"left {12 - planned}; shards present 1 of 2")
    assert out[-1].endswith("(exit 75)")
    with pytest.raises(SystemExit):
        main(["merge", "--check", "-o", "x.jsonl", str(folder)])  # --check writes nothing


def test_watch_sees_a_running_shard_progress_and_finish(
        batch: tuple[str, str, Path]) -> None:
    config, prompts, folder = batch
    run_shard(prompts, str(folder / "results-0.jsonl"), config, (0, 2), score=False)
    running = folder / "results-1.jsonl"
    steps: list[str] = []
    child: list[subprocess.Popen[bytes]] = []

    def sleep(seconds: float) -> None:  # what the watcher waits for, between its looks
        assert seconds == 0.5
        if not child:  # after the first look: shard 1 starts, and is caught mid-run
            child.append(subprocess.Popen(
                [sys.executable, "-m", "fanout.cli.main", "batch", prompts, "-o",
                 str(running), "--config", config, "--shard", "1/2"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            while _lines(running) < 1:
                assert child[0].poll() is None
                time.sleep(0.01)
            child[0].send_signal(signal.SIGSTOP)
            assert _locked(running)  # it is still running: its slow units are not done
            steps.append("stopped mid-run")
        else:  # after the second: let it finish
            child[0].send_signal(signal.SIGCONT)
            assert child[0].wait(timeout=120) in (0, 1)
            steps.append("finished")

    out = io.StringIO()
    try:
        status = watch([str(folder)], every=0.5, max_updates=10, prompts=prompts,
                       config=config, stdout=out, stderr=io.StringIO(), sleep=sleep,
                       live=False)
    finally:
        for process in child:
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.kill()
                process.wait()
    assert status == 0 and steps == ["stopped mid-run", "finished"]  # three looks
    text = out.getvalue().splitlines()
    totals = [line for line in text if line.startswith("total: ")]
    assert len(totals) == 3 and len([line for line in text if "(exit " in line]) == 3
    assert totals[0].endswith("shards present 1 of 2")
    assert "shard 1/2: no file holds a record of it" in text
    mid = [line for line in text if line.startswith(f"{running}: shard 1/2: ")]
    assert len(mid) == 2 and "a running fanout batch is writing it" in mid[0]
    assert "writing" not in mid[1] and mid[1].endswith("left 0")
    assert totals[-1].endswith("left 0; shards present 2 of 2")
    done = [int(line.split("done ")[1].split(",")[0]) for line in totals]
    assert done[0] < done[1] < done[2]  # it progressed, and finished


def test_report_watch_on_the_command_line_stops_when_complete(
        batch: tuple[str, str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    config, prompts, folder = batch
    for index in range(2):
        run_shard(prompts, str(folder / f"results-{index}.jsonl"), config, (index, 2),
                  score=False)
    status = main(["report", "--watch", str(folder), "--every", "0.01", "--max-updates", "5"])
    out = capsys.readouterr().out.splitlines()
    assert status == 0
    assert len([line for line in out if line.startswith("total: ")]) == 1  # one look
    assert out[-1].startswith("finished, but ")  # fault/400 failed for good: nothing left
    lines = (folder / "results-1.jsonl").read_text().splitlines()
    assert lines and all(json.loads(line)["id"] for line in lines)  # untouched
