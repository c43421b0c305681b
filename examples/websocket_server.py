"""A WebSocket server that owns one fan-out per client connection.

    python examples/websocket_server.py            # embedded upstream; serves ws://127.0.0.1:8765
    python examples/websocket_server.py --demo     # the same, plus one client; prints, then exits
    OPENAI_API_KEY=sk-... python examples/websocket_server.py --base-url https://relay.example/v1

The protocol: the client sends one JSON message, ``{"prompt": "...", "models": ["...", ...]}``;
the server answers with one JSON message per event, the records of ``fanout compare --json``
(``fanout.records.event_record``), each stream's last one its ``result``; then it closes the
connection.  A client that goes away mid-stream cancels its fan-out at once: the upstream
connections close within milliseconds, and no model keeps generating for nobody.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import httpx
import trio
from trio_websocket import (
    ConnectionClosed,
    WebSocketConnection,
    WebSocketRequest,
    WebSocketServer,
    serve_websocket,
    wrap_client_stream,
)

import fanout
from fanout.records import event_record
from fanout.upstream import open_upstream

MAX_MODELS = 16
PARAMS = {"max_tokens": 300}


def parse_job(message: str | bytes) -> list[fanout.StreamRequest]:
    """``{"prompt": ..., "models": [...]}`` -> one stream request per model (``ValueError``)."""
    job = json.loads(message)  # a ValueError too
    prompt = job.get("prompt") if isinstance(job, dict) else None
    models = job.get("models") if isinstance(job, dict) else None
    if not isinstance(prompt, str) or not prompt:
        raise ValueError("prompt must be a non-empty string")
    if (not isinstance(models, list) or not 0 < len(models) <= MAX_MODELS
            or not all(isinstance(m, str) and m for m in models) or len(set(models)) < len(models)):
        raise ValueError(f"models must be a list of 1 to {MAX_MODELS} different model names")
    messages = [{"role": "user", "content": prompt}]
    return [fanout.StreamRequest(model, model, messages, PARAMS) for model in models]


async def handle(request: WebSocketRequest, endpoint: fanout.Endpoint,
                 client: httpx.AsyncClient) -> None:
    """One connection: read the job, stream its fan-out back, close.

    Two tasks in one nursery: ``forward`` sends the events, ``watch`` reads the
    socket.  When the client leaves, ``watch`` sees it at once, even while no
    model is sending anything (a reasoning model may think silently for a
    minute), and cancels the nursery, and with it the fan-out.  A send that
    finds the connection closed ends it too.  Nothing outlives the connection.
    """
    ws = await request.accept()
    try:
        requests = parse_job(await ws.get_message())
    except ConnectionClosed:
        return
    except ValueError as error:
        await ws.aclose(code=1008, reason=str(error)[:100])  # 1008: policy violation
        return
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch, ws, nursery.cancel_scope)
            await forward(ws, endpoint, client, requests)
            nursery.cancel_scope.cancel()  # everything sent: stop watching
    except* ConnectionClosed:
        # A send found the client gone.  Raised inside the fan-out's block, it arrives
        # wrapped in this handler's nursery's exception group: except* unwraps it.
        pass
    # Returning closes the connection (trio-websocket sends a normal close, 1000).
    # Any other exception would stop the whole server (the handlers run in its
    # nursery): a real server logs it here and carries on.


async def forward(ws: WebSocketConnection, endpoint: fanout.Endpoint,
                  client: httpx.AsyncClient, requests: list[fanout.StreamRequest]) -> None:
    start = trio.current_time()
    # client=: one pool for every connection of the server (fanout leaves it open).
    async with fanout.open_fanout(endpoint, requests, client=client) as fan:
        async for event in fan.events:
            record = event_record(event)
            record["t"] = round(trio.current_time() - start, 6)  # as `compare --json` does
            await ws.send_message(json.dumps(record, ensure_ascii=False))


async def watch(ws: WebSocketConnection, scope: trio.CancelScope) -> None:
    """Read until the connection closes, then cancel ``scope``.

    Reading also keeps trio-websocket's reader moving: its queue holds one
    message, and a reader stuck on a full queue sees neither pings nor the close.
    """
    try:
        while True:
            await ws.get_message()  # the client has nothing more to say: ignore it
    except ConnectionClosed:
        scope.cancel()


async def serve(endpoint: fanout.Endpoint, host: str = "127.0.0.1", port: int = 8765, *,
                max_connections: int = 64,
                task_status: trio.TaskStatus[WebSocketServer] = trio.TASK_STATUS_IGNORED
                ) -> None:
    """Serve until cancelled; ``task_status.started`` gets the server (``.port``)."""
    # One HTTP client for the whole server, made once and closed once: every
    # fan-out shares its pool (a wait for one of its connections is queueing).
    async with fanout.make_client(max_connections) as client:
        await serve_websocket(partial(handle, endpoint=endpoint, client=client), host, port,
                              None, task_status=task_status)


async def demo_client(host: str, port: int, prompt: str, models: list[str]
                      ) -> list[dict[str, Any]]:
    """Send one job; print each stream's outcome as its result arrives; return the records."""
    records = []
    # The TCP stream is ours, so it is closed whichever side closes the WebSocket first
    # (trio-websocket 0.12's open_websocket_url leaves its socket open when the server does).
    async with await trio.open_tcp_stream(host, port) as tcp, trio.open_nursery() as nursery:
        ws = await wrap_client_stream(nursery, tcp, host, "/")
        await ws.send_message(json.dumps({"prompt": prompt, "models": models}))
        try:
            while True:
                record = json.loads(await ws.get_message())
                records.append(record)
                if record["type"] == "result":
                    print(f"{record['stream']:20} {record['outcome']:10} {record['text'][:50]!r}")
        except ConnectionClosed:
            pass  # the server closes once every stream has ended
    return records


@asynccontextmanager
async def endpoint_for(base_url: str | None) -> AsyncIterator[fanout.Endpoint]:
    """The relay at ``base_url`` (key: ``$OPENAI_API_KEY``), else the embedded upstream."""
    if base_url:
        yield fanout.Endpoint(base_url, os.environ.get("OPENAI_API_KEY"))
    else:
        async with open_upstream() as upstream:
            yield fanout.Endpoint(upstream.base_url)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL"),
                        help="a real relay (default: $OPENAI_BASE_URL, else the embedded one)")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--demo", action="store_true", help="run one client, then exit")
    parser.add_argument("--models", nargs="+", default=["mock/fast:0.02", "mock/reasoning:0.02",
                                                        "fault/truncate"])
    args = parser.parse_args()
    async with endpoint_for(args.base_url) as endpoint, trio.open_nursery() as nursery:
        server: WebSocketServer = await nursery.start(
            partial(serve, endpoint, port=0 if args.demo else args.port))
        print(f"serving ws://127.0.0.1:{server.port} (streams from {endpoint.base_url})")
        if args.demo:
            await demo_client("127.0.0.1", server.port, "Tell me about rivers.", args.models)
            nursery.cancel_scope.cancel()


if __name__ == "__main__":
    trio.run(main)
