"""Stopping a replica with SIGTERM drains it: new fan-outs are refused (503, with
Retry-After; /healthz 503, so a load balancer moves on), the running ones finish within
the grace (``--grace``, ``[serve] grace``), and those still running after it are
cancelled honestly, every stream with its result."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fanout.serve.service import SHUTDOWN_REASON
from tests.helpers import interrupt, sigint_default

ROOT = Path(__file__).resolve().parents[2]
CONFIG = """
[endpoint]
base_url = "embedded"

[[models]]
name = "slow"
id = "mock/slow:0.05"

[[models]]
name = "endless"
id = "fault/endless:0.02"
"""


def _serve(tmp_path: Path, *grace: str) -> subprocess.Popen[str]:
    config = tmp_path / "fanout.toml"
    config.write_text(CONFIG)
    return subprocess.Popen([sys.executable, "-m", "fanout.cli.main", "serve", "--config",
                             str(config), "--port", "0", *grace], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            preexec_fn=sigint_default)


@pytest.fixture
def serving(tmp_path: Path, request: pytest.FixtureRequest
            ) -> Iterator[tuple[subprocess.Popen[str], str]]:
    process = _serve(tmp_path, *request.param)
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url
        yield process, url
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=10)


def _fan_out_then_stop(process: subprocess.Popen[str], url: str, model: str
                       ) -> tuple[list[dict[str, object]], list[httpx.Response]]:
    """Stream a fan-out of ``model``; at its first text, SIGTERM the replica and ask it
    for a new fan-out and its health (each on a new connection); the records streamed."""
    body = {"messages": [{"role": "user", "content": "Tell me a story."}],
            "models": [model], "stream": True}
    during: list[httpx.Response] = []
    with httpx.Client(base_url=url, timeout=30) as client, \
            client.stream("POST", "/v1/fanout", json=body) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        rest = []
        for line in lines:
            rest.append(line)
            if line.startswith("data: {") and '"type":"text"' in line:
                interrupt(process, signal.SIGTERM)
                break
        with httpx.Client(base_url=url, timeout=10) as other:
            # The stderr line says the drain began: then the refusal is certain.
            assert process.stderr is not None
            said = process.stderr.readline()
            while "stopping:" not in said:
                said = process.stderr.readline()
            during.append(other.post("/v1/fanout", json={**body, "stream": False}))
            during.append(other.get("/healthz"))
        rest += list(lines)
    records = [json.loads(line[6:]) for line in rest if line.startswith("data: {")]
    return records, during


@pytest.mark.parametrize("serving", [("--grace", "30")], indirect=True)
def test_sigterm_lets_a_running_fanout_finish_within_the_grace_and_refuses_new_ones(
        serving: tuple[subprocess.Popen[str], str]) -> None:
    process, url = serving
    records, (refused, health) = _fan_out_then_stop(process, url, "slow")
    results = [r for r in records if r["type"] == "result"]
    assert [(r["stream"], r["outcome"]) for r in results] == [("slow", "completed")]
    assert records[-1]["type"] == "summary"
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "shutting_down"
    assert refused.headers["retry-after"] == "1"
    assert health.status_code == 503
    _, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert "every running fan-out finished" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("serving", [("--grace", "0.5")], indirect=True)
def test_past_the_grace_the_running_fanouts_are_cancelled_each_stream_with_its_result(
        serving: tuple[subprocess.Popen[str], str]) -> None:
    process, url = serving
    records, (refused, _) = _fan_out_then_stop(process, url, "endless")  # never ends
    results = [r for r in records if r["type"] == "result"]
    assert [(r["stream"], r["outcome"], r["reason"]) for r in results] == [
        ("endless", "cancelled", SHUTDOWN_REASON)]
    assert results[0]["text"]  # what had arrived is kept
    assert records[-1]["type"] == "summary"
    assert refused.status_code == 503
    _, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert "the grace ran out; 1 running fan-out cancelled" in err
