"""The documentation site opened from disk in headless Chromium (Debian's ``chromium``, driven
by Playwright, as tests/serve/test_browser.py does): the site is built (``mkdocs build
--strict``, as ``make docs`` does) into a tmp dir, and its pages, opened from file://, show
the search box and find pages, with no request leaving the disk (every request is routed and
recorded).  A screenshot of the results is written to ``$FANOUT_SCREENSHOT_DOCS`` (default:
the test's tmp dir) and its path printed."""

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
ROOT = Path(__file__).resolve().parents[1]

if not Path(CHROMIUM).exists() and not os.environ.get("CI"):
    pytest.skip(f"{CHROMIUM} is missing: `make browser` installs it", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api")
pytest.importorskip("mkdocs", reason="the docs extra builds the site")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("site") / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                           "-d", str(where)], cwd=ROOT, capture_output=True, text=True,
                          timeout=180, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr
    return where


@pytest.fixture
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            yield browser
        finally:
            browser.close()


def open_page(browser: Any, file: Path) -> tuple[Any, list[str], list[str]]:
    """``file`` opened from disk: the page, the requests that were not for a file (refused),
    the page's errors."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    fetched: list[str] = []
    errors: list[str] = []

    def route(route: Any) -> None:
        if route.request.url.startswith("file:"):
            route.continue_()
        else:
            fetched.append(route.request.url)
            route.abort()

    context.route("**/*", route)
    page = context.new_page()
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda message: errors.append(message.text)
            if message.type == "error" else None)
    page.goto(file.as_uri())
    return page, fetched, errors


def search(page: Any, word: str) -> list[str]:
    """The pages the search box lists for ``word`` (the links of its results)."""
    box = page.locator("input.md-search__input")
    box.wait_for(state="visible", timeout=10_000)  # hidden when search cannot start
    box.click()
    page.keyboard.type(word)
    page.wait_for_selector(".md-search-result__item", timeout=15_000)
    links = page.eval_on_selector_all(".md-search-result__item > a",
                                      "links => links.map(a => a.href)")
    return [str(link) for link in links]


def test_the_home_page_searches_from_disk(browser: Any, site: Path, tmp_path: Path) -> None:
    page, fetched, errors = open_page(browser, site / "index.html")
    links = search(page, "haproxy")
    chosen = os.environ.get("FANOUT_SCREENSHOT_DOCS")
    path = Path(chosen) if chosen else tmp_path / "fanout-docs-search.png"
    page.screenshot(path=str(path))
    print(f"\nscreenshot: {path}")
    assert len(links) >= 2
    assert all(link.startswith(site.as_uri() + "/") for link in links), links
    assert any("/scaling-out.html" in link for link in links), links
    for link in links:
        assert Path(link.removeprefix("file://").split("#")[0]).is_file(), link
    meta = page.locator(".md-search-result__meta").inner_text()
    assert "matching document" in meta, meta
    # A result opens its page, from disk too.
    page.locator(".md-search-result__item > a").first.click()
    page.wait_for_load_state()
    assert page.url.startswith(site.as_uri() + "/") and ".html" in page.url
    assert fetched == [] and errors == []


def test_a_page_in_a_folder_searches_from_disk(browser: Any, site: Path) -> None:
    page, fetched, errors = open_page(browser, site / "evaluation" / "index.html")
    links = search(page, "bootstrap")
    assert any(link.startswith((site / "evaluation").as_uri() + "/") for link in links), links
    for link in links:
        assert Path(link.removeprefix("file://").split("#")[0]).is_file(), link
    assert fetched == [] and errors == []
