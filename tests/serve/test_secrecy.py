"""The upstream key never leaves: not in any byte of any response, header or log line.

The upstream echoes the bearer token it gets in every place it can
(``fault/echo-key:WHERE``); every route is called, streamed and not, and every
byte that comes back (status line fields, headers, body) is searched.
"""

from __future__ import annotations

import logging
from functools import partial

import httpx
import pytest
import trio

from fanout.upstream import RunningUpstream, serve_upstream
from fanout.upstream.models import ECHO_PLACES

from .helpers import serving

KEY = "sk-upstream-SERVE-secret-5e6f7a8b9c0d"
CLIENT_TOKEN = "svc-client-token-0011223344"


def every_byte(response: httpx.Response) -> bytes:
    head = b"".join(name + b": " + value + b"\r\n" for name, value in response.headers.raw)
    return str(response.status_code).encode() + b"\r\n" + head + b"\r\n" + response.content


async def test_the_upstream_key_reaches_no_response_header_or_log_line(
        nursery: trio.Nursery, watchdog: None, caplog: pytest.LogCaptureFixture) -> None:
    # Every level of the service's own loggers and Hypercorn's; INFO and up of the rest
    # (httpcore's opt-in DEBUG trace prints response headers as a server sent them).
    caplog.set_level(logging.INFO)
    for name in ("fanout", "hypercorn"):
        caplog.set_level(logging.DEBUG, logger=name)
    upstream: RunningUpstream = await nursery.start(partial(serve_upstream, key=KEY))
    models = [f"fault/echo-key:{where}" for where in ECHO_PLACES]
    messages = [{"role": "user", "content": "hi"}]
    responses: list[httpx.Response] = []
    async with serving(upstream, api_key=KEY, keys=(CLIENT_TOKEN,)) as served, \
            served.client(authorization=f"Bearer {CLIENT_TOKEN}") as client:
        with trio.fail_after(30):
            for stream in (True, False):
                responses.append(await client.post("/v1/fanout", json={
                    "messages": messages, "models": models, "stream": stream}))
                for model in models:
                    responses.append(await client.post("/v1/chat/completions", json={
                        "model": model, "messages": messages, "stream": stream,
                        "stream_options": {"include_usage": True}}))
            for path in ("/", "/static/app.js", "/static/app.css", "/v1/models", "/v1/status",
                         "/healthz", "/nothing"):
                responses.append(await client.get(path))
            responses.append(await client.post("/v1/fanout/fo-nope/cancel"))
            async with httpx.AsyncClient(base_url=served.url) as anonymous:
                responses.append(await anonymous.get("/v1/models"))  # a 401
    sent = b"".join(every_byte(response) for response in responses)
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert sent.count(KEY.encode()) == 0
    assert KEY not in logged
    assert sent.count(b"***") > 20  # it was echoed, and replaced
    assert upstream.stats.requests  # the upstream did get requests with the key
    assert {r.status_code for r in responses} >= {200, 401, 404, 502}
