"""The page's files, their headers, CORS, and what the script never does."""

from __future__ import annotations

import re
from importlib import resources

import trio

from fanout.upstream import RunningUpstream

from .helpers import Served, make_config, serving

STATIC = resources.files("fanout.serve").joinpath("static")


async def test_the_page_and_its_files_are_served_with_a_strict_policy(served: Served) -> None:
    async with served.client() as client:
        with trio.fail_after(10):
            page = await client.get("/")
            script = await client.get("/static/app.js")
            style = await client.get("/static/app.css")
            other = await client.get("/static/secrets.txt")
            head = await client.head("/")
    assert page.status_code == 200 and page.headers["content-type"] == "text/html; charset=utf-8"
    policy = page.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "script-src 'self'" in policy
    assert "connect-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert page.headers["x-content-type-options"] == "nosniff"
    assert script.headers["content-type"].startswith("text/javascript")
    assert style.headers["content-type"].startswith("text/css")
    assert b"/static/app.js" in page.content and b"/static/app.css" in page.content
    assert other.status_code == 404 and head.status_code == 200


def test_the_page_fetches_nothing_from_anywhere_else() -> None:
    for name in ("index.html", "app.js", "app.css"):
        text = STATIC.joinpath(name).read_text()
        assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}", text.lower()), name
        assert "@import" not in text and "url(" not in text, name


def test_the_script_never_turns_text_into_markup() -> None:
    script = STATIC.joinpath("app.js").read_text()
    code = "\n".join(line for line in script.splitlines() if not line.strip().startswith("//"))
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(",
                 "new Function", "createContextualFragment", "DOMParser", "srcdoc",
                 "setAttribute(\"on", "javascript:"):
        assert sink not in code, sink
    assert "textContent" in code and "appendData" in code
    html = STATIC.joinpath("index.html").read_text()
    assert "<script>" not in html  # no inline script
    assert not re.search(r"\son[a-z]+\s*=", html)  # no inline handler


async def test_cors_is_off_unless_origins_are_listed(upstream: RunningUpstream) -> None:
    origin = "http://localhost:5173"
    preflight = {"origin": origin, "access-control-request-method": "POST",
                 "access-control-request-headers": "content-type"}
    async with serving(upstream) as served, served.client() as client:
        with trio.fail_after(10):
            plain = await client.get("/v1/models", headers={"origin": origin})
            asked = await client.options("/v1/fanout", headers=preflight)
    assert "access-control-allow-origin" not in plain.headers
    assert "access-control-allow-origin" not in asked.headers
    config = make_config(f'cors_origins = ["{origin}"]')
    async with serving(upstream, config) as served, served.client() as client:
        with trio.fail_after(10):
            allowed = await client.get("/v1/models", headers={"origin": origin})
            asked = await client.options("/v1/fanout", headers=preflight)
            other = await client.get("/v1/models", headers={"origin": "http://evil.example"})
    assert allowed.headers["access-control-allow-origin"] == origin
    assert asked.status_code == 200 and asked.headers["access-control-allow-origin"] == origin
    assert "POST" in asked.headers["access-control-allow-methods"]
    assert "access-control-allow-origin" not in other.headers


async def test_models_and_health(served: Served) -> None:
    async with served.client() as client:
        with trio.fail_after(10):
            models = (await client.get("/v1/models")).json()
            health = (await client.get("/healthz")).json()
    assert models["object"] == "list"
    first = models["data"][0]
    assert first == {"id": "fast", "object": "model", "owned_by": "fanout",
                     "upstream_id": "mock/fast", "api": "chat", "default": True,
                     "source": "config"}
    # The embedded upstream is not asked: its models are the config's.
    assert models["endpoint_list"] == {"asked": False, "models": 0, "error": None}
    assert {m["source"] for m in models["data"]} == {"config"}
    assert [m["id"] for m in models["data"] if m["default"]] == ["fast", "echo"]
    assert health == {"status": "ok"}
