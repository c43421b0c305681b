"""Request values: validation at construction, retry waits, the content key, the client."""

from __future__ import annotations

import email.utils
import random

import httpx
import pytest

from fanout import Deadlines, Endpoint, RetryPolicy, StreamRequest, make_client
from fanout.net.transport import SHARD_SIZE, ShardedTransport

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Endpoint("relay.example/v1"), "must start with http:// or https://"),
        (lambda: Deadlines(idle=0), "idle must be a positive number"),
        (lambda: Deadlines(total=-1), "total must be a positive number"),
        (lambda: Deadlines(first_token=float("nan")), "first_token must be a positive number"),
        (lambda: StreamRequest("", "m", MESSAGES), "key must be a non-empty string"),
        (lambda: StreamRequest("k", "m", []), "stream 'k': messages must not be empty"),
        (lambda: StreamRequest("k", "m", ["hi"]), r"messages\[0\] must be a mapping"),
        (lambda: StreamRequest("k", "m", MESSAGES, {"stream": False}), "must not set 'stream'"),
        (lambda: RetryPolicy(attempts=0), "attempts"),
    ],
)
def test_bad_values_fail_at_construction_naming_the_field(build: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()  # type: ignore[operator]


def test_endpoint_strips_the_trailing_slash_and_hides_the_key() -> None:
    endpoint = Endpoint("http://relay/v1/", "sk-hidden-123")
    assert endpoint.chat_url == "http://relay/v1/chat/completions"
    assert "sk-hidden-123" not in repr(endpoint)
    assert endpoint.redact("echo sk-hidden-123!") == "echo ***!"


def test_retry_after_forms() -> None:
    policy = RetryPolicy(max_retry_after=30)
    assert policy.retry_after({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    assert policy.retry_after({"retry-after": "2"}) == 2.0
    assert policy.retry_after({"retry-after": "600"}) == 30  # capped
    now = 1_700_000_000.0  # an HTTP date is counted from now: exact, whatever the clock
    date = email.utils.formatdate(now + 10, usegmt=True)
    assert policy.retry_after({"retry-after": date}, now=now) == 10
    assert policy.retry_after({"retry-after": date}, now=now + 4.5) == 5.5
    assert policy.retry_after({"retry-after": date}, now=now + 60) == 0  # past: at once
    assert policy.retry_after({"retry-after": date}, now=now - 600) == 30  # capped
    assert policy.retry_after({"retry-after": "soon"}) is None
    assert policy.retry_after({}) is None


def test_retry_after_counts_a_date_from_the_clock_by_default(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    import fanout.request

    now = 1_700_000_000.0  # the module's clock, not the process's, is the one stopped
    monkeypatch.setattr(fanout.request, "time", types.SimpleNamespace(time=lambda: now))
    date = email.utils.formatdate(now + 7, usegmt=True)
    assert RetryPolicy(max_retry_after=30).retry_after({"retry-after": date}) == 7


def test_backoff_doubles_to_the_maximum() -> None:
    policy = RetryPolicy(initial=0.5, maximum=3, jitter=False)
    assert [policy.backoff(n, random.Random(0)) for n in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 3.0]


def test_content_key_is_stable_and_never_includes_the_key() -> None:
    request = StreamRequest("k", "m", MESSAGES, {"temperature": 0})
    one = request.content_key(Endpoint("http://relay/v1", "sk-a"))
    assert one == request.content_key(Endpoint("http://relay/v1", "sk-b"))  # the key is no part
    assert one != StreamRequest("k", "m", MESSAGES, {"temperature": 1}).content_key(
        Endpoint("http://relay/v1", "sk-a"))


async def test_make_client_shards_above_the_shard_size() -> None:
    async with make_client(10) as small:
        transport = small._transport
        assert isinstance(transport, ShardedTransport) and len(transport.transports) == 1
        assert isinstance(transport.transports[0], httpx.AsyncHTTPTransport)
        assert isinstance(transport.fresh, httpx.AsyncHTTPTransport)  # for stale re-sends
    async with make_client(SHARD_SIZE * 3 + 1) as big:
        transport = big._transport
        assert isinstance(transport, ShardedTransport) and len(transport.transports) == 4
        assert big.follow_redirects is False
        assert big.timeout.read is None and big.timeout.pool is None
    with pytest.raises(ValueError, match="max_connections"):
        make_client(0)
