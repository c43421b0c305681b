"""Fixtures of the service tests: the embedded upstream (from the root conftest) and the
service on loopback in front of it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from fanout.upstream import RunningUpstream

from .helpers import Served, serving


@pytest.fixture
async def served(upstream: RunningUpstream) -> AsyncIterator[Served]:
    async with serving(upstream) as running:
        yield running
