"""The direct body reader (h11 over the pool's own socket stream) against httpx's
``aiter_raw``: the same results, the same errors, the connection left to the pool."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

import fanout.net.stream as stream_module
from fanout import Endpoint, Outcome, RetryPolicy, StreamRequest, StreamResult, run_fanout
from fanout.net import body
from fanout.upstream import RunningUpstream

MESSAGES = [{"role": "user", "content": "Say something about rivers."}]
MODELS = ["mock/fast", "mock/reasoning", "mock/tools", "fault/truncate:7",
          "fault/drop-chunked:6", "fault/no-done", "fault/garbage", "fault/bad-utf8",
          "fault/error-event", "fault/empty-200", "fault/gzip", "fault/empty-stop",
          "fault/negative-index", "fault/many-tools:300"]


def _comparable(result: StreamResult) -> dict[str, Any]:
    kept = attrs.asdict(result, recurse=False)
    for varying in ("timings", "attempts", "headers", "content_key", "others_running"):
        kept.pop(varying, None)
    return kept


async def _run(upstream: RunningUpstream, direct: bool, monkeypatch: pytest.MonkeyPatch,
               **options: Any) -> tuple[dict[str, StreamResult], list[bool]]:
    used: list[bool] = []

    def reader(response: Any) -> Any:
        found = body.body_reader(response) if direct else None
        used.append(found is not None)
        return found

    monkeypatch.setattr(stream_module, "body_reader", reader)
    requests = [StreamRequest(f"{model}#{i}", model, MESSAGES, {"seed": i})
                for model in MODELS for i in range(2)]
    results = await run_fanout(Endpoint(upstream.base_url, "sk-body-test"), requests,
                               retry=RetryPolicy(attempts=1), **options)
    return results, used


async def test_the_direct_reader_gives_what_aiter_raw_gives(upstream: RunningUpstream,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    direct, used = await _run(upstream, True, monkeypatch)
    assert used and all(used)  # fanout's own client: every 2xx body read directly
    plain, used = await _run(upstream, False, monkeypatch)
    assert not any(used)
    assert direct.keys() == plain.keys()
    for key in direct:
        assert _comparable(direct[key]) == _comparable(plain[key]), key
    outcomes = {r.outcome for r in direct.values()}
    assert {Outcome.COMPLETED, Outcome.TRUNCATED, Outcome.ERROR} <= outcomes
    cut = direct["fault/drop-chunked:6#0"]
    assert cut.error is not None and "RemoteProtocolError" in cut.error.message


async def test_a_body_read_to_its_end_leaves_its_connection_to_the_pool(
        upstream: RunningUpstream, monkeypatch: pytest.MonkeyPatch) -> None:
    results, used = await _run(upstream, True, monkeypatch, max_concurrency=1)
    assert all(used)
    # One stream at a time: every whole response hands its connection to the next
    # request; only the cut ones (closed by the server or by fanout) need new ones.
    broken = sum(r.outcome is not Outcome.COMPLETED or r.error is not None
                 for r in results.values())
    assert upstream.stats.connections_opened <= 1 + broken + 4
    assert upstream.stats.connections_opened < len(results)
