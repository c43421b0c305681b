"""``fanout serve`` on a real endpoint: ``/v1/models`` (and so the page) offers the
endpoint's own ``GET /models`` list, after the configured models; without a list (no
route, a refused key, no answer) it says why in one line, and any id still runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from fanout import Endpoint
from fanout.config import Config, load_config, parse_config
from fanout.serve import listing
from fanout.upstream import MODELS, RunningUpstream, serve_upstream

from .helpers import Served, serving

KEY = "sk-listing-KEY-5c1e"
ROOT = Path(__file__).resolve().parents[2]


@asynccontextmanager
async def real_endpoint(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, config: Config | None
                        = None, *, fault: str | None = None) -> AsyncIterator[Served]:
    """The service in front of an embedded upstream that plays a real endpoint (a key,
    reached through ``OPENAI_BASE_URL``), with no config file unless ``config``."""
    async with trio.open_nursery() as nursery:
        upstream: RunningUpstream = await nursery.start(partial(
            serve_upstream, key=KEY, models_fault=fault))
        environ = {"OPENAI_BASE_URL": upstream.base_url, "OPENAI_API_KEY": KEY}
        for name, value in environ.items():
            monkeypatch.setenv(name, value)  # what the service resolves ad hoc ids by
        if config is None:
            config = load_config(cwd=tmp_path, environ=environ)
            assert config.models == () and not config.embedded
        async with serving(upstream, config, api_key=KEY) as served:
            yield served
        nursery.cancel_scope.cancel()


async def get_models(served: Served) -> dict[str, Any]:
    async with served.client() as client:
        with trio.fail_after(20):
            response = await client.get("/v1/models")
    assert response.status_code == 200
    assert KEY not in response.text
    body: dict[str, Any] = response.json()
    return body


async def run_one(served: Served, model: str) -> dict[str, Any]:
    async with served.client() as client:
        with trio.fail_after(20):
            response = await client.post("/v1/fanout", json={
                "messages": [{"role": "user", "content": "typed"}], "models": [model]})
    assert response.status_code == 200, response.text
    (result,) = response.json()["results"]
    return dict(result)


async def test_with_no_config_the_endpoints_models_are_listed_and_run(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    async with real_endpoint(monkeypatch, tmp_path) as served:
        models = await get_models(served)
        again = await get_models(served)
        result = await run_one(served, "mock/echo")
        asks = served.service.endpoint_models.asks
    assert models["object"] == "list" and again == models
    ids = [m["id"] for m in models["data"]]
    assert set(MODELS) <= set(ids) and ids == sorted(ids)
    echo = next(m for m in models["data"] if m["id"] == "mock/echo")
    assert echo == {"id": "mock/echo", "object": "model", "owned_by": "fanout",
                    "upstream_id": "mock/echo", "api": "chat", "default": False,
                    "source": "endpoint"}
    assert models["endpoint_list"] == {"asked": True, "models": len(ids), "error": None}
    assert asks == 1  # kept: the second GET did not ask again
    assert (result["outcome"], result["text"]) == ("completed", "typed")


async def test_configured_models_come_first_and_are_not_listed_twice(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = parse_config('[compare]\nmodels = ["named"]\n'
                          '[[models]]\nname = "named"\nid = "mock/echo"\n'
                          '[[models]]\nname = "mock/fast"\nid = "mock/slow"\n', "real.toml")
    async with real_endpoint(monkeypatch, tmp_path, config) as served:
        models = await get_models(served)
        typed = await run_one(served, "mock/length")  # listed, not configured
    data = models["data"]
    assert [(m["id"], m["source"], m["default"]) for m in data[:2]] == [
        ("named", "config", True), ("mock/fast", "config", False)]
    ids = [m["id"] for m in data]
    # mock/echo is "named"'s id and mock/fast a configured name: each once, the config's.
    assert ids.count("mock/fast") == 1 and "mock/echo" not in ids and "mock/slow" not in ids
    assert "mock/length" in ids and all(m["source"] == "endpoint" for m in data[2:])
    assert typed["outcome"] == "completed"


@pytest.mark.parametrize(("fault", "says"), [
    ("404", "/models answered 404: the endpoint has no /models route, so it cannot list its "
            "models (any model id it serves can still be typed)"),
    ("401", "was refused: check that it is valid for this endpoint and not expired (the "
            "server said: Incorrect API key provided.)"),
    ("hang", "/models: no model list within 0.5 s"),
])
async def test_without_a_list_it_says_why_in_one_line_and_any_id_still_runs(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fault: str, says: str) -> None:
    if fault == "hang":
        monkeypatch.setattr(listing, "ASK_SECONDS", 0.5)  # (the others answer at once)
    async with real_endpoint(monkeypatch, tmp_path, fault=fault) as served:
        models = await get_models(served)
        result = await run_one(served, "mock/echo")
    assert models["data"] == []
    error = models["endpoint_list"]["error"]
    assert models["endpoint_list"]["asked"] and says in error, error
    assert "\n" not in error and KEY not in error
    assert (result["outcome"], result["text"]) == ("completed", "typed")


async def test_a_failed_ask_keeps_the_last_list_and_is_retried_later(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    async with real_endpoint(monkeypatch, tmp_path) as served:
        listed = served.service.endpoint_models
        first = await get_models(served)
        listed.endpoint = Endpoint(listed.endpoint.base_url, "sk-wrong-key-9")
        kept = await get_models(served)  # not asked: the list is fresh
        assert listed.asks == 1 and kept == first
        monkeypatch.setattr(listed, "_until", trio.current_time())  # it has aged
        failed = await get_models(served)
    assert listed.asks == 2
    assert failed["data"] == first["data"]  # the last list, with why it is not newer
    assert failed["endpoint_list"]["error"].startswith("HTTP 401")
    assert "sk-wrong-key-9" not in json.dumps(failed)


def test_the_command_with_only_openai_base_url_offers_the_endpoints_models(
        tmp_path: Path) -> None:
    mock = subprocess.Popen([sys.executable, "-m", "fanout.cli.main", "mock", "--key", KEY],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    serve = None
    try:
        assert mock.stdout is not None
        base_url = mock.stdout.readline().strip()
        environ = {**os.environ, "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": KEY,
                   "PYTHONPATH": str(ROOT)}
        serve = subprocess.Popen([sys.executable, "-m", "fanout.cli.main", "serve", "--port",
                                  "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, cwd=tmp_path, env=environ)
        assert serve.stdout is not None
        url = serve.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url
        with httpx.Client(base_url=url, timeout=20) as client:
            models = client.get("/v1/models").json()
            echoed = client.post("/v1/fanout", json={
                "messages": [{"role": "user", "content": "ping"}],
                "models": ["mock/echo"]}).json()
        assert set(MODELS) <= {m["id"] for m in models["data"]}
        assert models["endpoint_list"]["error"] is None
        assert echoed["results"][0]["text"] == "ping"
    finally:
        errors = []
        for process in (serve, mock):
            if process is not None:
                process.terminate()
                errors.append(process.communicate(timeout=15)[1] or "")
    assert KEY not in errors[0] and "Traceback" not in errors[0]
