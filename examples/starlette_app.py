"""Fan-outs behind an HTTP API: Starlette on Hypercorn's trio worker, in Server-Sent Events.

    python examples/starlette_app.py            # embedded upstream; serves http://127.0.0.1:8000
    curl -N http://127.0.0.1:8000/compare \\
        -d '{"prompt": "Tell me about rivers.", "models": ["mock/slow", "mock/reasoning"]}'
    python examples/starlette_app.py --demo     # the same, plus one request (httpx), then exit
    OPENAI_API_KEY=sk-... python examples/starlette_app.py --base-url https://relay.example/v1

``POST /compare`` takes ``{"prompt": "...", "models": [...]}`` and answers with one
Server-Sent Event per fan-out event: ``event:`` is the record's type, ``data:`` the
record of ``fanout compare --json`` (``fanout.records.event_record``); each stream's
last event is its ``result``.  A client that goes away mid-stream cancels the fan-out.

Starlette runs on trio through anyio, so the app can use trio directly.  One
``httpx.AsyncClient`` (``fanout.make_client``) is made at startup and shared by
every request's fan-out.
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
from hypercorn.config import Config
from hypercorn.trio import serve
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

import fanout
from fanout.records import event_record
from fanout.upstream import open_upstream

MAX_MODELS = 16
PARAMS = {"max_tokens": 300}


def parse_job(body: bytes) -> list[fanout.StreamRequest]:
    """``{"prompt": ..., "models": [...]}`` -> one stream request per model (``ValueError``)."""
    job = json.loads(body)  # a ValueError too
    prompt = job.get("prompt") if isinstance(job, dict) else None
    models = job.get("models") if isinstance(job, dict) else None
    if not isinstance(prompt, str) or not prompt:
        raise ValueError("prompt must be a non-empty string")
    if (not isinstance(models, list) or not 0 < len(models) <= MAX_MODELS
            or not all(isinstance(m, str) and m for m in models) or len(set(models)) < len(models)):
        raise ValueError(f"models must be a list of 1 to {MAX_MODELS} different model names")
    messages = [{"role": "user", "content": prompt}]
    return [fanout.StreamRequest(model, model, messages, PARAMS) for model in models]


class FanoutEvents(Response):
    """One fan-out, streamed as Server-Sent Events.

    The fan-out lives in this response's own task, beside a task that waits
    for the client's ``http.disconnect``; whichever ends first cancels the
    other.  (Not a ``StreamingResponse`` over an async generator that opens the
    fan-out: Starlette leaves such a generator suspended, not closed, when the
    client leaves while it sends, and the fan-out's nursery, still open inside
    it, corrupts trio's nursery stack.  See the README.)
    """

    media_type = "text/event-stream"
    client_left = False

    def __init__(self, endpoint: fanout.Endpoint, client: httpx.AsyncClient,
                 requests: list[fanout.StreamRequest]) -> None:
        self.endpoint, self.client, self.requests = endpoint, client, requests
        self.status_code = 200
        self.background = None
        # No content-length (the body is open-ended); no caching proxy holds events back.
        self.init_headers({"cache-control": "no-cache", "x-accel-buffering": "no"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": self.raw_headers})
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.watch, receive, nursery.cancel_scope)
            await self.forward(send)
            nursery.cancel_scope.cancel()  # every event sent: stop watching
        if not self.client_left:
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def watch(self, receive: Receive, scope: trio.CancelScope) -> None:
        # The request body is read already: what comes now is the disconnect.
        while (await receive())["type"] != "http.disconnect":
            pass
        self.client_left = True
        scope.cancel()

    async def forward(self, send: Send) -> None:
        start = trio.current_time()
        # client=: the app's shared client; the fan-out does not close it.
        async with fanout.open_fanout(self.endpoint, self.requests, client=self.client) as fan:
            async for event in fan.events:
                record = event_record(event)
                record["t"] = round(trio.current_time() - start, 6)  # as `compare --json` does
                # json.dumps escapes every newline: one event, one data: line.
                data = json.dumps(record, ensure_ascii=False)
                frame = f"event: {record['type']}\ndata: {data}\n\n"
                await send({"type": "http.response.body", "body": frame.encode(),
                            "more_body": True})


def make_app(endpoint: fanout.Endpoint, *, max_connections: int = 64) -> Starlette:
    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Any]]:
        # One client for the app's life, shared by every fan-out: one pool of
        # connections to the relay, closed once at shutdown.
        async with fanout.make_client(max_connections) as client:
            yield {"http_client": client}  # lifespan state: request.state.http_client

    async def compare(request: Request) -> Response:
        try:
            requests = parse_job(await request.body())
        except ValueError as error:
            return JSONResponse({"error": str(error)}, status_code=400)
        return FanoutEvents(endpoint, request.state.http_client, requests)

    return Starlette(routes=[Route("/compare", compare, methods=["POST"])], lifespan=lifespan)


async def demo_client(url: str, prompt: str, models: list[str]) -> list[dict[str, Any]]:
    """POST one job; print each stream's outcome as its result arrives; return the records."""
    records = []
    decoder = fanout.SSEDecoder()  # fanout's own incremental SSE parser
    async with httpx.AsyncClient(timeout=httpx.Timeout(10, read=None)) as http, http.stream(
            "POST", f"{url}/compare", json={"prompt": prompt, "models": models}) as response:
        response.raise_for_status()
        async for chunk in response.aiter_bytes():
            for sse in decoder.feed(chunk):
                record = json.loads(sse.data)
                records.append(record)
                if sse.event == "result":
                    print(f"{record['stream']:20} {record['outcome']:10} {record['text'][:50]!r}")
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
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--demo", action="store_true", help="send one request, then exit")
    parser.add_argument("--models", nargs="+", default=["mock/fast:0.02", "mock/reasoning:0.02",
                                                        "fault/truncate"])
    args = parser.parse_args()
    config = Config()
    config.bind = [f"127.0.0.1:{0 if args.demo else args.port}"]
    stop = trio.Event()
    async with endpoint_for(args.base_url) as endpoint, trio.open_nursery() as nursery:
        # serve() reports the addresses it bound ("http://127.0.0.1:PORT") once it listens,
        # and shuts down gracefully when shutdown_trigger returns.
        # (Hypercorn's ASGI types are narrower than the Starlette app's call signature.)
        app: Any = make_app(endpoint)
        binds: list[str] = await nursery.start(partial(serve, app, config,
                                                       shutdown_trigger=stop.wait))
        print(f"serving {binds[0]}/compare (streams from {endpoint.base_url})")
        if args.demo:
            await demo_client(binds[0], "Tell me about rivers.", args.models)
            stop.set()


if __name__ == "__main__":
    trio.run(main)
