"""`fanout mock` as a user runs it: a subprocess on loopback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from fanout import Outcome, parse_stream
from fanout.upstream import MODELS
from tests.captures import names
from tests.helpers import interrupt, sigint_default

COMMAND = [sys.executable, "-m", "fanout.cli.main", "mock"]


@pytest.fixture
def mock_process() -> Iterator[tuple[subprocess.Popen[str], str]]:
    process = subprocess.Popen([*COMMAND, "--port", "0", "--key", "sk-cli-test"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=sigint_default)
    try:
        assert process.stdout is not None
        base_url = process.stdout.readline().strip()
        yield process, base_url
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=10)


def test_mock_prints_its_url_and_streams(mock_process: tuple[subprocess.Popen[str], str]) -> None:
    _, base_url = mock_process
    assert base_url.startswith("http://127.0.0.1:") and base_url.endswith("/v1")
    with httpx.Client(base_url=base_url, timeout=10) as http:
        response = http.post("/chat/completions", headers={"authorization": "Bearer sk-cli-test"},
                             json={"model": "mock/fast", "stream": True,
                                   "messages": [{"role": "user", "content": "hi"}]})
        refused = http.get("/models")
    assert parse_stream([response.content]).outcome is Outcome.COMPLETED
    assert refused.status_code == 401


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_mock_stops_cleanly(mock_process: tuple[subprocess.Popen[str], str],
                            signum: signal.Signals) -> None:
    process, _ = mock_process
    interrupt(process, signum)
    _, stderr = process.communicate(timeout=10)
    assert process.returncode == 0
    assert "Traceback" not in stderr
    assert "sk-cli-test" not in stderr  # the key is never printed


def test_mock_list_names_every_model() -> None:
    out = subprocess.run([*COMMAND, "--list"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0
    lines = out.stdout.splitlines()
    # a continuation of a wrapped description is indented under it (27 columns)
    listed = {line.split()[0] for line in lines if not line.startswith(" " * 27)}
    replays = {f"replay/{name}" for name in names()}
    assert set(MODELS) | {"replay/<capture>"} | replays == listed
    assert "  replay/15_interrupted_first" in out.stdout  # every capture, by name


@pytest.mark.parametrize("columns", [60, 80, 120])
def test_mock_list_wraps_at_word_boundaries(columns: int) -> None:
    out = subprocess.run([*COMMAND, "--list"], capture_output=True, text=True, timeout=30,
                         env={**os.environ, "COLUMNS": str(columns)})
    lines = out.stdout.splitlines()
    assert out.returncode == 0 and max(map(len, lines)) <= columns
    assert any(line.startswith(" " * 27) for line in lines)  # something did wrap
    # the words are the descriptions' own, none cut: joined back they give each one whole
    text = " ".join(" ".join(lines).split())
    for spec in MODELS.values():
        routes = f" [{spec.routes} only]" if spec.routes else ""
        assert f"{spec.id} {' '.join((spec.description + routes).split())}" in text


def test_fanout_version() -> None:
    import fanout.core

    out = subprocess.run([sys.executable, "-m", "fanout.cli.main", "--version"],
                         capture_output=True, text=True, timeout=30)
    core = "compiled with mypyc" if fanout.core.COMPILED else "pure Python"
    assert (out.returncode, out.stdout) == (0, f"fanout {fanout.__version__} (core: {core})\n")


def test_compare_help_says_embedded_model_ids_work() -> None:
    out = subprocess.run([sys.executable, "-m", "fanout.cli.main", "compare", "--help"],
                         capture_output=True, text=True, timeout=30, env={"COLUMNS": "200"})
    assert "mock/..., fault/..., replay/<capture>" in out.stdout


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--fragment", "chunky"], "fanout mock: --fragment: unknown fragment mode 'chunky'"),
        (["--cadence", "-1"], "fanout mock: --cadence: -1.0 is negative"),
        (["--captures", "/no/such/dir"], "fanout mock: --captures: /no/such/dir is not a directory"),
    ],
)
def test_bad_options_get_one_line_errors(arguments: list[str], message: str) -> None:
    out = subprocess.run([*COMMAND, *arguments], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    assert out.stderr.startswith(message)
    assert out.stderr.count("\n") == 1  # one line


def test_a_reader_that_goes_away_gets_no_traceback() -> None:
    """``fanout mock --list | head -1``: the rest is not written, nothing on stderr, exit 1."""
    import subprocess
    import sys

    process = subprocess.Popen([sys.executable, "-m", "fanout.cli.main", "mock", "--list"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               bufsize=0)
    assert process.stdout is not None and process.stderr is not None
    first = process.stdout.read(64)
    process.stdout.close()  # the reader goes away after its first line
    with process.stderr:
        stderr = process.stderr.read().decode()
    assert process.wait(timeout=60) == 1
    assert first.startswith(b"mock/")
    assert stderr == ""
