"""Bounded: body size, streams per request, fan-outs at once, the config's caps."""

from __future__ import annotations

import trio

from fanout.upstream import RunningUpstream

from .helpers import SSEReader, ask, make_config, serving


async def test_a_body_over_the_limit_is_a_413(upstream: RunningUpstream) -> None:
    async with serving(upstream, make_config("max_body_bytes = 2000")) as served, \
            served.client() as client:
        big = ask("echo", prompt="x" * 3000)
        with trio.fail_after(10):
            declared = await client.post("/v1/fanout", json=big)

            async def chunked():  # type: ignore[no-untyped-def]
                for _ in range(4):
                    yield b" " * 600  # no content-length: counted as it comes
                yield b"{}"

            streamed = await client.post("/v1/chat/completions", content=chunked())
            fits = await client.post("/v1/fanout", json={**ask("echo"), "stream": False})
    for response in (declared, streamed):
        assert response.status_code == 413
        assert response.json()["error"]["message"] == (
            "the request body is over 2000 bytes (this service's max_body_bytes)")
    assert fits.status_code == 200
    assert served.service.status()["rejected"]["too_large"] == 2


async def test_models_times_samples_is_bounded(upstream: RunningUpstream) -> None:
    async with serving(upstream, make_config("max_streams = 6")) as served, \
            served.client() as client:
        with trio.fail_after(10):
            samples = await client.post("/v1/fanout", json=ask("fast", "echo", samples=4))
            n = await client.post("/v1/fanout", json=ask("fast", "echo", n=4))
            fits = await client.post("/v1/fanout", json={**ask("fast", "echo", samples=3),
                                                         "stream": False})
            chat = await client.post("/v1/chat/completions", json={
                "model": "fast", "n": 7, "messages": [{"role": "user", "content": "hi"}]})
    assert samples.status_code == 400
    assert samples.json()["error"] == {
        "message": "samples: 2 models x 4 samples is 8 streams, over this service's "
                   "max_streams of 6", "type": "invalid_request_error", "param": "samples",
        "code": "too_many_streams"}
    assert n.json()["error"]["message"] == (
        "models: 2 models x 1 samples x n=4 is 8 streams, over this service's max_streams of 6")
    assert fits.status_code == 200 and len(fits.json()["results"]) == 6
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "n"


async def test_fanouts_past_the_limit_get_429_with_retry_after(
        upstream: RunningUpstream) -> None:
    async with serving(upstream, make_config("max_fanouts = 2\nretry_after = 3")) as served, \
            served.client() as client:
        with trio.fail_after(10):
            async with client.stream("POST", "/v1/fanout", json=ask("long")) as first, \
                    client.stream("POST", "/v1/chat/completions", json={
                        "model": "long", "stream": True,
                        "messages": [{"role": "user", "content": "hi"}]}) as second:
                assert first.status_code == second.status_code == 200
                busy = await client.post("/v1/fanout", json=ask("fast"))
                busy_chat = await client.post("/v1/chat/completions", json={
                    "model": "fast", "messages": [{"role": "user", "content": "hi"}]})
                assert served.service.status()["running"]["fanouts"] == 2
                reader = SSEReader(first)
                await reader.until(lambda r: r["type"] == "fanout")
                served.service.fanouts[first.headers["x-fanout-id"]].cancel("test")
                await reader.rest()
                with trio.fail_after(10):  # a hang guard
                    while len(served.service.fanouts) > 1:
                        await trio.sleep(0.01)
                again = await client.post("/v1/fanout", json={**ask("fast"), "stream": False})
                served.service.shutdown()
                await SSEReader(second).rest()
    for response in (busy, busy_chat):
        assert response.status_code == 429
        assert response.headers["retry-after"] == "3"
        error = response.json()["error"]
        assert error["type"] == "rate_limit_error" and error["code"] == "rate_limit_exceeded"
        assert "retry after 3 s" in error["message"]
    assert again.status_code == 200
    assert served.service.status()["rejected"]["busy"] == 2


async def test_the_configs_concurrency_caps_and_deadlines_apply(
        upstream: RunningUpstream) -> None:
    config = make_config(extra="[concurrency]\nper_model = 1\n")
    async with serving(upstream, config) as served, served.client() as client:
        with trio.fail_after(20):
            response = await client.post("/v1/fanout", json={
                **ask("writer", "stalled", samples=2), "stream": False})
    results = {r["stream"]: r for r in response.json()["results"]}
    waits = sorted(results[f"writer#{i}"]["metrics"]["queue_wait"] for i in range(2))
    assert waits[0] < 0.1 < waits[1]  # one at a time: the second waited for the first
    for sample in range(2):
        stalled = results[f"stalled#{sample}"]
        assert stalled["outcome"] == "timed_out" and stalled["timed_out"] == "idle"
