"""A server that echoes the key everywhere it can, against the commands users run:
`fanout compare --json`, the plain compare view, `fanout batch` (its results file
and its summary) and `fanout report`.  The key must appear zero times in any byte
written to stdout, stderr or a file; and it was echoed (``***`` shows where)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fanout.upstream.models import ECHO_PLACES
from tests.helpers import fanout_mock

KEY = "sk-echo-CLI-test-9f8e7d6c5b4a3210"
FANOUT = [sys.executable, "-m", "fanout.cli.main"]


@pytest.fixture
def mock_url() -> Iterator[str]:
    with fanout_mock("--port", "0", "--key", KEY) as base_url:
        yield base_url


def write_config(path: Path, base_url: str) -> Path:
    models = "".join(f'[[models]]\nname = "echo-{where}"\nid = "fault/echo-key:{where}"\n\n'
                     for where in ECHO_PLACES)
    names = ", ".join(f'"echo-{where}"' for where in ECHO_PLACES)
    path.write_text(f'[endpoint]\nbase_url = "{base_url}"\napi_key_env = "FANOUT_ECHO_KEY"\n\n'
                    f"[deadlines]\ntotal = 20\n\n[compare]\nmodels = [{names}]\n\n{models}")
    return path


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "FANOUT_ECHO_KEY": KEY, "COLUMNS": "120"}
    return subprocess.run([*FANOUT, *args], cwd=cwd, env=env, capture_output=True, timeout=120,
                          check=False)


def test_the_key_echoed_in_every_place_reaches_no_output(tmp_path: Path, mock_url: str) -> None:
    config = write_config(tmp_path / "echo.toml", mock_url)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": "q1", "prompt": "hi"}\n{"id": "q2", "prompt": "again"}\n')
    results = tmp_path / "results.jsonl"
    outputs = {
        "compare --json": run("compare", "hi", "--json", "--config", str(config), cwd=tmp_path),
        "compare": run("compare", "hi", "--config", str(config), cwd=tmp_path),
        "batch": run("batch", str(prompts), "-o", str(results), "--config", str(config),
                     cwd=tmp_path),
        "report": run("report", str(results), cwd=tmp_path),
        "report --json": run("report", str(results), "--json", cwd=tmp_path),
    }
    written = results.read_bytes()
    counts = {name: (out.stdout + out.stderr).count(KEY.encode())
              for name, out in outputs.items()}
    counts["results file"] = written.count(KEY.encode())
    assert counts == dict.fromkeys(counts, 0)
    for name, out in outputs.items():
        assert b"Traceback" not in out.stderr, (name, out.stderr[-2000:])
    json_lines = outputs["compare --json"].stdout
    assert b"***" in json_lines and b"***" in written  # echoed, and replaced
    assert len(written.splitlines()) == 2 * len(ECHO_PLACES)
