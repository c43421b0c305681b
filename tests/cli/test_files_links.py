"""No file fanout writes is written through a link, into a pipe or over a file it did
not make: the lock files, the results and scores files, the ``--html`` page and its
temporary file.  A symbolic link (dangling or not), a directory or a pipe planted at
any of those names is one line naming it, exit 2; the link and what it points to are
left byte for byte as they were.  Real files in tmp dirs, through the commands."""

from __future__ import annotations

import io
import json
import os
import random
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fanout import files
from fanout.cli.batch import BatchOptions, run_batch
from fanout.cli.report import report
from fanout.cli.score import ScoreOptions, run_score
from fanout.store.results import ResultsFile, holder_of, lock_path
from fanout.store.scores import scores_path

CONFIG = """
[endpoint]
base_url = "embedded"

[deadlines]
idle = 3
total = 30

[[models]]
name = "fast"
id = "mock/fast"
"""

#: What a planted link points to: a big file of someone else's (the size of the report's).
VICTIM_SIZE = 588_895


@pytest.fixture
def config(tmp_path: Path) -> str:
    path = tmp_path / "fanout.toml"
    path.write_text(CONFIG)
    return str(path)


@pytest.fixture
def victim(tmp_path: Path) -> Iterator[Path]:
    """A file elsewhere that a link may point to; checked unchanged after the test."""
    (tmp_path / "elsewhere").mkdir()
    path = tmp_path / "elsewhere" / "precious.bin"
    data = random.Random(19).randbytes(VICTIM_SIZE)
    path.write_bytes(data)
    before = path.stat()
    yield path
    after = path.stat()
    assert path.read_bytes() == data
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (
        before.st_size, before.st_mtime_ns, before.st_ino)


def prompts_file(tmp_path: Path, count: int = 2) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"Question {i}?",
                                        "expected": "x"}) + "\n" for i in range(count)))
    return path


def batch(tmp_path: Path, config: str, output: Path, **options: Any) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = run_batch(BatchOptions(prompts=str(prompts_file(tmp_path)), output=str(output),
                                    models=("fast",), config=config, **options),
                       stdout=out, stderr=err, environ={})
    return status, out.getvalue(), err.getvalue()


def score(results: Path, config: str, **options: Any) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = run_score(ScoreOptions(results=str(results), scorers=("exact",), config=config,
                                    **options), stdout=out, stderr=err)
    return status, out.getvalue(), err.getvalue()


def html(results: Path, target: Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = report(str(results), as_json=False, html=str(target), stdout=out, stderr=err)
    return status, out.getvalue(), err.getvalue()


def one_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    return lines[0]


# What can be planted at a name, and what the one line then says of it.
def plant_link(path: Path, victim: Path) -> str:
    path.symlink_to(victim)
    return f"a symbolic link to '{victim}'"


def plant_dangling(path: Path, victim: Path) -> str:
    target = victim.parent / "not-yet.bin"
    path.symlink_to(target)
    return f"a symbolic link to '{target}'"


def plant_fifo(path: Path, victim: Path) -> str:
    os.mkfifo(path)
    return "a pipe"


def plant_directory(path: Path, victim: Path) -> str:
    path.mkdir()
    return "a directory"


PLANTS: dict[str, Callable[[Path, Path], str]] = {
    "link": plant_link, "dangling link": plant_dangling, "pipe": plant_fifo,
    "directory": plant_directory}


def still_there(path: Path, plant: str, victim: Path) -> None:
    """What was planted at ``path`` is as it was."""
    if plant == "link":
        assert path.is_symlink() and os.readlink(path) == str(victim)
    elif plant == "dangling link":
        assert path.is_symlink() and not path.exists()
    elif plant == "pipe":
        assert path.is_fifo()
    else:
        assert path.is_dir() and not any(path.iterdir())


def no_leftovers(directory: Path, *expected: str) -> None:
    assert sorted(p.name for p in directory.iterdir()) == sorted(expected)


# ------------------------------------------------------------------ the lock files

@pytest.mark.parametrize("plant", PLANTS)
def test_batch_refuses_what_is_planted_at_the_lock(tmp_path: Path, config: str, victim: Path,
                                                   plant: str) -> None:
    output = tmp_path / "run" / "results.jsonl"
    output.parent.mkdir()
    kind = PLANTS[plant](lock_path(output), victim)
    status, out, err = batch(tmp_path, config, output)
    assert status == 2 and out == ""
    assert one_line(err) == (
        f"fanout batch: -o {output}: its lock file {lock_path(output)} is {kind} (it is "
        "left as it was): fanout writes no file through a link and removes only its own; "
        "remove it, or name another output; nothing was sent")
    still_there(lock_path(output), plant, victim)
    assert output.read_bytes() == b""  # created empty, nothing sent


@pytest.mark.parametrize("plant", PLANTS)
def test_score_refuses_what_is_planted_at_the_scores_lock(tmp_path: Path, config: str,
                                                          victim: Path, plant: str) -> None:
    output = tmp_path / "results.jsonl"
    assert batch(tmp_path, config, output)[0] == 0
    scores = scores_path(output)
    kind = PLANTS[plant](lock_path(scores), victim)
    status, out, err = score(output, config)
    assert status == 2 and out == ""
    assert one_line(err) == (
        f"fanout score: --scores {scores}: its lock file {lock_path(scores)} is {kind} (it is "
        "left as it was): fanout writes no file through a link and removes only its own; "
        "remove it, or name another output; nothing was scored")
    still_there(lock_path(scores), plant, victim)


def test_batch_score_refuses_a_link_at_the_scores_lock(tmp_path: Path, config: str,
                                                       victim: Path) -> None:
    output = tmp_path / "results.jsonl"
    lock = lock_path(scores_path(output))
    lock.symlink_to(victim)
    status, _, err = batch(tmp_path, config, output, scorers=("exact",))
    assert status == 2
    assert one_line(err).startswith(f"fanout batch: --scores {scores_path(output)}: its lock "
                                    f"file {lock} is a symbolic link to '{victim}' ")
    assert os.readlink(lock) == str(victim)
    assert not lock_path(output).exists()  # the results file's own lock: removed


def test_a_file_at_the_lock_that_is_not_a_lock_is_refused(tmp_path: Path, config: str) -> None:
    output = tmp_path / "results.jsonl"
    lock_path(output).write_bytes(b"my notes, not a lock\n")
    status, _, err = batch(tmp_path, config, output)
    assert status == 2
    assert f"its lock file {lock_path(output)} is not a lock file of fanout's" in one_line(err)
    assert lock_path(output).read_bytes() == b"my notes, not a lock\n"


@pytest.mark.parametrize("content", [b"", b'{"pid": 999999, "host": "gone", "started": "x"}\n'])
def test_a_stale_lock_of_a_run_that_died_is_replaced(tmp_path: Path, config: str,
                                                     content: bytes) -> None:
    # A run killed with SIGKILL leaves its lock file (empty if killed while writing it).
    output = tmp_path / "results.jsonl"
    lock_path(output).write_bytes(content)
    seen: list[dict[str, Any]] = []
    original = ResultsFile._say_who

    def spy(self: ResultsFile) -> None:
        original(self)
        seen.append(json.loads(lock_path(self.path).read_bytes()))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ResultsFile, "_say_who", spy)
        status, _, err = batch(tmp_path, config, output)
    assert status == 0, err
    assert seen[0]["pid"] == os.getpid()
    assert not lock_path(output).exists()


def test_the_lock_is_removed_only_while_it_is_the_one_made(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    writer = ResultsFile(path)
    made = json.loads(lock_path(path).read_bytes())
    assert made["pid"] == os.getpid()
    lock_path(path).unlink()  # someone put another file in its place meanwhile
    lock_path(path).write_bytes(b"another\n")
    writer.close()
    assert lock_path(path).read_bytes() == b"another\n"


def test_the_lock_replaced_by_a_link_is_not_followed_at_the_end(tmp_path: Path,
                                                               victim: Path) -> None:
    path = tmp_path / "r.jsonl"
    writer = ResultsFile(path)
    lock_path(path).unlink()
    lock_path(path).symlink_to(victim)
    writer.close()
    assert os.readlink(lock_path(path)) == str(victim)


@pytest.mark.parametrize("plant", PLANTS)
def test_who_holds_a_lock_is_never_read_through_a_link_or_a_pipe(
        tmp_path: Path, victim: Path, plant: str) -> None:
    victim_text = tmp_path / "elsewhere" / "lock.json"
    victim_text.write_text('{"pid": 1, "host": "planted", "started": "then"}')
    where = tmp_path / "r.jsonl.lock"
    kind = PLANTS[plant](where, victim_text)
    done = threading.Event()  # reading a pipe would wait for a writer: it must not
    said: list[str] = []
    reader = threading.Thread(target=lambda: (said.append(holder_of(where)), done.set()),
                              daemon=True)
    reader.start()
    assert done.wait(30)
    assert said == [f"who holds it is not known: {where} is {kind}"]


# ------------------------------------------------------------ results and scores

@pytest.mark.parametrize("plant", ["link", "dangling link"])
def test_batch_refuses_a_link_as_the_results_file(tmp_path: Path, config: str, victim: Path,
                                                  plant: str) -> None:
    output = tmp_path / "results.jsonl"
    kind = PLANTS[plant](output, victim)
    status, out, err = batch(tmp_path, config, output)
    assert status == 2 and out == ""
    assert one_line(err) == (
        f"fanout batch: -o {output}: is {kind}: fanout writes no file through a link (it is "
        "left as it was); name the file itself; nothing was sent")
    still_there(output, plant, victim)
    assert not lock_path(output).exists()


@pytest.mark.parametrize("plant", PLANTS)
def test_score_refuses_what_is_planted_as_the_scores_file(tmp_path: Path, config: str,
                                                          victim: Path, plant: str) -> None:
    output = tmp_path / "results.jsonl"
    assert batch(tmp_path, config, output)[0] == 0
    scores = scores_path(output)
    kind = PLANTS[plant](scores, victim)
    status, out, err = score(output, config)
    assert status == 2 and out == ""
    line = one_line(err)
    if plant == "directory":
        assert line == (f"fanout score: --scores {scores}: cannot open for writing: Is a "
                        "directory; nothing was scored")
    elif plant == "pipe":
        assert line.startswith(f"fanout score: --scores {scores}: not a regular file (a pipe)")
    else:
        assert line == (f"fanout score: --scores {scores}: is {kind}: fanout writes no file "
                        "through a link (it is left as it was); name the file itself; "
                        "nothing was scored")
    still_there(scores, plant, victim)
    assert not lock_path(scores).exists()


def test_a_link_to_the_prompts_is_still_called_the_prompts_file(tmp_path: Path,
                                                                config: str) -> None:
    prompts = prompts_file(tmp_path)
    output = tmp_path / "results.jsonl"
    output.symlink_to(prompts)
    out, err = io.StringIO(), io.StringIO()
    status = run_batch(BatchOptions(prompts=str(prompts), output=str(output), models=("fast",),
                                    config=config), stdout=out, stderr=err, environ={})
    assert status == 2
    assert one_line(err.getvalue()) == (f"fanout batch: -o {output}: is the prompts file "
                                        f"{prompts} (the same file); name another output; "
                                        "nothing was sent")


# ------------------------------------------------------------------ the --html page

@pytest.fixture
def results(tmp_path: Path, config: str) -> Path:
    output = tmp_path / "run" / "results.jsonl"
    output.parent.mkdir()
    assert batch(tmp_path, config, output)[0] == 0
    return output


@pytest.mark.parametrize("plant", PLANTS)
def test_html_refuses_what_is_planted_at_the_page(tmp_path: Path, results: Path, victim: Path,
                                                  plant: str) -> None:
    page_victim = victim.parent / "page.html"  # a page, so only the link can be the reason
    page_victim.write_bytes(b"<!doctype html>\n<p>someone's page</p>\n")
    target = tmp_path / "out" / "report.html"
    target.parent.mkdir()
    kind = PLANTS[plant](target, page_victim if plant == "link" else victim)
    status, out, err = html(results, target)
    assert status == 2 and out == ""
    line = one_line(err)
    if plant.endswith("link"):
        assert line == (f"fanout report: --html {target}: is {kind}: fanout writes no file "
                        "through a link (it is left as it was); name the file itself")
    else:
        assert line == (f"fanout report: --html {target}: not a regular file ({kind}); name "
                        "a file to write the page to")
    still_there(target, plant, page_victim if plant == "link" else victim)
    assert page_victim.read_bytes() == b"<!doctype html>\n<p>someone's page</p>\n"
    no_leftovers(target.parent, "report.html")


def test_html_skips_a_temporary_name_that_is_taken(tmp_path: Path, results: Path,
                                                   victim: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "out" / "report.html"
    target.parent.mkdir()
    tokens = iter(["planted", "dangling", "fifo", "fresh"])
    monkeypatch.setattr(files.secrets, "token_hex", lambda _: next(tokens))
    planted = {name: target.parent / f".report.html.{name}.tmp"
               for name in ("planted", "dangling", "fifo")}
    planted["planted"].symlink_to(victim)
    planted["dangling"].symlink_to(victim.parent / "not-yet.bin")
    os.mkfifo(planted["fifo"])
    status, _, err = html(results, target)
    assert status == 0, err
    assert target.read_text().startswith("<!doctype html>")
    assert os.readlink(planted["planted"]) == str(victim)
    assert not (victim.parent / "not-yet.bin").exists()
    assert planted["fifo"].is_fifo()
    no_leftovers(target.parent, "report.html", *(p.name for p in planted.values()))


def test_html_replaces_its_own_page_and_leaves_nothing_behind(tmp_path: Path,
                                                              results: Path) -> None:
    target = tmp_path / "out" / "report.html"
    target.parent.mkdir()
    assert html(results, target)[0] == 0
    first = target.stat()
    assert html(results, target)[0] == 0  # a page: replaced, by a new file
    assert target.stat().st_ino != first.st_ino
    assert oct(target.stat().st_mode & 0o777) == oct(0o666 & ~_umask())
    no_leftovers(target.parent, "report.html")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# ------------------------------------------------------------------ the helpers

@pytest.mark.parametrize("plant", PLANTS)
def test_open_append_opens_only_a_regular_file(tmp_path: Path, victim: Path,
                                               plant: str) -> None:
    path = tmp_path / "f"
    kind = PLANTS[plant](path, victim)
    error = IsADirectoryError if plant == "directory" else files.NotRegularFile
    with pytest.raises(error) as caught:
        files.open_append(path)
    if plant != "directory":
        assert caught.value.strerror == f"not a regular file: {kind}"
    still_there(path, plant, victim)


@pytest.mark.parametrize("plant", PLANTS)
def test_create_new_never_opens_what_is_there(tmp_path: Path, victim: Path,
                                              plant: str) -> None:
    path = tmp_path / "f"
    PLANTS[plant](path, victim)
    with pytest.raises(FileExistsError):
        files.create_new(path)
    still_there(path, plant, victim)


def test_a_file_swapped_in_before_opening_is_checked_after_opening(
        tmp_path: Path, victim: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The check before opening can be raced; the fstat after it cannot.
    path = tmp_path / "f"
    real_open = os.open

    def swap_then_open(name: Any, flags: int, mode: int = 0o777) -> int:
        if Path(name) == path and not path.exists():
            os.mkfifo(path)
        return real_open(name, flags, mode)

    monkeypatch.setattr(files.os, "open", swap_then_open)
    with pytest.raises(files.NotRegularFile, match="a pipe"):
        files.open_append(path)
    assert path.is_fifo()
