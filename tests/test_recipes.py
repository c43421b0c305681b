"""The README's recipes (examples/) against the embedded upstream, over loopback.

Each server runs in the test's nursery on port 0; the disconnect tests assert
that the upstream's connections are closed within a second of the client
leaving (``stats.wait_for`` under ``fail_after``), the only timing bound here.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import trio
from trio_websocket import ConnectionClosed, wrap_client_stream

import fanout
from fanout.upstream import RunningUpstream

EXAMPLES = Path(__file__).parent.parent / "examples"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"recipe_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


websocket_server = load("websocket_server")

# Every outcome a client must see a result for: completed, tool calls, cut mid-event.
FULL_RUN = ["mock/fast", "mock/tools", "mock/reasoning:0.001", "fault/truncate"]
# Slow enough (>= 30 tokens at 20-60 ms, or 50 ms) that the client leaves mid-stream.
SLOW = ["mock/slow", "mock/fast:0.05"]
# Silent after 3 chunks, socket open: with nothing to send, only a watcher sees the client go.
SILENT = ["fault/stall:3"]
LEAVING = pytest.mark.parametrize("models", [SLOW, SILENT], ids=["streaming", "silent"])


def endpoint(upstream: RunningUpstream) -> fanout.Endpoint:
    return fanout.Endpoint(upstream.base_url)


def check_full_run(records: list[dict[str, Any]], models: list[str]) -> None:
    results = [r for r in records if r["type"] == "result"]
    assert sorted(r["stream"] for r in results) == sorted(models)  # one each
    for model in models:
        mine = [r for r in records if r["stream"] == model]
        assert mine[0]["type"] == "started" and mine[-1]["type"] == "result"
        assert all(isinstance(r["t"], float) for r in mine)
    outcomes = {r["stream"]: r["outcome"] for r in results}
    assert outcomes == {"mock/fast": "completed", "mock/tools": "completed",
                        "mock/reasoning:0.001": "completed", "fault/truncate": "truncated"}
    tools = next(r for r in results if r["stream"] == "mock/tools")
    assert tools["choices"][0]["tool_calls"]


async def connections_closed(upstream: RunningUpstream) -> None:
    with trio.fail_after(1):
        await upstream.stats.wait_for(lambda s: s.connections_open == 0)


def streaming(records: list[dict[str, Any]], models: list[str]) -> bool:
    """Every model has sent text (so every stream is mid-stream)."""
    return {r["stream"] for r in records if r["type"] == "text"} == set(models)


# -- WebSocket: one fan-out per connection -------------------------------------------------

async def test_websocket_server_streams_every_model_to_its_result(
        upstream: RunningUpstream, nursery: trio.Nursery) -> None:
    server = await nursery.start(partial(websocket_server.serve, endpoint(upstream), port=0))
    with trio.fail_after(10):
        records = await websocket_server.demo_client("127.0.0.1", server.port, "Rivers?",
                                                     FULL_RUN)
    check_full_run(records, FULL_RUN)


@LEAVING
@pytest.mark.parametrize("leave", ["close", "reset"])
async def test_websocket_client_leaving_mid_stream_cancels_the_fanout(
        upstream: RunningUpstream, nursery: trio.Nursery, leave: str, models: list[str]
        ) -> None:
    server = await nursery.start(partial(websocket_server.serve, endpoint(upstream), port=0))
    records: list[dict[str, Any]] = []
    with trio.fail_after(10):
        async with (await trio.open_tcp_stream("127.0.0.1", server.port) as tcp,
                    trio.open_nursery() as client):
            ws = await wrap_client_stream(client, tcp, "127.0.0.1", "/")
            await ws.send_message(json.dumps({"prompt": "Rivers?", "models": models}))
            while not streaming(records, models):
                records.append(json.loads(await ws.get_message()))
            assert upstream.stats.connections_open == len(models)
            if leave == "close":
                await ws.aclose()  # a close frame, as a browser tab sends
            else:
                await tcp.aclose()  # the TCP connection just goes away
    assert not [r for r in records if r["type"] == "result"]  # it did leave mid-stream
    await connections_closed(upstream)


async def test_websocket_server_refuses_a_bad_job(upstream: RunningUpstream,
                                                  nursery: trio.Nursery) -> None:
    server = await nursery.start(partial(websocket_server.serve, endpoint(upstream), port=0))
    with trio.fail_after(5):
        async with (await trio.open_tcp_stream("127.0.0.1", server.port) as tcp,
                    trio.open_nursery() as client):
            ws = await wrap_client_stream(client, tcp, "127.0.0.1", "/")
            await ws.send_message(json.dumps({"prompt": "hi", "models": ["a", "a"]}))
            with pytest.raises(ConnectionClosed) as closed:
                await ws.get_message()
    assert closed.value.reason is not None and closed.value.reason.code == 1008
    assert upstream.stats.requests == {}


# -- The scripts themselves, as a reader runs them ----------------------------------------

@pytest.mark.parametrize("script, args, expected", [
    ("websocket_server.py", ["--demo", "--models", "mock/fast", "fault/truncate"],
     ["mock/fast            completed", "fault/truncate       truncated"]),
])
def test_the_recipe_scripts_run_with_no_key_and_no_network(
        script: str, args: list[str], expected: list[str]) -> None:
    out = subprocess.run([sys.executable, "-X", "dev", str(EXAMPLES / script), *args],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for text in expected:
        assert text in out.stdout, out.stdout
    assert "Warning" not in out.stderr and "Traceback" not in out.stderr, out.stderr
