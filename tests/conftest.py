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


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "watchdog(seconds): this loopback test's hang guard, when the default "
        f"{WATCHDOG_SECONDS} s is too short for its work on a loaded machine")


@pytest.fixture
async def watchdog(nursery: trio.Nursery, request: pytest.FixtureRequest) -> None:
    marker = request.node.get_closest_marker("watchdog")
    seconds = marker.args[0] if marker else WATCHDOG_SECONDS

    async def bark() -> None:
        await trio.sleep(seconds)
        raise TimeoutError(f"a loopback test ran longer than {seconds} s")

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
