"""Service keys: every route but /healthz needs one; the page asks the browser for it."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import pytest
import trio

from fanout import ConfigError
from fanout.cli.serve import ServeOptions, run_serve
from fanout.serve import ServiceKeys
from fanout.upstream import RunningUpstream

from .helpers import ask, serving

KEYS = ("svc-key-one-1f2e3d", "svc-key-two-9a8b7c")
ROUTES = [("GET", "/"), ("GET", "/static/app.js"), ("GET", "/v1/models"),
          ("GET", "/v1/status"), ("POST", "/v1/fanout"), ("POST", "/v1/chat/completions"),
          ("POST", "/v1/fanout/fo-x/cancel"), ("GET", "/no/such/route")]


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


async def test_with_keys_every_route_but_healthz_needs_one(upstream: RunningUpstream) -> None:
    async with serving(upstream, keys=KEYS) as served, served.client() as client:
        with trio.fail_after(10):
            for method, path in ROUTES:
                for header in ({}, {"authorization": "Bearer wrong"},
                               {"authorization": "Bearer " + KEYS[0][:-1]},
                               {"authorization": basic("x", "wrong")},
                               {"authorization": "Basic !!!"}, {"authorization": KEYS[0]}):
                    response = await client.request(method, path, headers=header)
                    assert response.status_code == 401, (method, path, header)
                    error = response.json()["error"]
                    assert error["code"] == "invalid_api_key"
                    assert "wrong" not in response.text and KEYS[0][:-1] not in response.text
                    page = path == "/" or path.startswith("/static/")
                    assert response.headers["www-authenticate"].startswith(
                        "Basic " if page else "Bearer ")
            health = await client.get("/healthz")
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    assert served.service.status()["rejected"]["unauthorized"] == len(ROUTES) * 6


async def test_a_valid_key_as_bearer_or_basic_opens_every_route(
        upstream: RunningUpstream) -> None:
    async with serving(upstream, keys=KEYS) as served:
        for authorization in ("Bearer " + KEYS[0], "bearer  " + KEYS[1],
                              basic("anyone", KEYS[0]), basic(KEYS[1], "")):
            async with served.client(authorization=authorization) as client:
                with trio.fail_after(10):
                    assert (await client.get("/")).status_code == 200
                    assert (await client.get("/v1/models")).status_code == 200
                    done = await client.post("/v1/fanout", json={**ask("echo"),
                                                                 "stream": False})
                    assert done.json()["results"][0]["text"] == "hi"
                    chat = await client.post("/v1/chat/completions", json={
                        "model": "echo", "messages": [{"role": "user", "content": "yo"}]})
                    assert chat.json()["choices"][0]["message"]["content"] == "yo"


def test_keys_come_from_the_variable_the_config_names() -> None:
    keys = ServiceKeys.from_env("SVC", {"SVC": " a1 , b2,, "})
    assert keys.tokens == {"a1", "b2"} and keys
    assert "a1" not in repr(keys)
    assert not ServiceKeys.from_env(None, {})
    for environ in ({}, {"SVC": ""}, {"SVC": " , "}):
        with pytest.raises(ConfigError, match=r"\[serve\] keys_env: the variable SVC is not set"):
            ServiceKeys.from_env("SVC", environ, "f.toml")
    assert keys.allows("Bearer a1") and keys.allows("Bearer b2")
    assert not keys.allows("Bearer a") and not keys.allows("Bearer a1b2")
    assert not keys.allows("") and not keys.allows("Token a1") and not keys.allows("Bearer")


def run(host: str, port: str, environ: dict[str, str] | None = None,
        config: str = "") -> tuple[int, str]:
    err = io.StringIO()
    status = run_serve(ServeOptions(config=config or None, host=host, port=int(port)),
                       stdout=io.StringIO(), stderr=err, environ=environ or {})
    return status, err.getvalue()


def test_without_keys_only_loopback_is_served() -> None:
    for host in ("0.0.0.0", "::", "192.0.2.7", "example.com"):
        status, err = run(host, "0")
        assert status == 2
        assert f"refusing to listen on {host}: without service keys only loopback" in err


def test_a_named_keys_variable_that_is_unset_stops_the_service(tmp_path: Path) -> None:
    config = tmp_path / "svc.toml"
    config.write_text('[endpoint]\nbase_url = "embedded"\n[serve]\nkeys_env = "SVC_KEYS"\n')
    status, err = run("127.0.0.1", "0", config=str(config))
    assert status == 2 and "[serve] keys_env: the variable SVC_KEYS is not set" in err
