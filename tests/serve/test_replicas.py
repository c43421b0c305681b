"""Replicas of ``fanout serve``: ids name their replica, every response says which replica
sent it, a cancel sent to the wrong one is a 421 naming the owner, and ``/v1/status`` says
that its counts and limits are this replica's and which key set it holds."""

from __future__ import annotations

import ast
import hashlib
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from fanout.config import REPLICA_NAME
from fanout.serve import create_app
from fanout.serve.replica import default_replica, id_replica, new_fanout_id
from fanout.serve.service import PER_REPLICA
from fanout.upstream import RunningUpstream

from .helpers import Served, SSEReader, ask, make_config, serving

KEYS = ("svc-key-one-1f2e3d", "svc-key-two-9a8b7c")
FANOUT = Path(__file__).resolve().parents[2] / "fanout"


@pytest.mark.parametrize(("hostname", "port", "name"), [
    ("web1", 8080, "web1-8080"),
    ("web1.eu.example.com", 8080, "web1-eu-example-com-8080"),
    ("--odd host!!", 0, "odd-host-0"),
    ("..", 9000, "fanout-9000"),
    ("h" * 80, 65535, "h" * 57 + "-65535"),
    ("ab." + "c" * 60, 80, "ab-" + "c" * 57 + "-80"),
])
def test_a_replica_without_a_name_is_its_host_name_and_port(hostname: str, port: int,
                                                             name: str) -> None:
    assert default_replica(port, hostname) == name
    assert REPLICA_NAME.match(name)


def test_an_id_names_its_replica_and_nothing_else_passes_for_one() -> None:
    ids = {new_fanout_id("eu-1") for _ in range(200)}
    assert len(ids) == 200
    for fanout_id in ids:
        prefix, replica, token = fanout_id.split(".")  # exactly two dots, always
        assert (prefix, replica, len(token)) == ("fo", "eu-1", 22)
        assert re.fullmatch(r"[A-Za-z0-9_-]+", token)
        assert id_replica(fanout_id) == "eu-1"
    for other in ("fo-abc", "fo.eu-1", "fo.eu-1.", "fo.eu 1.abc", "fo..abc", "xx.eu-1.abc",
                  "fo.eu-1.abc.def", "fo.eu.1.abc", ""):
        assert id_replica(other) is None, other


async def long_fanout(served: Served, client: httpx.AsyncClient,
                      nursery: trio.Nursery) -> tuple[str, trio.MemoryReceiveChannel[Any]]:
    """Start a fan-out of a model that never ends; its id, and a channel that gets its
    records once the stream has ended."""
    started: trio.MemorySendChannel[str]
    started, got_id = trio.open_memory_channel[str](1)
    done_send, done = trio.open_memory_channel[Any](1)

    async def run() -> None:
        body = {**ask("endless", "fast"), "stream": True}
        async with client.stream("POST", "/v1/fanout", json=body) as response:
            assert response.headers["x-fanout-replica"] == served.service.replica
            reader = SSEReader(response)
            await reader.until(lambda r: r["type"] == "text" and r["stream"] == "endless")
            await started.send(response.headers["x-fanout-id"])
            await done_send.send(await reader.rest())

    nursery.start_soon(run)
    return await got_id.receive(), done


async def test_a_cancel_sent_to_another_replica_is_a_421_naming_the_owner(
        upstream: RunningUpstream) -> None:
    async with serving(upstream, replica="r1") as one, serving(upstream, replica="r2") as two, \
            one.client() as to_one, two.client() as to_two, trio.open_nursery() as nursery:
        with trio.fail_after(20):
            fanout_id, done = await long_fanout(one, to_one, nursery)
            assert fanout_id.startswith("fo.r1.")
            for _ in range(3):
                wrong = await to_two.post(f"/v1/fanout/{fanout_id}/cancel")
                assert wrong.status_code == 421
                assert wrong.headers["x-fanout-replica"] == "r2"
                assert wrong.headers["x-fanout-owner"] == "r1"
                error = wrong.json()["error"]
                assert error["code"] == "misdirected_request" and error["param"] == "id"
                assert error["message"].startswith("this fan-out runs on replica r1, not on "
                                                   "this one (r2): send its cancel to r1")
            assert fanout_id in one.service.fanouts  # still running: nothing was cancelled
            assert two.service.status()["rejected"]["misdirected"] == 3  # seen in r2's status
            assert one.service.status()["running"]["streams"] == 1
            right = await to_one.post(f"/v1/fanout/{fanout_id}/cancel")
            assert right.status_code == 200 and right.headers["x-fanout-replica"] == "r1"
            assert right.json()["cancelled"] == ["endless"]
            got = await done.receive()
    results = got.results()
    assert results["endless"]["outcome"] == "cancelled"
    assert results["endless"]["text"]  # what came before the cancel is kept
    assert results["fast"]["outcome"] == "completed"


async def test_a_cancel_of_an_id_this_replica_does_not_know_is_a_404(
        upstream: RunningUpstream) -> None:
    async with serving(upstream, replica="r1") as one, one.client() as client:
        for fanout_id in (new_fanout_id("r1"), "fo-old-style", "fo.r1", "fo.not ok.x"):
            response = await client.post(f"/v1/fanout/{fanout_id}/cancel")
            assert response.status_code == 404, fanout_id
            assert response.headers["x-fanout-replica"] == "r1"
            assert "x-fanout-owner" not in response.headers


async def test_every_response_names_the_replica(upstream: RunningUpstream) -> None:
    config = make_config('cors_origins = ["https://app.example"]\nmax_body_bytes = 4096\n'
                         "max_fanouts = 1\n")
    key = {"authorization": f"Bearer {KEYS[0]}"}
    async with serving(upstream, config, keys=KEYS, replica="eu-1") as served, \
            served.client() as client, trio.open_nursery() as nursery:
        with trio.fail_after(20):
            seen: list[tuple[int, str | None]] = []

            async def check(method: str, path: str, **kwargs: Any) -> httpx.Response:
                response = await client.request(method, path, **kwargs)
                seen.append((response.status_code, response.headers.get("x-fanout-replica")))
                return response

            await check("GET", "/healthz")
            await check("GET", "/v1/status")  # 401
            await check("GET", "/", headers={"authorization": "Bearer wrong"})  # 401
            await check("GET", "/", headers=key)
            await check("GET", "/static/app.js", headers=key)
            await check("GET", "/static/nope.js", headers=key)  # 404
            await check("GET", "/no/such/route", headers=key)  # 404
            await check("GET", "/v1/fanout", headers=key)  # 405
            await check("POST", "/v1/fanout", headers=key, content=b"{")  # 400
            await check("POST", "/v1/fanout", headers=key, content=b"x" * 5000)  # 413
            await check("POST", f"/v1/fanout/{new_fanout_id('eu-2')}/cancel", headers=key)  # 421
            await check("POST", "/v1/fanout", headers=key, json={**ask("echo"),
                                                                 "stream": False})
            await check("POST", "/v1/chat/completions", headers=key,
                        json={"model": "echo", "messages": [{"role": "user", "content": "x"}]})
            await check("OPTIONS", "/v1/fanout", headers={  # a CORS preflight
                "origin": "https://app.example", "access-control-request-method": "POST"})
            async with served.client(**key) as keyed:
                _, done = await long_fanout(served, keyed, nursery)
                busy = await check("POST", "/v1/fanout", headers=key, json=ask("echo"))
                assert busy.status_code == 429
                for running in list(served.service.fanouts.values()):
                    running.cancel("test")
                await done.receive()
            await check("GET", "/v1/status", headers=key)
    assert sorted({status for status, _ in seen}) == [200, 400, 401, 404, 405, 413, 421, 429]
    assert {name for _, name in seen} == {"eu-1"}


async def test_a_browser_may_read_the_replica_headers(upstream: RunningUpstream) -> None:
    config = make_config('cors_origins = ["https://app.example"]')
    async with serving(upstream, config, replica="eu-1") as served, served.client() as client:
        response = await client.get("/v1/status", headers={"origin": "https://app.example"})
    exposed = response.headers["access-control-expose-headers"].lower().split(", ")
    assert {"x-fanout-id", "x-fanout-replica", "x-fanout-owner"} <= set(exposed)


async def test_an_internal_error_names_the_replica_too(upstream: RunningUpstream,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    async with serving(upstream, replica="eu-1") as served:
        def broken() -> dict[str, Any]:
            raise RuntimeError("boom")

        monkeypatch.setattr(served.service, "status", broken)
        transport = httpx.ASGITransport(create_app(served.service),  # type: ignore[arg-type]
                                        raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            response = await client.get("/v1/status")
    assert response.status_code == 500
    assert response.headers["x-fanout-replica"] == "eu-1"
    assert "boom" not in response.text


async def status_of(served: Served, key: str | None = None) -> dict[str, Any]:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    async with served.client(**headers) as client:
        response = await client.get("/v1/status")
    assert response.status_code == 200
    body: dict[str, Any] = response.json()
    body["raw"] = response.text
    return body


async def test_status_names_its_replica_and_says_its_counts_are_that_replicas(
        upstream: RunningUpstream) -> None:
    async with serving(upstream, replica="r1") as one, serving(upstream, replica="r2") as two:
        async with one.client() as client:
            done = await client.post("/v1/fanout", json={**ask("echo", "fast"),
                                                         "stream": False})
            assert done.status_code == 200
        first, second = await status_of(one), await status_of(two)
    assert (first["replica"], second["replica"]) == ("r1", "r2")
    assert first["per_replica"] == list(PER_REPLICA) == ["running", "totals", "rejected",
                                                         "reading", "limits"]
    assert first["note"].startswith("running, totals, rejected, reading and limits are "
                                    "replica r1's alone")
    assert set(PER_REPLICA) <= set(first)
    # The fan-out ran on r1: r1 counts it, r2 does not.
    assert (first["totals"]["fanouts"], second["totals"]["fanouts"]) == (1, 0)
    assert first["keys"] == second["keys"] == {"required": False, "fingerprint": None}


def fingerprint(*keys: str) -> str:
    digests = sorted(hashlib.sha256(key.encode()).hexdigest() for key in keys)
    return hashlib.sha256("\n".join(digests).encode()).hexdigest()[:12]


async def test_status_shows_a_fingerprint_of_the_key_set_and_never_a_key(
        upstream: RunningUpstream) -> None:
    other = ("svc-key-one-1f2e3d", "svc-key-two-9a8b7X")  # one key differs, by one character
    async with serving(upstream, keys=KEYS, replica="r1") as one, \
            serving(upstream, keys=KEYS[::-1], replica="r2") as two, \
            serving(upstream, keys=other, replica="r3") as three:
        statuses = [await status_of(one, KEYS[0]), await status_of(two, KEYS[1]),
                    await status_of(three, other[0])]
    prints = [status["keys"]["fingerprint"] for status in statuses]
    assert all(status["keys"]["required"] for status in statuses)
    assert prints[0] == prints[1] == fingerprint(*KEYS)  # the same keys, in any order
    assert prints[2] == fingerprint(*other) != prints[0]
    assert all(re.fullmatch(r"[0-9a-f]{12}", p) for p in prints)
    for status in statuses:
        for key in {*KEYS, *other}:
            assert key not in status["raw"]
            assert hashlib.sha256(key.encode()).hexdigest()[:12] not in status["raw"]


def _imports(module: str, path: Path, known: set[str]) -> set[str]:
    """Every module of ``known`` that ``module`` imports, anywhere in it (top level, in
    functions, under ``TYPE_CHECKING``)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            target = (f"{base}.{node.module}" if node.module else base) if node.level \
                else node.module or ""
            for alias in node.names:
                if f"{target}.{alias.name}" in known:
                    found.add(f"{target}.{alias.name}")
                elif target in known:
                    found.add(target)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in known}
    return found - {module}


def test_no_module_of_the_service_imports_one_that_imports_it_back() -> None:
    paths = {".".join(("fanout", "serve", *p.relative_to(FANOUT / "serve").with_suffix("")
                       .parts)).removesuffix(".__init__"): p
             for p in (FANOUT / "serve").rglob("*.py")}
    graph = {module: _imports(module, path, set(paths)) for module, path in paths.items()}
    assert "fanout.serve.keys" in graph["fanout.serve.service"]

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for after in graph[start] - seen:
            seen.add(after)
            if after == goal or reaches(after, goal, seen):
                return True
        return False

    cycles = sorted(module for module in graph if reaches(module, module, set()))
    assert cycles == [], f"import cycles through {cycles}"
