"""`fanout report --html` in headless Chromium (Debian's ``chromium``, driven by Playwright,
as tests/serve/test_browser.py does): the file opens from file:// and draws itself with no
request leaving it (every request is routed and recorded) and no error (a script or style
the Content-Security-Policy refused would be one); each filter shows the prompts it should;
a detail shows the full answer; hostile answers stay literal and run nothing; the charts
have one mark per model; the comparison lists its flips.  A screenshot is written to
``$FANOUT_SCREENSHOT_REPORT`` (default: the test's tmp dir) and its path printed."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fanout.records import dumps_bytes
from fanout.store.scores import answer_key

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ROOT = Path(__file__).resolve().parents[2]
HOSTILE = "<img src=x onerror=window.__pwned=1></script><script>window.__pwned=2</script>"
FETCHING = '<img src="https://example.com/beacon.png"><link rel=stylesheet href="http://127.0.0.1:9/x.css">'

if not Path(CHROMIUM).exists() and not os.environ.get("CI"):
    pytest.skip(f"{CHROMIUM} is missing: `make browser` installs it", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api")


def record(prompt: str, model: str, text: str, *, outcome: str = "completed",
           flags: tuple[str, ...] = (), ttft: float = 0.05) -> dict[str, Any]:
    return {"id": prompt, "model": model, "sample": 0, "outcome": outcome,
            "reason": None if outcome == "completed" else f"{outcome}: the relay said no",
            "flags": list(flags), "content_key": f"ck-{prompt}-{model}", "text": text,
            "finish_reason": "stop" if outcome == "completed" else None,
            "choices": [{"index": 0, "text": text, "reasoning": "thinking <b>hard</b>",
                         "refusal": "", "finish_reason": "stop", "tool_calls": []}],
            "usage": {"prompt_tokens": 4, "completion_tokens": 9, "total_tokens": 13},
            "metrics": {"ttft": ttft, "ttfc": ttft, "tokens_per_second": 30 + 100 * ttft,
                        "e2e_latency": 0.4},
            "messages": [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": f"question {prompt} <i>markup</i>"}],
            "expected": "yes", "category": "c", "cost": 0.0001, "cost_source": "price"}


def score(answer: dict[str, Any], passed: bool | None, status: str = "scored"
          ) -> dict[str, Any]:
    return {"id": answer["id"], "model": answer["model"], "sample": 0, "scorer": "exact",
            "kind": "exact", "scorer_key": "k", "answer_key": answer_key(answer),
            "status": status, "score": None if passed is None else float(passed),
            "passed": passed, "explanation": "expected 'yes' <u>here</u>",
            "scored_at": "2026-12-01T11:00:00.000+00:00"}


#: prompt -> (writer: text, outcome, passed), (thinker: ...)
PLAN = {
    "p1": (("yes", "completed", True), ("yes", "completed", True)),
    "p2": (("no", "completed", False), ("yes", "completed", True)),  # different
    "p3": (("yes", "completed", True), ("ye", "truncated", None)),  # truncated
    "p4": (("", "error", None), ("yes", "completed", True)),  # an error
    "p5": (("yes", "completed", True), ("", "completed", False)),  # empty, different
    "p6": ((HOSTILE, "completed", False), (FETCHING, "completed", False)),
}
LONG = "yes " + "and more words " * 40 + "THE END"
BASELINE = {"p1": False, "p2": True}  # writer in B: p1 fail -> pass, p2 pass -> fail


def _write(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(dumps_bytes(line) for line in lines))
    return path


@pytest.fixture(scope="module")
def report_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("html")
    results, scores, base, base_scores = [], [], [], []
    for prompt, plans in PLAN.items():
        for model, (text, outcome, passed) in zip(("writer", "thinker"), plans, strict=True):
            flags = ("empty_answer",) if outcome == "completed" and not text else ()
            answer = record(prompt, model, text, outcome=outcome, flags=flags,
                            ttft=0.02 * int(prompt[1]) + (0.1 if model == "thinker" else 0))
            if (prompt, model) == ("p1", "writer"):
                answer["choices"][0]["tool_calls"] = [{
                    "name": "get_weather", "arguments": '{"city":"Paris","<b>":1}',
                    "parsed": {"city": "Paris", "<b>": 1}, "valid_json": True,
                    "schema_valid": False}]
            if (prompt, model) == ("p3", "writer"):
                answer["text"] = answer["choices"][0]["text"] = LONG
            results.append(answer)
            scores.append(score(answer, passed) if outcome == "completed"
                          else score(answer, None, "unscored"))
            old = record(prompt, model, "b", ttft=0.05)
            base.append(old)
            base_scores.append(score(old, BASELINE.get(prompt, passed)
                                     if model == "writer" else passed))
    a = _write(where / "a.jsonl", results)
    _write(where / "a.scores.jsonl", scores)
    b = _write(where / "b.jsonl", base)
    _write(where / "b.scores.jsonl", [s for s in base_scores if s["passed"] is not None])
    out = where / "report.html"
    done = subprocess.run([sys.executable, "-m", "fanout.cli.main", "report", str(a),
                           "--against", str(b), "--html", str(out)], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"wrote {out}" in done.stdout
    return out


@pytest.fixture
def page(report_file: Path) -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 1100})
            requests: list[str] = []

            def route(route: Any) -> None:
                requests.append(route.request.url)
                if route.request.url == report_file.as_uri():
                    route.continue_()
                else:
                    route.abort()

            context.route("**/*", route)
            page = context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.on("console", lambda message: errors.append(message.text)
                    if message.type == "error" else None)
            page.goto(report_file.as_uri())
            page.wait_for_selector("body[data-ready]")
            page.errors = errors
            page.requests = requests
            page.file_url = report_file.as_uri()
            yield page
        finally:
            browser.close()


def visible(page: Any) -> list[str]:
    return page.eval_on_selector_all(
        "#grid tbody tr.row", "rows => rows.filter(r => !r.hidden).map(r => r.dataset.id)")


def choose(page: Any, name: str) -> list[str]:
    page.click(f'#filters button[data-filter="{name}"]')
    return visible(page)


def test_it_draws_itself_offline_with_charts_and_the_summary(page: Any,
                                                             tmp_path: Path) -> None:
    chosen = os.environ.get("FANOUT_SCREENSHOT_REPORT")
    path = Path(chosen) if chosen else tmp_path / "fanout-report.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"\nscreenshot: {path}")
    marks = page.eval_on_selector_all(".score-chart circle.mark",
                                      "marks => marks.map(m => m.dataset.model)")
    assert sorted(marks) == ["thinker", "writer"]  # one mark per model
    assert page.locator(".score-chart line.whisker").count() == 6  # an interval, two ends
    for metric in ("ttft", "tokens_per_second"):
        assert page.locator(f".dist-{metric} rect.box").count() == 2
    assert page.locator(".dist-ttft circle.dot").count() == 12
    summary = page.locator("#summary table.summary-table").first.text_content() or ""
    assert "writer" in summary and "thinker" in summary and "%" in summary
    assert page.locator("#shown").text_content() == "6 of 6 prompts"
    assert page.errors == []
    assert page.requests == [page.file_url]  # nothing else was even asked for


@pytest.mark.parametrize(("name", "expected"), [
    ("failures", ["p2", "p5", "p6"]), ("errors", ["p4"]), ("truncated", ["p3"]),
    ("empty", ["p5"]), ("different", ["p2", "p5"]), ("all", ["p1", "p2", "p3", "p4", "p5", "p6"])])
def test_each_filter_shows_its_prompts(page: Any, name: str, expected: list[str]) -> None:
    assert choose(page, name) == expected
    assert page.locator("#shown").text_content() == f"{len(expected)} of 6 prompts"
    assert page.errors == []


def test_search_and_filter_together(page: Any) -> None:
    choose(page, "failures")
    page.fill("#search", "p6")
    assert visible(page) == ["p6"]
    page.fill("#search", "")
    assert visible(page) == ["p2", "p5", "p6"]


def test_a_detail_shows_the_whole_answer_and_hostile_text_stays_literal(page: Any) -> None:
    page.click('#grid tr[data-id="p6"] .sample[data-model="writer"]')
    detail = page.locator("#detail")
    assert detail.is_visible()
    assert detail.locator(".detail-title").text_content() == "p6 · writer"
    assert detail.locator(".answer-text").text_content() == HOSTILE  # every character
    assert detail.locator(".reasoning").text_content() == "thinking <b>hard</b>"
    messages = detail.locator(".message pre").all_text_contents()
    assert messages == ["Be brief.", "question p6 <i>markup</i>"]
    assert detail.locator(".expected").text_content() == '"yes"'
    scores = detail.locator(".scores-table").text_content() or ""
    assert "expected 'yes' <u>here</u>" in scores and "fail" in scores
    assert "$0.0001 (price)" in (detail.text_content() or "")
    page.wait_for_timeout(300)  # an onerror would have fired by now
    assert page.evaluate("() => window.__pwned") is None
    assert page.locator("body img, body b, body i, body u, #grid script, #detail script, "
                        "body link").count() == 0
    assert page.evaluate("() => document.scripts.length") == 2  # the data and the page's
    page.keyboard.press("Escape")
    assert not detail.is_visible()
    page.click('#grid tr[data-id="p6"] .sample[data-model="thinker"]')
    assert detail.locator(".answer-text").text_content() == FETCHING
    cell = page.locator('#grid tr[data-id="p6"] .sample[data-model="writer"] .answer')
    assert cell.text_content() == HOSTILE
    assert page.errors == []
    assert page.requests == [page.file_url]  # the markup fetched nothing


def test_the_grid_cuts_long_answers_and_the_detail_has_them_whole_with_tool_calls(
        page: Any) -> None:
    cell = page.locator('#grid tr[data-id="p3"] .sample[data-model="writer"] .answer')
    shown = cell.text_content() or ""
    assert shown == LONG[:220] + "…" and "THE END" not in shown
    page.click('#grid tr[data-id="p3"] .sample[data-model="writer"]')
    assert page.locator("#detail .answer-text").text_content() == LONG
    page.click("#detail .close")
    page.click('#grid tr[data-id="p1"] .sample[data-model="writer"]')
    detail = page.locator("#detail")
    assert detail.locator(".tool-name").text_content() == \
        "→ get_weather (against the schema: invalid)"
    assert detail.locator(".tool-args").text_content() == \
        '{\n  "city": "Paris",\n  "<b>": 1\n}'
    metrics = detail.locator("dl.facts").nth(1).text_content() or ""
    assert "TTFT20ms" in metrics.replace(" ", "") and "4 in, 9 out" in metrics
    assert page.errors == []


def test_the_comparison_lists_flips_and_a_flip_finds_its_prompt(page: Any) -> None:
    against = page.locator("#against")
    text = against.text_content() or ""
    assert "12 keys in both" in text and "0 only in A, 0 only in B" in text
    worse = against.locator(".flips.worse").text_content() or ""
    better = against.locator(".flips.better").text_content() or ""
    assert "writer · exact · pass→fail (1): p2" in worse
    assert "writer · exact · fail→pass (1): p1" in better
    against.locator(".flips.better button.flip").click()
    assert visible(page) == ["p1"]
    assert page.errors == []


def test_without_scores_different_compares_the_answers_text(tmp_path: Path) -> None:
    answers = {"same": ("yes", "yes "), "other": ("yes", "no"), "cut": ("yes", "yes")}
    lines = [record(prompt, model, text) for prompt, texts in answers.items()
             for model, text in zip(("writer", "thinker"), texts, strict=True)]
    lines[-1] = record("cut", "thinker", "ye", outcome="truncated")
    results = _write(tmp_path / "plain.jsonl", lines)
    out = tmp_path / "plain.html"
    done = subprocess.run([sys.executable, "-m", "fanout.cli.main", "report", str(results),
                           "--html", str(out)], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(out.as_uri())
            page.wait_for_selector("body[data-ready]")
            # surrounding spaces do not make answers differ; a truncated "ye" does
            assert choose(page, "different") == ["other", "cut"]
            assert choose(page, "truncated") == ["cut"]
            assert choose(page, "failures") == []
            assert page.locator(".score-chart").count() == 0
            assert "No scores" in (page.locator("#charts").text_content() or "")
            assert page.locator(".dist-ttft rect.box").count() == 2
            assert errors == []
        finally:
            browser.close()


def test_the_grid_is_in_the_prompts_file_order(tmp_path: Path) -> None:
    # Ids that sort differently from the file's order, and later redos of both of "b"'s
    # answers (written last) that must not move it: the grid follows the prompts file,
    # not the ids nor the latest writes.
    lines = [record(prompt, model, "yes") for prompt in ("b", "a", "c")
             for model in ("writer", "thinker")]
    lines += [record("b", "thinker", "yes again"), record("b", "writer", "yes again")]
    results = _write(tmp_path / "order.jsonl", lines)
    out = tmp_path / "order.html"
    done = subprocess.run([sys.executable, "-m", "fanout.cli.main", "report", str(results),
                           "--html", str(out)], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page()
            page.goto(out.as_uri())
            page.wait_for_selector("body[data-ready]")
            assert visible(page) == ["b", "a", "c"]
        finally:
            browser.close()
