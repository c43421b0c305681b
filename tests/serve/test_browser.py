"""The page in headless Chromium (Debian's ``chromium``, driven by Playwright for Python).

``fanout serve`` runs on loopback against the embedded upstream; the test loads
the page, runs a prompt against four models (one a fault), watches the columns
stream, checks every final status and finish reason, stops a second run
mid-stream, and sends markup that must stay text.  With no config on a real endpoint
(``fanout mock --key`` through ``OPENAI_BASE_URL``), the page offers the endpoint's
models and runs a typed id; without the endpoint's list, it says why.  A screenshot of the first
run is written to ``$FANOUT_SCREENSHOT`` (default: the test's tmp dir; the
path is printed).  ``make browser`` installs chromium (Playwright's own
browser download is never used).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ROOT = Path(__file__).resolve().parents[2]
CONFIG = """
[endpoint]
base_url = "embedded"

[deadlines]
first_token = 20
idle = 5
total = 60

[compare]
models = ["writer", "thinker", "tools", "flaky"]

[[models]]
name = "writer"
id = "mock/slow"
params = { max_tokens = 60 }

[[models]]
name = "thinker"
id = "mock/reasoning:0.03"
api = "responses"
params = { max_tokens = 50 }

[[models]]
name = "tools"
id = "mock/tools:0.08"
api = "anthropic"

[[models]]
name = "flaky"
id = "fault/truncate:12"

[[models]]
name = "long"
id = "mock/slow:0.15"

[[models]]
name = "echo"
id = "mock/echo"
"""
HOSTILE = ('<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'
           '<b onmouseover="window.__pwned=3">bold?</b>')

if not Path(CHROMIUM).exists() and not os.environ.get("CI"):
    pytest.skip(f"{CHROMIUM} is missing: `make browser` installs it", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    config = tmp_path_factory.mktemp("serve") / "browser.toml"
    config.write_text(CONFIG)
    process = subprocess.Popen([sys.executable, "-m", "fanout.cli.main", "serve", "--config",
                                str(config), "--port", "0"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert process.stdout is not None
        yield process.stdout.readline().strip()
    finally:
        process.terminate()
        process.communicate(timeout=15)


@pytest.fixture
def page(service: str) -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.on("console", lambda message: errors.append(message.text)
                    if message.type == "error" else None)
            page.goto(service)
            page.wait_for_selector("#models input[type=checkbox]")
            page.errors = errors
            yield page
        finally:
            browser.close()


def choose(page: Any, *models: str) -> None:
    for box in page.query_selector_all("#models input[type=checkbox]"):
        box.set_checked(box.get_attribute("value") in models)


def column(page: Any, stream: str) -> Any:
    return page.locator(f'.column[data-stream="{stream}"]')


def text_length(page: Any, stream: str) -> int:
    return len(column(page, stream).locator(".text").first.text_content() or "")


def wait_finished(page: Any, timeout: float = 30) -> None:
    page.wait_for_selector("body[data-run=finished]", timeout=timeout * 1000)
    page.wait_for_timeout(200)  # the last frame


def screenshot_path(tmp_path: Path) -> Path:
    chosen = os.environ.get("FANOUT_SCREENSHOT")
    return Path(chosen) if chosen else tmp_path / "fanout-serve.png"


def test_four_models_stream_side_by_side_and_end_honestly(page: Any, tmp_path: Path) -> None:
    selected = sorted(b.get_attribute("value") for b in
                      page.query_selector_all("#models input:checked"))
    assert selected == ["flaky", "thinker", "tools", "writer"]  # the [compare] models
    page.fill("#system", "Answer in a few sentences.")
    page.fill("#prompt", "Tell me about rivers.")
    page.press("#prompt", "Control+Enter")
    page.wait_for_function(
        "() => (document.querySelector('.column[data-stream=writer] .text') || {})"
        ".textContent?.length > 10", timeout=10_000)
    first = text_length(page, "writer")
    assert column(page, "writer").get_attribute("data-status") == "streaming"
    page.wait_for_timeout(600)
    assert text_length(page, "writer") > first  # it grows as it streams
    wait_finished(page)
    path = screenshot_path(tmp_path)
    page.screenshot(path=str(path), full_page=True)
    print(f"\nscreenshot: {path}")
    states = {stream: (column(page, stream).get_attribute("data-status"),
                       column(page, stream).get_attribute("data-finish"))
              for stream in ("writer", "thinker", "tools", "flaky")}
    assert states["thinker"] == ("completed", "length")
    assert states["tools"] == ("completed", "tool_calls")
    assert states["writer"][0] == "completed" and states["writer"][1] in ("stop", "length")
    assert states["flaky"] == ("truncated", None)
    flaky = column(page, "flaky")
    assert flaky.locator(".status").text_content() == "TRUNCATED"
    assert "[DONE]" in (flaky.locator(".col-reason").text_content() or "")
    assert (flaky.locator(".text").text_content() or "")  # the partial text stays
    # The dialects (thinker over the Responses API, tools over Anthropic Messages) say so.
    assert column(page, "thinker").locator(".col-id").text_content() == (
        "responses: mock/reasoning:0.03")
    assert column(page, "tools").locator(".col-id").text_content() == "anthropic: mock/tools:0.08"
    assert column(page, "writer").locator(".col-id").text_content() == "mock/slow"
    thinker = column(page, "thinker")
    assert "loud" in (thinker.locator(".finish").get_attribute("class") or "")
    assert thinker.locator("details.reasoning").is_visible()
    assert (thinker.locator(".reasoning-text").text_content() or "")
    args = column(page, "tools").locator(".tool-args").first.text_content() or ""
    assert args.startswith("{\n  ")  # pretty once complete
    assert column(page, "tools").locator(".tool-name").first.text_content() == "→ get_weather"
    for stream in ("writer", "thinker", "tools"):
        assert "TTFT" in (column(page, stream).locator(".col-metrics").text_content() or "")
    rows = page.locator("#summary-rows tr")
    assert page.locator("#summary").is_visible() and rows.count() == 4
    for number, stream in enumerate(("writer", "thinker", "tools", "flaky")):
        # A column's time is the summary's time for that stream (its own, not the fan-out's).
        header = column(page, stream).locator(".col-metrics").text_content() or ""
        cells = rows.nth(number).locator("td")
        assert cells.nth(0).text_content() == stream
        assert header.rsplit(" · ", 1)[-1] == cells.nth(7).text_content()
    assert "3 of 4 completed" in (page.locator("#summary h2").text_content() or "")
    assert "finished: 3 of 4 completed" in (page.locator("#run-status").text_content() or "")
    assert page.errors == []


def test_stop_keeps_the_partial_text_and_labels_it_stopped(page: Any) -> None:
    choose(page, "long", "echo")
    page.fill("#prompt", "Tell me a long story.")
    page.click("#run")
    page.wait_for_function(
        "() => (document.querySelector('.column[data-stream=long] .text') || {})"
        ".textContent?.length > 20", timeout=10_000)
    assert column(page, "long").get_attribute("data-status") == "streaming"
    page.click("#stop")
    before = text_length(page, "long")
    wait_finished(page, 10)
    long = column(page, "long")
    # The outcome stays cancelled (the server's records say so); the page labels the
    # stream its Stop ended "stopped", in the column and in the summary.
    assert long.get_attribute("data-status") == "cancelled"
    assert long.locator(".status").text_content() == "stopped"
    page.wait_for_selector("#summary-rows tr[data-stream=long]", timeout=10_000)
    assert page.locator("#summary-rows tr[data-stream=long] .status").text_content() == "stopped"
    assert page.locator("#summary-rows tr[data-stream=echo] .status").text_content() == "done"
    assert "cancelled by the client" in (long.locator(".col-reason").text_content() or "")
    assert text_length(page, "long") >= before > 20
    assert column(page, "echo").get_attribute("data-status") == "completed"
    assert "stopped" in (page.locator("#run-status").text_content() or "")
    assert page.errors == []


def test_markup_from_a_model_stays_text_and_runs_nothing(page: Any) -> None:
    choose(page, "echo")
    page.fill("#prompt", HOSTILE)
    page.press("#prompt", "Control+Enter")
    wait_finished(page, 10)
    echo = column(page, "echo")
    assert echo.get_attribute("data-status") == "completed"
    assert echo.locator(".text").text_content() == HOSTILE  # literal, every character
    page.wait_for_timeout(300)  # an onerror would have fired by now
    assert page.evaluate("() => window.__pwned") is None
    assert page.locator("#columns img, #columns script, #columns b").count() == 0
    assert page.errors == []


def test_the_pages_sse_parser_follows_the_line_rules(page: Any) -> None:
    got = page.evaluate("""() => {
        const events = [];
        let comments = 0;
        const parser = new window.fanoutPage.SSEParser(
            (name, data) => events.push([name, data]), () => { comments += 1; });
        for (const piece of ["event: a\\r", "\\ndata: 1\\r\\n", "data:2\\r\\r", ": ping\\n",
                             "data: {\\"x\\": \\"\\u2028\\"}\\n", "\\n", "id: 7\\nretry: 5\\n",
                             "data\\n\\n", "data: cut"]) {
            parser.feed(piece);
        }
        parser.end();
        return [events, comments];
    }""")
    assert got == [[["a", "1\n2"], ["message", '{"x": "\u2028"}'], ["message", ""]], 1]


def test_with_service_keys_the_browser_asks_once_and_the_page_works(
        tmp_path: Path) -> None:
    key = "svc-browser-key-77aa"
    config = tmp_path / "keys.toml"
    config.write_text(CONFIG + '\n[serve]\nkeys_env = "FANOUT_TEST_KEYS"\n')
    process = subprocess.Popen([sys.executable, "-m", "fanout.cli.main", "serve", "--config",
                                str(config), "--port", "0"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, cwd=ROOT,
                               env={**os.environ, "FANOUT_TEST_KEYS": f"other,{key}"})
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            try:
                anonymous = browser.new_page()
                with pytest.raises(sync_api.Error, match="ERR_INVALID_AUTH_CREDENTIALS"):
                    anonymous.goto(url)  # the 401 asked for a password; nobody gave one
                context = browser.new_context(http_credentials={"username": "me",
                                                                "password": key})
                page = context.new_page()
                assert page.goto(url).status == 200
                page.wait_for_selector("#models input[type=checkbox]")
                choose(page, "echo")
                page.fill("#prompt", "with a key")
                page.click("#run")
                wait_finished(page, 10)
                echo = column(page, "echo")
                assert echo.get_attribute("data-status") == "completed"
                assert echo.locator(".text").text_content() == "with a key"
            finally:
                browser.close()
    finally:
        process.terminate()
        process.communicate(timeout=15)


@pytest.fixture
def real_endpoint(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """``fanout serve`` with no config file, only ``OPENAI_BASE_URL`` and a key, in front
    of ``fanout mock --key`` (``--models-fault`` from the test's parameter, if any)."""
    key = "sk-browser-endpoint-3f9d"
    fault = getattr(request, "param", None)
    mock = subprocess.Popen([sys.executable, "-m", "fanout.cli.main", "mock", "--key", key,
                             *(["--models-fault", fault] if fault else [])],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            cwd=ROOT)
    serve = None
    try:
        assert mock.stdout is not None
        environ = {**os.environ, "OPENAI_BASE_URL": mock.stdout.readline().strip(),
                   "OPENAI_API_KEY": key, "PYTHONPATH": str(ROOT)}
        serve = subprocess.Popen([sys.executable, "-m", "fanout.cli.main", "serve", "--port",
                                  "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, cwd=tmp_path, env=environ)
        assert serve.stdout is not None
        yield serve.stdout.readline().strip()
    finally:
        for process in (serve, mock):
            if process is not None:
                process.terminate()
                process.communicate(timeout=15)


def open_page(playwright: Any, url: str) -> tuple[Any, Any, list[str]]:
    browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda message: errors.append(message.text)
            if message.type == "error" else None)
    page.goto(url)
    return browser, page, errors


def test_with_no_config_the_page_offers_the_endpoints_models_and_any_typed_id(
        real_endpoint: str) -> None:
    with sync_api.sync_playwright() as playwright:
        browser, page, errors = open_page(playwright, real_endpoint)
        try:
            page.wait_for_selector("#listed-models input[type=checkbox]")
            listed = [b.get_attribute("value") for b in
                      page.query_selector_all("#listed-models input[type=checkbox]")]
            assert {"mock/echo", "mock/slow", "fault/truncate"} <= set(listed)
            assert page.locator("#listed").evaluate("d => d.open")  # no config: shown
            assert "more models the endpoint lists" in (
                page.locator("#listed-summary").text_content() or "")
            assert page.locator("#configured input").count() == 0
            assert not page.locator("#models-note").is_visible()  # nothing to explain
            assert page.locator("#model-ids option[value='mock/echo']").count() == 1
            # An id the endpoint does not list (an argument of its own), typed and run.
            page.fill("#model-id", "mock/slow:0.02")
            page.press("#model-id", "Enter")  # adds it, checked; does not run
            assert page.locator("body[data-run]").count() == 0
            added = page.locator("#added input[value='mock/slow:0.02']")
            assert added.is_checked()
            page.check("#listed-models input[value='mock/echo']")
            page.fill("#prompt", "Tell me about rivers.")
            page.press("#prompt", "Control+Enter")
            page.wait_for_function(
                "() => (document.querySelector('.column[data-stream=\"mock/slow:0.02\"] "
                ".text') || {}).textContent?.length > 10", timeout=10_000)
            wait_finished(page)
            for stream in ("mock/slow:0.02", "mock/echo"):
                assert column(page, stream).get_attribute("data-status") == "completed"
            assert column(page, "mock/echo").locator(".text").text_content() == (
                "Tell me about rivers.")
            assert errors == []
        finally:
            browser.close()


@pytest.mark.parametrize("real_endpoint", ["404"], indirect=True)
def test_without_the_endpoints_list_the_page_says_why_and_a_typed_id_runs(
        real_endpoint: str) -> None:
    with sync_api.sync_playwright() as playwright:
        browser, page, errors = open_page(playwright, real_endpoint)
        try:
            page.wait_for_function(
                "() => document.getElementById('models-note').textContent.includes('404')")
            note = page.locator("#models-note").text_content() or ""
            assert note.startswith("the endpoint's model list is missing: ")
            assert "answered 404" in note and note.endswith("; type any model id")
            assert "sk-browser-endpoint" not in note
            assert page.locator("#models input[type=checkbox]").count() == 0
            page.fill("#model-id", "mock/echo")
            page.click("#add-model")
            page.fill("#prompt", "no list")
            page.click("#run")
            wait_finished(page, 10)
            assert column(page, "mock/echo").get_attribute("data-status") == "completed"
            assert column(page, "mock/echo").locator(".text").text_content() == "no list"
            assert errors == []
        finally:
            browser.close()
