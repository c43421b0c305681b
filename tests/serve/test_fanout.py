"""``POST /v1/fanout`` over loopback against the embedded upstream."""

from __future__ import annotations

import json

import trio

from fanout import Outcome, StreamResult
from fanout.records import result_record
from fanout.serve.relay import FIRST_REASON, STOP_REASON
from fanout.serve.service import SHUTDOWN_REASON
from fanout.upstream import RunningUpstream

from .helpers import Served, SSEReader, ask, make_config, post_sse, raw_post, read_until, serving


def is_content(*streams: str):  # type: ignore[no-untyped-def]
    kinds = ("text", "reasoning", "tool_call")
    return lambda r: r["type"] in kinds and (not streams or r["stream"] in streams)

RESULT_FIELDS = {"type", "seq", "t", *result_record(StreamResult(Outcome.COMPLETED))}


async def test_the_merged_stream_holds_every_stream_then_one_summary_then_done(
        served: Served) -> None:
    models = ("fast", "writer", "tools", "echo", "short", "flaky")
    async with served.client() as client:
        got = await post_sse(client, "/v1/fanout", ask(*models))
    assert got.status == 200
    assert got.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert got.headers["cache-control"].startswith("no-cache")
    names = [name for name, _ in got.events]
    assert names[0] == "fanout" and names[-2] == "summary" and got.events[-1] == ("message",
                                                                               "[DONE]")
    assert got.raw.endswith(b"data: [DONE]\n\n")
    opening = got.records[0]
    assert [s["stream"] for s in opening["streams"]] == list(models)
    assert opening["id"].startswith(f"fo.{served.service.replica}.")
    assert got.headers["x-fanout-id"] == opening["id"]
    for name, data in got.events[1:-1]:
        assert json.loads(data)["type"] == name  # one event: per record type
    for model in models:
        records = got.of(model)
        assert [r["seq"] for r in records] == list(range(len(records)))
        assert [r["type"] for r in records].count("result") == 1
        assert records[-1]["type"] == "result"  # each stream's last record
        assert records[0]["type"] == "started"
        assert all(r["content_key"] == records[0]["content_key"] for r in records)
        times = [r["t"] for r in records]
        assert times == sorted(times)
    results = got.results()
    assert {m: results[m]["outcome"] for m in models} == {
        "fast": "completed", "writer": "completed", "tools": "completed", "echo": "completed",
        "short": "completed", "flaky": "truncated"}
    assert results["echo"]["text"] == "hi"
    assert results["short"]["choices"][0]["finish_reason"] == "length"
    assert [c["name"] for c in results["tools"]["choices"][0]["tool_calls"]] == [
        "get_weather", "get_time"]
    assert all(c["valid_json"] for c in results["tools"]["choices"][0]["tool_calls"])
    # The text records add up to the result's text: one decoder serves both.
    for model in models:
        streamed = "".join(r["text"] for r in got.of(model) if r["type"] == "text")
        assert streamed == results[model]["text"]
    summary = got.summary()
    assert summary["streams"] == 6 and summary["completed"] == 5
    assert summary["outcomes"] == {"completed": 5, "truncated": 1, "error": 0, "timed_out": 0,
                                   "cancelled": 0}
    assert [row["stream"] for row in summary["results"]] == list(models)
    assert summary["winner"] is None and summary["mode"] == "all"


async def test_records_are_the_shapes_of_compare_json(served: Served) -> None:
    async with served.client() as client:
        got = await post_sse(client, "/v1/fanout", ask("tools", "short"))
    for record in got.records[1:-1]:
        kind = record["type"]
        if kind == "result":
            assert set(record) == RESULT_FIELDS
        assert {"stream", "content_key", "seq", "t"} <= set(record)
    text = next(r for r in got.records if r["type"] == "text")
    assert set(text) == {"type", "stream", "choice", "text", "content_key", "seq", "t"}
    call = next(r for r in got.records if r["type"] == "tool_call")
    assert set(call) == {"type", "stream", "choice", "tool_index", "id", "tool_type", "name",
                         "arguments", "content_key", "seq", "t"}


async def test_failing_streams_keep_their_partial_text_and_disturb_no_other(
        served: Served) -> None:
    async with served.client() as client:
        got = await post_sse(client, "/v1/fanout", ask("fast", "flaky", "broken", "stalled",
                                                     "writer"))
    results = got.results()
    assert results["fast"]["outcome"] == "completed"
    assert results["writer"]["outcome"] == "completed"
    flaky, broken, stalled = results["flaky"], results["broken"], results["stalled"]
    assert flaky["outcome"] == "truncated" and flaky["text"] and "[DONE]" in flaky["reason"]
    assert broken["outcome"] == "error" and broken["text"] and broken["reason"]
    assert any(r["type"] == "error" for r in got.of("broken"))
    assert stalled["outcome"] == "timed_out" and stalled["timed_out"] == "idle"
    assert stalled["text"] and "no event within 1 s" in stalled["reason"]
    assert got.events[-1][1] == "[DONE]"
    assert got.summary()["outcomes"]["completed"] == 2


async def test_samples_tag_each_stream_with_its_sample(served: Served) -> None:
    async with served.client() as client:
        got = await post_sse(client, "/v1/fanout", ask("fast", "echo", samples=3))
    streams = [s["stream"] for s in got.records[0]["streams"]]
    assert streams == ["fast#0", "fast#1", "fast#2", "echo#0", "echo#1", "echo#2"]
    for stream in streams:
        sample = int(stream.rsplit("#", 1)[1])
        assert {r["sample"] for r in got.of(stream)} == {sample}
        assert got.results()[stream]["outcome"] == "completed"
    assert [(row["model"], row["sample"]) for row in got.summary()["results"]] == [
        ("fast", 0), ("fast", 1), ("fast", 2), ("echo", 0), ("echo", 1), ("echo", 2)]


async def test_mode_first_cancels_the_others_when_one_delivers_content(
        served: Served) -> None:
    async with served.client() as client:
        got = await post_sse(client, "/v1/fanout", ask("late", "writer", "long",
                                                     mode="first"), seconds=10)
    results = got.results()
    winner = got.summary()["winner"]
    assert winner in ("writer", "long")
    assert results[winner]["outcome"] == "completed"
    loser = "long" if winner == "writer" else "writer"
    for other in ("late", loser):
        assert results[other]["outcome"] == "cancelled"
        assert results[other]["reason"] == FIRST_REASON
    assert results["late"]["text"] == ""  # it never got to its first token
    assert got.summary()["outcomes"]["cancelled"] == 2


async def test_stream_false_returns_one_document(served: Served) -> None:
    body = ask("echo", "flaky", "short", samples=2)
    body["stream"] = False
    async with served.client() as client:
        with trio.fail_after(20):
            response = await client.post("/v1/fanout", json=body)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    document = response.json()
    assert document["object"] == "fanout"
    assert [r["stream"] for r in document["results"]] == [
        "echo#0", "echo#1", "flaky#0", "flaky#1", "short#0", "short#1"]
    assert all(r["type"] == "result" for r in document["results"])
    assert [r["outcome"] for r in document["results"]] == [
        "completed", "completed", "truncated", "truncated", "completed", "completed"]
    assert document["results"][0]["text"] == "hi" and document["results"][0]["sample"] == 0
    assert document["summary"]["completed"] == 4


async def test_keepalive_comments_fill_silence_and_are_never_data(
        upstream: RunningUpstream) -> None:
    async with serving(upstream, make_config("keepalive = 0.2")) as served, \
            served.client() as client:
        got = await post_sse(client, "/v1/fanout", ask("late"))
    assert got.comments >= 5  # ~3 s before the first token, one every 0.2 s
    assert b": keep-alive\n\n" in got.raw
    assert got.results()["late"]["outcome"] == "completed"
    first_text = got.raw.index(b"event: text")
    assert got.raw.index(b": keep-alive") < first_text
    assert all(data != "" for _, data in got.events)


async def test_a_client_that_disconnects_cancels_every_upstream_stream(
        served: Served) -> None:
    stats = served.upstream.stats
    with trio.fail_after(10):
        client = await raw_post(served.url, "/v1/fanout", ask("long", "long2", "endless"))
        await read_until(client, b'"type":"text","stream":"long"',
                         b'"type":"reasoning","stream":"long2"',
                         b'"type":"text","stream":"endless"')
    assert stats.connections_open == 3
    assert served.service.status()["running"] == {"fanouts": 1, "streams": 3, "queued": 0}
    await client.aclose()  # the client goes away
    with trio.fail_after(10):  # hang guards: the streams never end by themselves
        await stats.wait_for(lambda s: s.connections_open == 0)
    with trio.fail_after(10):
        while served.service.fanouts:
            await trio.sleep(0.01)
    status = served.service.status()
    assert status["running"] == {"fanouts": 0, "streams": 0, "queued": 0}
    assert status["totals"]["outcomes"]["cancelled"] == 3


async def test_the_cancel_route_ends_every_stream_with_its_result(served: Served) -> None:
    async with served.client() as client:
        with trio.fail_after(10):
            async with client.stream("POST", "/v1/fanout", json=ask("long", "fast")) as resp:
                reader = SSEReader(resp)
                await reader.until(is_content("long"))
                await reader.until(lambda r: r["type"] == "result" and r["stream"] == "fast")
                fanout_id = resp.headers["x-fanout-id"]
                cancelled = await client.post(f"/v1/fanout/{fanout_id}/cancel")
                assert cancelled.status_code == 200
                assert cancelled.json()["cancelled"] == ["long"]
                rest = await reader.rest()
    results = rest.results()
    assert results["long"]["outcome"] == "cancelled"
    assert results["long"]["reason"] == STOP_REASON.replace("{id}", fanout_id)
    assert results["long"]["text"]  # the partial text stays
    assert rest.events[-1][1] == "[DONE]" and rest.summary()["outcomes"]["cancelled"] == 1
    async with served.client() as client:
        gone = await client.post(f"/v1/fanout/{fanout_id}/cancel")
    assert gone.status_code == 404 and gone.json()["error"]["param"] == "id"


async def test_shutdown_cancels_running_fanouts_and_each_stream_still_ends(
        served: Served) -> None:
    async with served.client() as client:
        with trio.fail_after(10):
            async with client.stream("POST", "/v1/fanout", json=ask("long", "long2")) as resp:
                reader = SSEReader(resp)
                await reader.until(is_content())
                assert served.service.shutdown() == 1
                rest = await reader.rest()
            refused = await client.post("/v1/fanout", json=ask("fast"))
            health = await client.get("/healthz")
    assert {r["outcome"] for r in rest.results().values()} == {"cancelled"}
    assert {r["reason"] for r in rest.results().values()} == {SHUTDOWN_REASON}
    assert rest.events[-1][1] == "[DONE]"
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
    assert health.status_code == 503


async def test_status_counts_what_runs_and_the_outcomes_since_start(served: Served) -> None:
    async with served.client() as client:
        await post_sse(client, "/v1/fanout", ask("fast", "flaky"))
        await post_sse(client, "/v1/fanout", ask("echo", samples=2))
        with trio.fail_after(10):
            status = (await client.get("/v1/status")).json()
    assert status["running"] == {"fanouts": 0, "streams": 0, "queued": 0}
    assert status["totals"]["fanouts"] == 2 and status["totals"]["streams"] == 4
    assert status["totals"]["outcomes"] == {"completed": 3, "truncated": 1, "error": 0,
                                            "timed_out": 0, "cancelled": 0}


async def test_a_client_that_leaves_a_stream_false_request_cancels_it(served: Served) -> None:
    stats = served.upstream.stats
    body = ask("long", "endless")
    body["stream"] = False
    with trio.fail_after(10):
        client = await raw_post(served.url, "/v1/fanout", body)
        await stats.wait_for(lambda s: s.requests.get("fault/endless:0.02") == 1
                             and s.requests.get("mock/slow:0.1") == 1)
        await trio.sleep(0.2)
    assert stats.connections_open == 2
    await client.aclose()
    with trio.fail_after(10):  # hang guards: the streams never end by themselves
        await stats.wait_for(lambda s: s.connections_open == 0)
    with trio.fail_after(10):
        while served.service.fanouts:
            await trio.sleep(0.01)
    assert served.service.status()["totals"]["outcomes"]["cancelled"] == 2
