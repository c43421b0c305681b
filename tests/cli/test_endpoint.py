"""A real endpoint in one line: any model id with -m (compare, batch), `fanout models`,
`fanout init`, and the first errors through the command line.  The "real endpoint" is
`fanout mock` with a key, a closed port, and a small server that answers 404 to
everything, all on 127.0.0.1."""

from __future__ import annotations

import io
import json
import os
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import trio

from fanout import load_config
from fanout.cli.batch import BatchOptions, run_batch
from fanout.cli.compare import CompareOptions, run_compare
from fanout.cli.init import InitOptions, run_init
from fanout.cli.main import main
from fanout.cli.models import ModelsOptions, run_models
from fanout.config import parse_config
from fanout.upstream import MODELS, RunningUpstream
from tests.helpers import fanout_mock
from tests.net.test_first_errors import closed_port
from tests.serve.helpers import serving

COMMAND = [sys.executable, "-m", "fanout.cli.main"]
KEY = "sk-endpoint-SECRET-77"


@pytest.fixture(scope="module")
def mock() -> Iterator[str]:
    """`fanout mock --key KEY`: its base URL."""
    with fanout_mock("--key", KEY) as base_url:
        yield base_url


@pytest.fixture(scope="module")
def not_found() -> Iterator[str]:
    """A server that answers 404 to everything (a wrong base URL, a server with no
    /models route): its base URL, ending in /v1."""
    class Handler(BaseHTTPRequestHandler):
        def answer(self) -> None:
            body = b"404 page not found"
            self.send_response(404)
            self.send_header("content-type", "text/plain")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = answer

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def relay(tmp_path: Path, base_url: str, *, key_env: str | None = "MY_KEY") -> str:
    path = tmp_path / "relay.toml"
    key = f'api_key_env = "{key_env}"\n' if key_env else ""
    path.write_text(f'[endpoint]\nbase_url = "{base_url}"\n{key}[deadlines]\ntotal = 30\n'
                    '[[models]]\nname = "named"\nid = "mock/echo"\n'
                    'params = { max_tokens = 20 }\nprice = { input = 1, output = 2 }\n')
    return str(path)


def models(config: str | None, environ: dict[str, str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = run_models(ModelsOptions(config=config), stdout=out, stderr=err, environ=environ)
    return status, out.getvalue(), err.getvalue()


def compare(config: str | None, *names: str, environ: dict[str, str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = run_compare(CompareOptions(prompt="hi there", models=names, config=config),
                         stdout=out, stderr=err, environ=environ)
    return status, out.getvalue(), err.getvalue()


# -- any model id ---------------------------------------------------------------------------

def test_compare_takes_any_model_id_of_a_real_endpoint(mock: str, tmp_path: Path) -> None:
    config = relay(tmp_path, mock)
    status, out, err = compare(config, "mock/fast", "named", environ={"MY_KEY": KEY})
    assert status == 0, err
    assert "== mock/fast" in out and "== named" in out  # an ad hoc model's name is its id
    status, out, err = compare(config, "gpt-4o", environ={"MY_KEY": KEY})
    assert status == 1
    assert ("fanout compare: gpt-4o: error: HTTP 404: the endpoint does not know model "
            "'gpt-4o'; `fanout models` lists what it offers") in err
    assert KEY not in out + err


def test_openai_base_url_alone_is_a_real_endpoint(mock: str, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no fanout.toml: the packaged default, given over
    environ = {"OPENAI_BASE_URL": mock, "OPENAI_API_KEY": KEY}
    status, out, err = compare(None, "mock/fast", environ=environ)
    assert status == 0 and "== mock/fast" in out, err
    status, _, err = compare(None, environ=environ)
    assert status == 2 and "no model to run: give -m ID" in err
    # Without it, the packaged default is the embedded upstream, and a name it does not
    # have is still the did-you-mean error.
    status, _, err = compare(None, "writr", environ={})
    assert status == 2 and "no model named 'writr' (did you mean 'writer'?)" in err


def test_batch_takes_any_model_id_of_a_real_endpoint(mock: str, tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "one"}\n{"id": "b", "prompt": "two"}\n')
    output = tmp_path / "r.jsonl"
    out, err = io.StringIO(), io.StringIO()
    status = run_batch(BatchOptions(prompts=str(prompts), output=str(output),
                                    models=("mock/echo", "mock/fast"),
                                    config=relay(tmp_path, mock)),
                       stdout=out, stderr=err, environ={"MY_KEY": KEY})
    assert status == 0, err.getvalue()
    lines = [json.loads(line) for line in output.read_text().splitlines()]
    # mock/echo is the id of the config's "named": its params and price, under the name
    # typed (what a person greps the results for).
    assert sorted((r["model"], r["outcome"], r["cost"] is not None) for r in lines) == [
        ("mock/echo", "completed", True), ("mock/echo", "completed", True),
        ("mock/fast", "completed", False), ("mock/fast", "completed", False)]


# -- fanout models --------------------------------------------------------------------------

def test_models_lists_what_the_endpoint_offers(mock: str, tmp_path: Path) -> None:
    status, out, err = models(relay(tmp_path, mock), {"MY_KEY": KEY})
    assert status == 0, err
    lines = out.splitlines()
    ids = [line.split()[0] for line in lines]
    assert ids == sorted(ids) and set(MODELS) <= set(ids)
    assert all(line.split()[1:] == ["fanout"] for line in lines)  # owned_by
    assert err == f"fanout models: {len(ids)} models at {mock}\n"


def test_models_of_the_default_are_the_embedded_ones(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    status, out, err = models(None, {})
    assert status == 0 and "models at the embedded upstream" in err
    assert {line.split()[0] for line in out.splitlines()} >= set(MODELS)


def test_models_without_a_key_says_none_was_sent(mock: str, tmp_path: Path) -> None:
    status, out, err = models(relay(tmp_path, mock, key_env=None), {})
    assert (status, out) == (1, "")
    assert err.startswith("fanout models: HTTP 401: no API key was sent: set OPENAI_API_KEY "
                          "or [endpoint] api_key_env")
    status, out, err = models(relay(tmp_path, mock), {"MY_KEY": "sk-wrong-one-5"})
    assert status == 1 and "no API key" not in err and "sk-wrong-one-5" not in err


def test_models_without_the_route_says_so(not_found: str, tmp_path: Path) -> None:
    status, out, err = models(relay(tmp_path, not_found), {"MY_KEY": KEY})
    assert (status, out) == (1, "")
    assert err == (f"fanout models: {not_found}/models answered 404: the endpoint has no "
                   "/models route, so it cannot list its models (-m still takes any id it "
                   "serves)\n")
    root = not_found.removesuffix("/v1")
    status, _, err = models(relay(tmp_path, root), {"MY_KEY": KEY})
    assert status == 1 and err.endswith(f"; the base URL probably needs /v1: try {root}/v1\n")


def test_models_with_nothing_listening_says_run_again_once_it_is(tmp_path: Path) -> None:
    port = closed_port()
    status, out, err = models(relay(tmp_path, f"http://127.0.0.1:{port}/v1"), {"MY_KEY": KEY})
    assert (status, out) == (1, "")
    assert err == (f"fanout models: cannot connect to http://127.0.0.1:{port}/v1: is the "
                   "server running, is base_url right? run the same command again once it "
                   "is (connection refused)\n")


def test_compare_on_a_wrong_base_url_names_the_route(not_found: str, tmp_path: Path) -> None:
    root = not_found.removesuffix("/v1")
    status, _, err = compare(relay(tmp_path, root), "gpt-4o", environ={"MY_KEY": KEY})
    assert status == 1
    assert err.strip() == (f"fanout compare: gpt-4o: error: HTTP 404: {root}/chat/completions "
                           f"answered 404: no such route; the base URL probably needs /v1: "
                           f"try {root}/v1")


# -- fanout init ----------------------------------------------------------------------------

def init(path: Path, base_url: str | None = None, environ: dict[str, str] | None = None
         ) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = run_init(InitOptions(path=str(path), base_url=base_url), stdout=out, stderr=err,
                      environ=environ or {})
    return status, out.getvalue(), err.getvalue()


def test_init_writes_a_starter_that_loads_and_runs(mock: str, tmp_path: Path) -> None:
    path = tmp_path / "fanout.toml"
    status, out, err = init(path, mock + "/")  # no key: its model list is refused
    assert status == 0 and err.startswith("fanout init: the endpoint gave no model ids, so "
                                          "the file has placeholders")
    assert out.startswith(f"wrote {path}: the endpoint {mock},")
    text = path.read_text()
    for part in ("[endpoint]", "api_key_env", "[deadlines]", "[concurrency]", "[compare]",
                 "[batch]", "[[models]]", "[[scorers]]"):
        assert part in text
    assert sum(line.startswith("[[models]]") for line in text.splitlines()) == 2
    config = load_config(path)
    assert config.base_url == mock and [m.name for m in config.models] == ["fast", "smart"]
    assert config.batch == config.compare == ("fast", "smart")
    assert config.scorer("has-answer") is not None
    status, out, err = compare(str(path), "mock/fast", environ={"OPENAI_API_KEY": KEY})
    assert status == 0, err


def test_init_takes_openai_base_url_else_openais(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1"  # asked for its models: nothing there
    assert init(tmp_path / "a.toml", environ={"OPENAI_BASE_URL": url})[0] == 0
    assert load_config(tmp_path / "a.toml").base_url == url
    assert init(tmp_path / "b.toml")[0] == 0
    assert load_config(tmp_path / "b.toml").base_url == "https://api.openai.com/v1"


def test_init_never_overwrites_nor_writes_through_a_link(tmp_path: Path) -> None:
    path = tmp_path / "fanout.toml"
    path.write_text("mine\n")
    status, out, err = init(path, "http://h/v1")
    assert (status, out) == (2, "")
    assert err == (f"fanout init: {path}: a file is already there; nothing was written "
                   "(give another PATH, or remove it first)\n")
    assert path.read_text() == "mine\n"
    target = tmp_path / "elsewhere.toml"
    link = tmp_path / "link.toml"
    link.symlink_to(target)  # dangling
    status, _, err = init(link, "http://h/v1")
    assert status == 2 and "a symbolic link to" in err and not target.exists()
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize(("url", "message"), [
    ("ftp://h/v1", "--base-url: must be an http:// or https:// URL, not 'ftp://h/v1'"),
    ("http://me:sk-in-url-3@h/v1", "--base-url: holds a user name or password"),
    ("relay.example/v1", "--base-url: must be an http:// or https:// URL")])
def test_init_refuses_a_bad_base_url(tmp_path: Path, url: str, message: str) -> None:
    path = tmp_path / "fanout.toml"
    status, _, err = init(path, url)
    assert status == 2 and err.startswith(f"fanout init: {message}")
    assert "sk-in-url-3" not in err and not path.exists()


def test_init_and_models_are_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    assert main(["init", "--base-url", "http://127.0.0.1:9/v1"]) == 0
    assert (tmp_path / "fanout.toml").is_file()
    assert main(["init"]) == 2
    assert "already there" in capsys.readouterr().err
    # ./fanout.toml is what every command reads: `fanout models` asks its endpoint.
    assert main(["models"]) == 1
    assert "cannot connect to http://127.0.0.1:9/v1" in capsys.readouterr().err
    assert os.listdir(tmp_path) == ["fanout.toml"]


# -- fanout serve ---------------------------------------------------------------------------

async def test_serve_requests_take_any_model_id_of_a_real_endpoint(upstream: RunningUpstream
                                                                  ) -> None:
    config = parse_config(f'[endpoint]\nbase_url = "{upstream.base_url}"\n'
                          '[[models]]\nname = "named"\nid = "mock/echo"\n', "real.toml")
    async with serving(upstream, config) as served, served.client() as client:
        with trio.fail_after(20):
            adhoc = await client.post("/v1/chat/completions", json={
                "model": "mock/fast", "messages": [{"role": "user", "content": "hi"}]})
            unknown = await client.post("/v1/chat/completions", json={
                "model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]})
    assert adhoc.status_code == 200, adhoc.text
    assert adhoc.json()["choices"][0]["message"]["content"]
    # The endpoint's own 404, said as such (not the service's "no model named").
    assert unknown.status_code != 200
    assert "the endpoint does not know model 'gpt-4o'" in unknown.json()["error"]["message"]
