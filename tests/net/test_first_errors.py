"""The first errors a real endpoint gives, each saying what to do: no key was sent, nothing
listens at the base URL (or its host does not resolve), a base URL without the route, a model
the endpoint does not know.  Over loopback against the embedded upstream (with a key when
it needs one), and a closed port; the DNS failure through a scripted transport."""

from __future__ import annotations

import errno
import socket
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
from trio.testing import MockClock

from fanout import Endpoint, Outcome, RetryPolicy, StreamRequest, run_fanout
from fanout.upstream import RunningUpstream, open_upstream
from tests.net.scripted import Script, raises

KEY = "sk-first-hour-SECRET-42"
MESSAGES = [{"role": "user", "content": "hi"}]
ONCE = RetryPolicy(attempts=1)


@pytest.fixture
async def keyed(watchdog: None) -> AsyncIterator[RunningUpstream]:
    async with open_upstream(key=KEY) as upstream:
        yield upstream


async def reason(endpoint: Endpoint, model: str = "mock/fast", api: str = "chat") -> str:
    results = await run_fanout(endpoint, [StreamRequest("s", model, MESSAGES, api=api)],
                               retry=ONCE)
    result = results["s"]
    assert result.outcome is Outcome.ERROR
    assert result.reason is not None
    return result.reason


@pytest.mark.parametrize("api", ["chat", "responses", "anthropic"])
async def test_no_key_sent_and_a_401_says_no_key_was_sent(keyed: RunningUpstream,
                                                          api: str) -> None:
    text = await reason(Endpoint(keyed.base_url), api=api)
    assert text.startswith("HTTP 401: no API key was sent: set OPENAI_API_KEY or [endpoint] "
                           "api_key_env (the server said: ")
    # A key sent and refused is the server's own word: no "no key" advice.
    wrong = await reason(Endpoint(keyed.base_url, "sk-wrong-key-0"), api=api)
    assert "no API key" not in wrong and wrong.startswith("HTTP 401: ")
    assert "sk-wrong-key-0" not in wrong
    assert await reason_ok(Endpoint(keyed.base_url, KEY), api)


async def reason_ok(endpoint: Endpoint, api: str) -> bool:
    results = await run_fanout(endpoint, [StreamRequest("s", "mock/fast", MESSAGES, api=api)])
    return results["s"].outcome is Outcome.COMPLETED


@pytest.mark.parametrize(("api", "route"), [("chat", "/chat/completions"),
                                            ("responses", "/responses"),
                                            ("anthropic", "/messages")])
async def test_a_base_url_without_the_route_says_which_route_and_suggests_v1(
        upstream: RunningUpstream, api: str, route: str) -> None:
    root = upstream.base_url.removesuffix("/v1")
    text = await reason(Endpoint(root), api=api)
    assert text == (f"HTTP 404: {root}{route} answered 404: no such route; the base URL "
                    f"probably needs /v1: try {root}/v1")
    # Already ending in /v1: no such suggestion.
    text = await reason(Endpoint(upstream.base_url + "/v1"), api=api)
    assert text == (f"HTTP 404: {upstream.base_url}/v1{route} answered 404: no such route; "
                    "is base_url right?")
    # The route pasted into the base URL: it is added again, and the advice says so.
    text = await reason(Endpoint(upstream.base_url + route), api=api)
    assert text == (f"HTTP 404: {upstream.base_url}{route}{route} answered 404: no such "
                    f"route; leave {route} out of base_url (fanout adds "
                    "the route; it ends with /v1)")


async def test_an_unknown_model_says_the_endpoint_does_not_know_it(
        upstream: RunningUpstream) -> None:
    text = await reason(Endpoint(upstream.base_url), "gpt-4o")
    assert text.startswith("HTTP 404: the endpoint does not know model 'gpt-4o'; "
                           "`fanout models` lists what it offers (the server said: The model "
                           "'gpt-4o' does not exist.")


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port  # nothing listens there now: connections are refused


@pytest.mark.parametrize("base", ["http://127.0.0.1:{port}/v1",
                                  "http://user:sk-in-the-url-7@127.0.0.1:{port}/v1?k=sk-q-8"])
async def test_a_refused_connection_says_run_again_once_the_server_runs(
        watchdog: None, base: str) -> None:
    port = closed_port()
    results = await run_fanout(Endpoint(base.format(port=port), KEY),
                               [StreamRequest("s", "gpt-4o", MESSAGES)],
                               retry=RetryPolicy(attempts=2, initial=0.01))
    result = results["s"]
    assert result.outcome is Outcome.ERROR and len(result.attempts) == 2  # retried
    assert result.reason == (f"cannot connect to http://127.0.0.1:{port}/v1: is the server "
                             "running, is base_url right? run the same command again once it "
                             "is (connection refused)")
    assert "will not help" not in repr(result)
    for secret in (KEY, "sk-in-the-url-7", "sk-q-8"):
        assert secret not in (result.reason or "")


def name_error() -> httpx.ConnectError:
    exc = httpx.ConnectError("[Errno -2] Name or service not known")
    exc.__cause__ = socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    return exc


def unreachable() -> httpx.ConnectError:
    exc = httpx.ConnectError("All connection attempts failed")
    exc.__cause__ = OSError(errno.EHOSTUNREACH, "No route to host")
    return exc


@pytest.mark.parametrize(("error", "why"), [
    (name_error, "host name not found: Name or service not known"),
    (unreachable, "no route to host")])
async def test_a_host_that_cannot_be_reached_says_so(
        autojump_clock: MockClock, error: Callable[[], httpx.ConnectError], why: str) -> None:
    script = Script([raises(error())])
    async with script.client() as client:
        results = await run_fanout(Endpoint("https://relay.invalid/v1", KEY),
                                   [StreamRequest("s", "m", MESSAGES)], client=client,
                                   retry=ONCE)
    assert results["s"].reason == ("cannot connect to https://relay.invalid/v1: is the server "
                                   "running, is base_url right? run the same command again "
                                   f"once it is ({why})")


@pytest.mark.parametrize(("model", "body", "expected"), [
    # A short id is inside every message: only the whole id names it.
    ("a", "404 page not found", "https://relay.invalid/chat/completions answered 404: no such "
     "route; the base URL probably needs /v1: try https://relay.invalid/v1"),
    ("llama3", '{"error": "llama3 not found, try pulling it first"}',
     "the endpoint does not know model 'llama3'; `fanout models` lists what it offers (the "
     "server said: llama3 not found, try pulling it first)"),
])
async def test_a_404_names_the_model_only_by_its_whole_id(
        autojump_clock: MockClock, model: str, body: str, expected: str) -> None:
    script = Script([lambda _: httpx.Response(404, text=body)])
    async with script.client() as client:
        results = await run_fanout(Endpoint("https://relay.invalid", KEY),
                                   [StreamRequest("s", model, MESSAGES)], client=client,
                                   retry=ONCE)
    assert results["s"].reason == f"HTTP 404: {expected}"
