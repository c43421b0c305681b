"""The `fanout serve` page (docs/serve.md, and its replicas in docs/scaling-out.md) tells the truth: its Python client and its curl
example run as they are against `fanout serve` on the default config, and what it says
about the record types, limits and errors is what the code does."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator

import pytest

from fanout.config import REPLICA_NAME, ServeConfig
from fanout.records import _TYPES
from fanout.serve.replica import new_fanout_id
from fanout.serve.service import PER_REPLICA
from fanout.upstream import RunningUpstream

from ..docs import ROOT, page, section
from .helpers import serving

SECTION = page("serve.md")
REPLICAS = section(page("scaling-out.md"), "Replicas behind a load balancer")


def block(after: str, language: str, text: str = SECTION) -> str:
    start = text.index(after)
    match = re.compile(rf"```{language}\n(.*?)```", re.S).search(text, start)
    assert match is not None
    return match.group(1)


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    process = subprocess.Popen([sys.executable, "-m", "fanout.cli.main", "serve", "--config",
                                str(ROOT / "config/default.toml"), "--port", "0"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        yield process.stdout.readline().strip().rstrip("/")
    finally:
        process.terminate()
        process.communicate(timeout=15)


def test_the_python_client_runs_as_written(url: str) -> None:
    code = block("A Python client, with httpx", "python").replace("http://127.0.0.1:8080", url)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert "writer: '" in out and "thinker ended completed: ok" in out
    assert "flaky ended truncated: the connection broke after" in out
    assert out.rstrip().endswith("2 of 3 completed")


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl here")
def test_the_curl_example_runs_as_written(url: str) -> None:
    curl = SECTION[SECTION.index("curl -N"):]
    curl = curl[:curl.index("```")].replace("http://127.0.0.1:8080", url).replace("\\\n", "")
    out = subprocess.run(["bash", "-c", curl], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    assert out.startswith("event: fanout\n") and out.endswith("data: [DONE]\n\n")
    assert out.count("event: result\n") == 3 and "event: summary\n" in out


def test_the_record_types_limits_and_errors_are_the_real_ones() -> None:
    for name in _TYPES.values():
        assert f"`{name}`" in SECTION, name
    defaults = ServeConfig()
    for key in ("max_body_bytes", "max_streams", "max_fanouts", "retry_after", "keepalive",
                "keys_env", "cors_origins"):
        assert f"`{key}`" in SECTION, key
    assert f"| `max_streams` | {defaults.max_streams} |" in SECTION
    assert f"| `max_fanouts` | {defaults.max_fanouts} |" in SECTION
    assert f"| `retry_after` | {defaults.retry_after} |" in SECTION
    assert f"| `keepalive` | {defaults.keepalive:g} |" in SECTION
    assert defaults.max_body_bytes == 1024 * 1024 and "| `max_body_bytes` | 1 MiB |" in SECTION
    assert ("models[2]: no model named 'gtp-4o' (did you mean 'gpt-4o'?)" in SECTION)
    assert "cancelled: another stream answered first (mode first)" in SECTION


async def test_the_replicas_section_shows_the_real_status_421_and_haproxy_config(
        upstream: RunningUpstream) -> None:
    replicas = REPLICAS
    status_block = block("## Replicas behind a load balancer", "json", REPLICAS)
    error_block = block("answers **421 Misdirected Request**", "json", REPLICAS)
    haproxy_block = block("`examples/haproxy.cfg` does it", "", REPLICAS)
    assert haproxy_block in (ROOT / "examples" / "haproxy.cfg").read_text()
    async with serving(upstream, replica="web1") as served, served.client() as client:
        status = (await client.get("/v1/status")).json()
        wrong = await client.post(f"/v1/fanout/{new_fanout_id('web2')}/cancel")
    assert wrong.status_code == 421 and wrong.headers["x-fanout-owner"] == "web2"
    assert json.loads(error_block) == wrong.json()
    for key in ("object", "replica", "per_replica", "note"):
        assert f'"{key}": {json.dumps(status[key])}' in status_block, key
    assert status["per_replica"] == list(PER_REPLICA)
    for key in status:  # every part of the status is in the sample
        assert f'"{key}": ' in status_block, key
    assert "| `replica` | host name and port |" in SECTION
    assert REPLICA_NAME.pattern == r"[A-Za-z0-9_-]{1,63}\Z"  # as the section says
    assert "1 to 63 letters, digits, `_` or `-`" in replicas
