"""Fixtures for tests that talk to the embedded upstream over real loopback sockets.

Policy: loopback only, port 0, a watchdog on every test, never the autojump
clock (it fires spurious timeouts with real sockets).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import trio

from fanout.upstream import RunningUpstream, serve_upstream

WATCHDOG_SECONDS = 20


@pytest.fixture
async def watchdog(nursery: trio.Nursery) -> None:
    async def bark() -> None:
        await trio.sleep(WATCHDOG_SECONDS)
        raise TimeoutError(f"a loopback test ran longer than {WATCHDOG_SECONDS} s")

    nursery.start_soon(bark)


@pytest.fixture
async def upstream(nursery: trio.Nursery, watchdog: None) -> RunningUpstream:
    running: RunningUpstream = await nursery.start(serve_upstream)
    return running


@pytest.fixture
async def client(upstream: RunningUpstream) -> AsyncIterator[httpx.AsyncClient]:
    timeout = httpx.Timeout(connect=5, read=None, write=5, pool=None)
    async with httpx.AsyncClient(base_url=upstream.base_url, timeout=timeout) as http:
        yield http
