"""The README's recipes (examples/) against the embedded upstream, over loopback.

Each server runs in the test's nursery on port 0; the disconnect tests assert
that the upstream's connections are closed after the client leaves
(``stats.wait_for`` under a ``fail_after`` hang guard: the streams would not end
by themselves), never how fast.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections import Counter
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
import trio
import trio.testing
from hypercorn.config import Config
from hypercorn.trio import serve
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
worker = load("worker")
starlette_app = load("starlette_app")

# Every outcome a client must see a result for: completed, tool calls, cut mid-event.
FULL_RUN = ["mock/fast", "mock/tools", "mock/reasoning:0.001", "fault/truncate"]
# Text that never ends by itself (a delta every 20 or 50 ms): the client leaves mid-stream,
# and only its leaving can close these connections.
SLOW = ["fault/endless:0.02", "fault/endless:0.05"]
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
    with trio.fail_after(10):  # a hang guard
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


# -- The worker: accept_more, submit, forget -----------------------------------------------

@pytest.mark.watchdog(180)  # 500 streams: a hang guard, never a speed bound
async def test_worker_handles_500_jobs_once_each_with_results_bounded(
        upstream: RunningUpstream) -> None:
    concurrency, backlog, total = 32, 8, 500
    handled: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    peak_results = peak_streams = 0
    fans: list[fanout.Fanout] = []

    async def handle(job: Any, result: fanout.StreamResult) -> None:
        nonlocal peak_results, peak_streams
        handled[job.id] += 1
        outcomes[str(result.outcome)] += 1
        fan = fans[0]
        peak_results = max(peak_results, len(fan.results))
        peak_streams = max(peak_streams, len(fan.running) + len(fan.queued))
        assert result.stream == job.id

    # A burst: every job is waiting before the worker starts.
    send, receive = trio.open_memory_channel[Any](total)
    with send:
        for number in range(total):
            send.send_nowait(worker.Job(f"job-{number}", "mock/fast", "Rivers?", 3))

    with trio.fail_after(120):  # a hang guard
        async with trio.open_nursery() as nursery:
            fans.append(await nursery.start(partial(
                worker.run_worker, endpoint(upstream), receive, handle,
                concurrency=concurrency, backlog=backlog)))
    assert len(handled) == total and set(handled.values()) == {1}
    assert outcomes == {"completed": total}
    # While it ran: forget() kept the results flat (without it, all 500 stay until the end),
    # and the worker's own bound kept the streams submitted and not yet handled in check.
    assert peak_results <= concurrency + backlog
    assert peak_streams <= concurrency + backlog
    fan = fans[0]
    assert not fan.results and not fan.running and not fan.queued
    assert sum(upstream.stats.requests.values()) == total


async def test_worker_takes_only_as_many_jobs_as_it_has_room_for(
        upstream: RunningUpstream) -> None:
    # Streams that never answer: nothing finishes, so nothing frees room.
    concurrency, backlog, total = 8, 2, 100
    send, receive = trio.open_memory_channel[Any](total)
    for number in range(total):
        send.send_nowait(worker.Job(f"job-{number}", "fault/no-response", "Rivers?"))
    stop = trio.Event()
    handled: Counter[str] = Counter()

    async def handle(job: Any, result: fanout.StreamResult) -> None:
        handled[str(result.outcome)] += 1

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            fan = await nursery.start(partial(
                worker.run_worker, endpoint(upstream), receive, handle,
                concurrency=concurrency, backlog=backlog, stop=stop, grace=0))
            await upstream.stats.wait_for(lambda s: sum(s.requests.values()) == concurrency)
            await trio.testing.wait_all_tasks_blocked(cushion=0.05)
            assert (len(fan.running), len(fan.queued)) == (concurrency, backlog)
            assert receive.statistics().current_buffer_used == total - concurrency - backlog
            stop.set()  # the hung streams are cancelled; each still reaches handle
    assert handled == {"cancelled": concurrency + backlog}
    assert sum(upstream.stats.requests.values()) == concurrency
    await connections_closed(upstream)


async def test_worker_stop_takes_no_more_jobs_and_loses_none(
        upstream: RunningUpstream) -> None:
    stop = trio.Event()
    handled: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    produced: list[str] = []

    async def handle(job: Any, result: fanout.StreamResult) -> None:
        handled[job.id] += 1
        outcomes[str(result.outcome)] += 1
        if sum(handled.values()) == 5:
            stop.set()  # SIGTERM, say: the streams in flight get `grace` (0 s), then cancelled

    send, receive = trio.open_memory_channel[Any](16)

    async def produce() -> None:
        for number in range(200):
            job = worker.Job(f"job-{number}", "mock/fast:0.02", "Rivers?", 10)
            await send.send(job)  # blocks for good once the worker has stopped
            produced.append(job.id)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(produce)
            await worker.run_worker(endpoint(upstream), receive, handle, concurrency=8,
                                    backlog=2, stop=stop, grace=0)
            nursery.cancel_scope.cancel()
    left = []
    while True:
        try:
            left.append(receive.receive_nowait().id)
        except trio.WouldBlock:
            break
    assert set(handled.values()) == {1}
    assert sorted([*handled, *left]) == sorted(produced)  # none lost, none twice
    assert len(handled) < len(produced)  # it did stop early
    assert set(outcomes) <= {"completed", "cancelled"} and outcomes["cancelled"] > 0
    await connections_closed(upstream)


# -- Starlette on Hypercorn's trio worker --------------------------------------------------

async def start_app(nursery: trio.Nursery, upstream: RunningUpstream, **options: Any
                    ) -> tuple[str, trio.Event]:
    config = Config()
    config.bind = ["127.0.0.1:0"]
    stop = trio.Event()
    app: Any = starlette_app.make_app(endpoint(upstream), **options)
    binds: list[str] = await nursery.start(partial(serve, app, config,
                                                   shutdown_trigger=stop.wait))
    return binds[0], stop


async def test_starlette_app_streams_every_model_to_its_result(
        upstream: RunningUpstream) -> None:
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            url, stop = await start_app(nursery, upstream)
            records = await starlette_app.demo_client(url, "Rivers?", FULL_RUN)
            stop.set()  # a graceful shutdown: the lifespan closes the shared client
    check_full_run(records, FULL_RUN)


async def test_starlette_app_shares_one_client_and_a_pool_wait_is_queueing(
        upstream: RunningUpstream) -> None:
    # One connection for the whole app: two requests of two streams each take turns on it.
    models = ["mock/fast:0.01", "mock/fast:0.005"]
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            url, stop = await start_app(nursery, upstream, max_connections=1)
            runs = [await starlette_app.demo_client(url, "Rivers?", models) for _ in range(2)]
            stop.set()
    assert upstream.stats.connections_opened == 1  # one pool, kept alive across fan-outs
    for records in runs:
        results = [r for r in records if r["type"] == "result"]
        assert [r["outcome"] for r in results] == ["completed", "completed"]
        # The stream that waited for the connection waited in the queue, not for a token.
        assert max(r["metrics"]["queue_wait"] for r in results) > 0


@LEAVING
async def test_starlette_client_leaving_mid_stream_cancels_the_fanout(
        upstream: RunningUpstream, models: list[str]) -> None:
    records: list[dict[str, Any]] = []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            url, stop = await start_app(nursery, upstream)
            decoder = fanout.SSEDecoder()
            async with (httpx.AsyncClient() as http,
                        http.stream("POST", f"{url}/compare",
                                    json={"prompt": "Rivers?", "models": models}) as response):
                assert response.headers["content-type"].startswith("text/event-stream")
                # Leave by cancelling: the cancel lands inside httpx's iterators and closes
                # them all (a break would leave them to the GC: httpx #3686).
                with trio.CancelScope() as leave:
                    async for chunk in response.aiter_bytes():
                        for sse in decoder.feed(chunk):
                            record = json.loads(sse.data)
                            assert sse.event == record["type"]
                            records.append(record)
                        if streaming(records, models):
                            leave.cancel()
                assert upstream.stats.connections_open == len(models)
            # The response and the client are closed: the client has left.
            assert not [r for r in records if r["type"] == "result"]
            await connections_closed(upstream)
            stop.set()


async def test_starlette_app_refuses_a_bad_job(upstream: RunningUpstream) -> None:
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            url, stop = await start_app(nursery, upstream)
            async with httpx.AsyncClient() as http:
                response = await http.post(f"{url}/compare", content=b"{")
            stop.set()
    assert response.status_code == 400 and "error" in response.json()
    assert upstream.stats.requests == {}


# -- The scripts themselves, as a reader runs them ----------------------------------------

@pytest.mark.parametrize("script, args, expected", [
    ("websocket_server.py", ["--demo", "--models", "mock/fast", "fault/truncate"],
     ["mock/fast            completed", "fault/truncate       truncated"]),
    ("starlette_app.py", ["--demo", "--models", "mock/fast", "fault/truncate"],
     ["mock/fast            completed", "fault/truncate       truncated"]),
    ("worker.py", ["--jobs", "300"], ["300 jobs in ", "{'completed': 300}"]),
])
def test_the_recipe_scripts_run_with_no_key_and_no_network(
        script: str, args: list[str], expected: list[str]) -> None:
    out = subprocess.run([sys.executable, "-X", "dev", str(EXAMPLES / script), *args],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for text in expected:
        assert text in out.stdout, out.stdout
    assert "Warning" not in out.stderr and "Traceback" not in out.stderr, out.stderr
