"""`fanout batch` never damages a file: not its prompts, not another tool's file, not its
own results on a full disk or under a second run.  Real files in tmp dirs, through
`run_batch` and through real subprocesses."""

from __future__ import annotations

import errno
import io
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from fanout.cli.batch import BatchOptions, run_batch
from fanout.records import dumps_bytes
from fanout.store import results as results_module
from fanout.store.results import ResultsFile, ResultsFileError, _starts_a_record, lock_path, scan

COMMAND = [sys.executable, "-m", "fanout.cli.main"]

CONFIG = """
[endpoint]
base_url = "embedded"

[deadlines]
idle = 3
total = 30

[concurrency]
max = 8

[[models]]
name = "fast"
id = "mock/fast"

[[models]]
name = "slow"
id = "mock/slow:0.01"
"""


@pytest.fixture
def config(tmp_path: Path) -> str:
    path = tmp_path / "fanout.toml"
    path.write_text(CONFIG)
    return str(path)


def prompts_file(tmp_path: Path, count: int, name: str = "prompts.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"Question {i}?"}) + "\n"
                            for i in range(count)))
    return path


def batch(prompts: Path | str, output: Path | str, config: str, *models: str,
          **options: Any) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = run_batch(BatchOptions(prompts=str(prompts), output=str(output),
                                    models=models or ("fast",), config=config, **options),
                       stdout=out, stderr=err, environ={})
    return status, out.getvalue(), err.getvalue()


def keys(path: Path) -> Counter[tuple[str, str, int]]:
    return Counter((r["id"], r["model"], r["sample"])
                   for r in map(json.loads, path.read_text().splitlines())
                   if r["outcome"] == "completed")


def snapshot(path: Path) -> tuple[bytes, int, int]:
    info = path.stat()
    return path.read_bytes(), info.st_mtime_ns, info.st_size


# ------------------------------------------------------------ 5: -o is the input

@pytest.mark.parametrize("spelling", ["same", "hard link", "symlink", "other path"])
def test_an_output_that_is_the_prompts_file_is_refused(tmp_path: Path, config: str,
                                                       spelling: str) -> None:
    prompts = prompts_file(tmp_path, 3)
    before = snapshot(prompts)
    (tmp_path / "sub").mkdir()
    output: Path | str = prompts
    if spelling == "hard link":
        output = tmp_path / "sub" / "linked.jsonl"
        os.link(prompts, output)
    elif spelling == "symlink":
        output = tmp_path / "sub" / "symlinked.jsonl"
        output.symlink_to(prompts)
    elif spelling == "other path":
        output = f"{tmp_path}/sub/../{prompts.name}"
    status, out, err = batch(prompts, output, config)
    assert status == 2 and out == ""
    assert err.splitlines() == [
        f"fanout batch: -o {output}: is the prompts file {prompts} (the same file); name "
        "another output; nothing was sent"]
    assert snapshot(prompts) == before
    assert not lock_path(output).exists()


def test_the_prompts_file_as_output_through_the_command_line(tmp_path: Path,
                                                             config: str) -> None:
    prompts = prompts_file(tmp_path, 2)
    before = prompts.read_bytes()
    os.link(prompts, tmp_path / "copy.jsonl")
    done = subprocess.run([*COMMAND, "batch", "prompts.jsonl", "-o", "copy.jsonl", "--config",
                           config], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        "fanout batch: -o copy.jsonl: is the prompts file prompts.jsonl (the same file); "
        "name another output; nothing was sent"]
    assert prompts.read_bytes() == before


# ------------------------------------------------------- 6: outputs that cannot be

def _read_only_mount(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "ro"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(mount)],
                          capture_output=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


@pytest.mark.parametrize(("case", "reason"), [
    ("directory", "cannot open for writing: Is a directory"),
    ("under a file", "cannot open for writing: Not a directory"),
    ("under /proc", "cannot open for writing: No such file or directory"),
    ("missing directory", "cannot open for writing: No such file or directory (DIR/ does "
                          "not exist)"),
    ("/dev/full", "not a regular file (a character device): a results file is read back, "
                  "locked and appended to"),
    ("a named pipe", "not a regular file (a pipe): a results file is read back, locked and "
                     "appended to"),
    ("read-only file system", "cannot open for writing: Read-only file system"),
])
def test_an_output_that_cannot_be_written_is_one_line(tmp_path: Path, config: str, case: str,
                                                      reason: str) -> None:
    prompts = prompts_file(tmp_path, 2)
    mounts = None
    if case == "directory":
        output = tmp_path / "results"
        output.mkdir()
    elif case == "under a file":
        (tmp_path / "plain").write_text("x")
        output = tmp_path / "plain" / "results.jsonl"
    elif case == "under /proc":  # root may write anywhere, but not there
        output = Path("/proc/fanout-results.jsonl")
    elif case == "missing directory":
        output = tmp_path / "nope" / "results.jsonl"
        reason = reason.replace("DIR", str(tmp_path / "nope"))
    elif case == "/dev/full":
        output = Path("/dev/full")
    elif case == "a named pipe":  # opening it for reading would wait for a writer
        output = tmp_path / "fifo"
        os.mkfifo(output)
    else:
        mounts = _read_only_mount(tmp_path)
        output = next(mounts) / "results.jsonl"
    try:
        status, out, err = batch(prompts, output, config)
    finally:
        if mounts is not None:
            next(mounts, None)
    assert status == 2 and out == ""
    assert err.splitlines() == [f"fanout batch: -o {output}: {reason}; nothing was sent"]


def test_a_directory_as_output_through_the_command_line(tmp_path: Path, config: str) -> None:
    prompts = prompts_file(tmp_path, 2)
    (tmp_path / "out").mkdir()
    done = subprocess.run([*COMMAND, "batch", str(prompts), "-o", str(tmp_path / "out"),
                           "--config", config], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"fanout batch: -o {tmp_path / 'out'}: cannot open for "
                                        "writing: Is a directory; nothing was sent"]


class _FullDisk:
    """os.write for the results module that fills up after ``room`` records: the first
    write past it goes in halfway (a torn line), every later one fails with ENOSPC."""

    def __init__(self, room: int) -> None:
        self.write = os.write  # the real one (the patched one is this)
        self.room = room
        self.full = False
        self.refused = 0

    def __call__(self, fd: int, data: bytes | memoryview) -> int:
        if self.full:
            self.refused += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if bytes(data).endswith(b"\n") and self.room <= 0:
            self.full = True
            return self.write(fd, bytes(data)[:len(data) // 2])
        self.room -= bytes(data).endswith(b"\n")
        return self.write(fd, data)


def test_a_full_disk_mid_run(tmp_path: Path, config: str,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    prompts = prompts_file(tmp_path, 30)
    output = tmp_path / "results.jsonl"
    disk = _FullDisk(room=12)
    monkeypatch.setattr(results_module.os, "write", disk)
    status, out, err = batch(prompts, output, config, "fast", "slow")
    monkeypatch.undo()
    assert status == 75 and disk.refused  # a full disk: a rerun may finish
    assert "Traceback" not in err
    lines = err.splitlines()
    failed = [line for line in lines if "No space left on device" in line]
    assert len(failed) == 1
    assert failed[0].startswith(f"fanout batch: -o {output}: cannot write: No space left on "
                                "device; no new stream was sent after that; ")
    assert "could not be recorded (they run again next time)" in failed[0]
    assert lines[-2].startswith("fanout batch: ") and lines[-2].endswith(
        f"of 60 streams are not completed or not recorded; once {output} can be written, run "
        "the same command again to finish")
    assert re.fullmatch(r"fanout batch: exit 75: \d+ units are left that a rerun may finish "
                        r"\(a file could not be written\)", lines[-1]), lines[-1]
    assert " fast " in out  # the summary, of what the file holds
    data = output.read_bytes()
    assert data.endswith(b"\n") and data.count(b"\n") == 12  # the torn write was undone
    assert all(json.loads(line) for line in data.splitlines())
    assert not lock_path(output).exists()
    # Room again: the resume completes the rest, and nothing completed twice.
    status, _, err = batch(prompts, output, config, "fast", "slow")
    assert status == 0, err
    assert "12 already completed, 48 to run" in err
    assert set(keys(output).values()) == {1} and len(keys(output)) == 60


def test_a_failed_write_is_kept_and_tried_again(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "r.jsonl"
    writer = ResultsFile(path)
    record = {"id": "a", "model": "m", "sample": 0, "outcome": "completed", "content_key": "k"}
    disk = _FullDisk(room=1)
    monkeypatch.setattr(results_module.os, "write", disk)
    assert writer.write(record) is True
    assert writer.write({**record, "id": "b"}) is False  # half of it went in, and out again
    assert writer.write({**record, "id": "c"}) is False
    assert isinstance(writer.error, OSError) and writer.error.errno == errno.ENOSPC
    assert [key for key, _ in writer.unwritten] == ['["b", "m", 0]', '["c", "m", 0]']
    disk.full, disk.room = False, 100  # room again: close writes them, in order
    writer.close()
    assert [json.loads(line)["id"] for line in path.read_text().splitlines()] == ["a", "b", "c"]


def test_a_real_full_disk_in_a_subprocess(tmp_path: Path, config: str) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)],
                          capture_output=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        filler = disk / "filler"
        filler.write_bytes(b"\0" * (256 - 12) * 1024)  # about 6 records' worth left
        prompts = prompts_file(tmp_path, 20)
        output = disk / "results.jsonl"
        command = [*COMMAND, "batch", str(prompts), "-m", "fast", "-m", "slow", "-o",
                   str(output), "--config", config]
        first = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert first.returncode == 75, first.stderr  # a full disk: a rerun may finish
        assert "Traceback" not in first.stderr
        assert sum("No space left on device" in line
                   for line in first.stderr.splitlines()) == 1
        assert "model" in first.stdout  # the summary
        data = output.read_bytes()
        assert data.endswith(b"\n") and all(json.loads(line) for line in data.splitlines())
        recorded = len(keys(output))
        assert 0 < recorded < 40
        filler.unlink()
        second = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert second.returncode == 0, second.stderr
        assert f"{recorded} already completed, {40 - recorded} to run" in second.stderr
        assert len(keys(output)) == 40 and set(keys(output).values()) == {1}
    finally:
        subprocess.run(["umount", str(disk)], check=True)


# --------------------------------------------------------------- 7: one run a file

def test_a_second_run_on_the_same_file_is_refused(tmp_path: Path, config: str) -> None:
    prompts = prompts_file(tmp_path, 40)
    output = tmp_path / "results.jsonl"
    first = subprocess.Popen([*COMMAND, "batch", str(prompts), "-m", "slow", "-o", str(output),
                              "--config", config, "--concurrency", "2"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (output.exists() and output.read_bytes().count(b"\n") >= 2):
            assert time.monotonic() < deadline and first.poll() is None
            time.sleep(0.05)
        holder = json.loads(lock_path(output).read_text())
        assert holder["pid"] == first.pid
        second = subprocess.run([*COMMAND, "batch", str(prompts), "-m", "slow", "-o",
                                 str(output), "--config", config],
                                capture_output=True, text=True, timeout=60)
        # Another run holds it: work is left for later, not an error of the input.
        assert second.returncode == 75 and second.stdout == ""
        assert second.stderr.splitlines() == [
            f"fanout batch: -o {output}: in use by another fanout batch (pid {first.pid} on "
            f"{holder['host']}, since {holder['started']}); wait for it to end, or name "
            "another output; nothing was sent",
            "fanout batch: exit 75: 40 units are left that a rerun may finish (results.jsonl is "
            "locked by another run)"]
        _, err = first.communicate(timeout=120)
    finally:
        first.kill()
    assert first.returncode == 0, err
    assert len(keys(output)) == 40 and set(keys(output).values()) == {1}  # each key once
    assert not lock_path(output).exists()  # removed at the end
    status, _, err = batch(prompts, output, config, "slow")  # and the file is free again
    assert status == 0 and "40 already completed, 0 to run" in err


def test_the_lock_is_held_by_the_open_file(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    holder = ResultsFile(path)
    try:
        with pytest.raises(ResultsFileError, match=rf"in use by another fanout batch \(pid "
                                                   rf"{os.getpid()} on "):
            ResultsFile(path)
        lock_path(path).unlink()  # who holds it is only a courtesy: the lock stays
        with pytest.raises(ResultsFileError, match="who holds it is not known yet"):
            ResultsFile(path)
    finally:
        holder.close()
    ResultsFile(path).close()  # free after close


# ------------------------------------------------- 8: only fanout's results files

def _record(i: int, **extra: Any) -> dict[str, Any]:
    return {"id": f"q{i}", "model": "fast", "sample": 0, "outcome": "completed",
            "content_key": "k", "text": "hi", **extra}


NOT_RESULTS = {
    "random bytes": random.Random(11).randbytes(4000),
    "random text": b"".join(random.Random(12).choice([b"abc ", b"{", b"}\n", b"\"x\": 1"])
                            for _ in range(300)),
    "a prompts file": b'{"id": "q1", "prompt": "What is 2 + 2?"}\n{"id": "q2", "prompt": "Hi"}\n',
    "another tool's JSONL": b'{"id": 1, "model": "gpt-4o", "sample": 0, "score": 0.5}\n',
    "an unknown outcome": json.dumps({**_record(1), "outcome": "ok"}).encode() + b"\n",
    "a list per line": b'["q1", "fast", 0, "completed"]\n',
    "a bad line inside": dumps_bytes(_record(1)) + b"not json\n" + dumps_bytes(_record(2)),
    "text for a last line": dumps_bytes(_record(1)) + b"hello",
    "the prompts, unterminated": b'{"id": "q1", "prompt": "What is',
    "not UTF-8": dumps_bytes(_record(1)) + b'{"id": "q\xff", "model": "fast"}\n',
}


@pytest.mark.parametrize("name", NOT_RESULTS)
def test_a_file_that_is_not_a_results_file_is_refused_untouched(tmp_path: Path, config: str,
                                                                name: str) -> None:
    prompts = prompts_file(tmp_path, 2)
    output = tmp_path / "output.jsonl"
    output.write_bytes(NOT_RESULTS[name])
    before = snapshot(output)
    status, out, err = batch(prompts, output, config)
    assert status == 2 and out == ""
    lines = err.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"fanout batch: -o {output}: not a fanout results file: ")
    assert lines[0].endswith("it is left as it was: name another output, or fix or remove "
                             "those lines; nothing was sent")
    assert snapshot(output) == before
    assert not lock_path(output).exists()


def test_what_a_refusal_says(tmp_path: Path, config: str) -> None:
    prompts = prompts_file(tmp_path, 2)
    output = tmp_path / "output.jsonl"
    output.write_bytes(dumps_bytes(_record(1)) + b"oops\n" + dumps_bytes(_record(2))
                       + b'{"id": 3}\n')
    _, _, err = batch(prompts, output, config)
    assert err == (f"fanout batch: -o {output}: not a fanout results file: 2 of its 4 lines "
                   "are not records (1 line is not JSON: line 2); it is left as it was: name "
                   "another output, or fix or remove those lines; nothing was sent\n")


def test_the_prompts_file_by_another_name_is_refused(tmp_path: Path, config: str) -> None:
    prompts = prompts_file(tmp_path, 3)
    copy = tmp_path / "copy.jsonl"
    shutil.copy(prompts, copy)
    before = snapshot(copy)
    status, _, err = batch(prompts, copy, config)
    assert status == 2
    assert "3 of its 3 lines are not records (3 lines are not fanout records: lines 1, 2, 3 " \
           "(line 1: no model, sample, outcome, content_key))" in err
    assert snapshot(copy) == before


def test_an_empty_file_is_a_new_results_file(tmp_path: Path, config: str) -> None:
    prompts = prompts_file(tmp_path, 2)
    output = tmp_path / "results.jsonl"
    output.write_bytes(b"")
    assert batch(prompts, output, config)[0] == 0
    assert len(keys(output)) == 2


def _real_lines(tmp_path: Path, config: str) -> tuple[Path, Path, list[bytes]]:
    prompts = prompts_file(tmp_path, 3)
    output = tmp_path / "results.jsonl"
    assert batch(prompts, output, config)[0] == 0
    return prompts, output, output.read_bytes().splitlines(keepends=True)


@pytest.mark.parametrize("cut", [1, 2, 5, 6, 7, 12, 20, 40, -2])
def test_a_torn_last_line_is_cut_wherever_it_tore(tmp_path: Path, config: str,
                                                  cut: int) -> None:
    prompts, output, lines = _real_lines(tmp_path, config)
    output.write_bytes(b"".join(lines[:2]) + lines[2][:cut])
    status, _, err = batch(prompts, output, config)
    assert status == 0, err
    torn = len(lines[2][:cut])
    assert (f"cut off a torn last line ({torn} bytes, from an interrupted run) before "
            "appending") in err
    rows = output.read_bytes().splitlines(keepends=True)
    assert rows[:2] == lines[:2] and len(rows) == 3
    assert all(json.loads(row) for row in rows)


def test_a_torn_first_line_is_a_results_file_too(tmp_path: Path, config: str) -> None:
    prompts, output, lines = _real_lines(tmp_path, config)
    output.write_bytes(lines[0][:30])  # the first write of a run that was killed
    status, _, err = batch(prompts, output, config)
    assert status == 0 and "cut off a torn last line (30 bytes" in err
    assert len(keys(output)) == 3


def test_every_prefix_of_a_record_line_counts_as_torn() -> None:
    hostile = _record(1, text="a\ud800b \u202e\x1b[2J é 👍", parsed=2**70)
    lines = [orjson.dumps(_record(1, text="é 👍")) + b"\n", dumps_bytes(hostile),
             dumps_bytes({**_record(1), "id": 7}), json.dumps(_record(2)).encode() + b"\n"]
    for line in lines:
        for end in range(1, len(line) - 1):
            parsed = list(scan(io.BytesIO(line[:end])))
            assert len(parsed) == 1 and (parsed[0].torn or parsed[0].record is not None), \
                (line[:end], parsed)
    for other in (b"{\"prompt\": 1", b'{"id": "q1", "prompt": "x', b'{"id": 7, "modex',
                  b"\xff\xfe", b'{"id": "q\x01', b"[1, 2", b"hello"):
        assert not _starts_a_record(other)
