"""`fanout report` with scores, on files the tests write: the tables fit 80 columns (and
40, as blocks) with known numbers, --json's keys, --by, --samples, --against with flips and
the keys on one side counted, cost, stale scores; without scores the report is exactly
today's; bad files are one line and exit 2; the HTML file's data cannot close its script."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.cells import cell_len
from rich.console import Console

from fanout.cli.main import main
from fanout.cli.report import model_summary, report, summary_view
from fanout.eval.html import page, report_data
from fanout.records import dumps_bytes
from fanout.store.scores import answer_key

COMMAND = [sys.executable, "-m", "fanout.cli.main"]
HOSTILE = "<img src=x onerror=window.__pwned=1></script><script>alert(1)</script>\u2028"


def answer(prompt: str, model: str, text: str, *, sample: int = 0, outcome: str = "completed",
           **extra: Any) -> dict[str, Any]:
    return {"id": prompt, "model": model, "sample": sample, "outcome": outcome,
            "reason": None if outcome == "completed" else "the connection broke",
            "flags": [], "content_key": f"ck-{prompt}", "text": text,
            "finish_reason": "stop" if outcome == "completed" else None,
            "choices": [{"index": 0, "text": text, "reasoning": "", "refusal": "",
                         "finish_reason": "stop", "tool_calls": []}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12},
            "metrics": {"ttft": 0.05 + 0.01 * sample, "tokens_per_second": 40.0},
            "messages": [{"role": "user", "content": f"question {prompt}"}],
            "expected": "yes", **extra}


def score(record: dict[str, Any], passed: bool | None, *, scorer: str = "exact",
          status: str = "scored", **extra: Any) -> dict[str, Any]:
    return {"id": record["id"], "model": record["model"], "sample": record["sample"],
            "scorer": scorer, "kind": scorer, "scorer_key": "k1",
            "answer_key": answer_key(record), "status": status,
            "score": None if passed is None else float(passed), "passed": passed,
            "explanation": "equals 'yes'" if passed else "not 'yes'",
            "scored_at": "2026-12-01T11:00:00.000+00:00", **extra}


def write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(dumps_bytes(r) for r in records))
    return path


#: (prompt, writer passes per sample, thinker passes per sample)
PLAN = [("q1", [1, 1], [1, 1]), ("q2", [1, 0], [0, 0]), ("q3", [0, 0], [1, 1]),
        ("q4", [1, 1], [1, 0]), ("q5", [1, 1], [1, 1]), ("q6", [0, 0], [0, 0])]


def evaluation_files(tmp_path: Path, name: str = "results") -> tuple[Path, Path]:
    """Two models, six prompts, two samples, one exact scorer, costs; q6 of thinker
    sample 1 truncated (unscored)."""
    records, scores = [], []
    for prompt, *plans in PLAN:
        for model, passes in zip(("writer", "thinker"), plans, strict=True):
            for sample, passed in enumerate(passes):
                category = "math" if prompt in ("q1", "q2", "q3") else "chat"
                outcome = "truncated" if (prompt, model, sample) == ("q6", "thinker", 1) \
                    else "completed"
                record = answer(prompt, model, "yes" if passed else "no", sample=sample,
                                outcome=outcome, category=category, tags=["t"],
                                cost=0.001 if model == "writer" else None,
                                cost_source="price" if model == "writer" else None)
                records.append(record)
                scores.append(score(record, bool(passed)) if outcome == "completed"
                              else score(record, None, status="unscored"))
    return write(tmp_path / f"{name}.jsonl", records), \
        write(tmp_path / f"{name}.scores.jsonl", scores)


def run(*args: str, columns: int = 80) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*COMMAND, "report", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "COLUMNS": str(columns)})


def test_the_report_with_scores_fits_80_columns_with_known_numbers(tmp_path: Path) -> None:
    results, _ = evaluation_files(tmp_path)
    done = run(str(results))
    assert done.returncode == 0 and done.stderr == ""
    lines = done.stdout.splitlines()
    assert max(cell_len(line) for line in lines) <= 80, done.stdout
    text = done.stdout
    assert "scores: exact (k = 2 samples a prompt)" in text
    # writer: prompt means 1, .5, 0, 1, 1, 0 -> 0.58; pass@1 58%, pass@2 67%, pass^2 50%
    writer = next(line for line in lines if re.match(r"writer\s+0\.\d\d\s", line))
    # the interval on the fixed seed: 0.25 to 0.92 (an en dash between)
    assert re.search(r"writer\s+0\.58\s+0\.25\u20130\.92\s+58%\s+25%\u201392%\s+58%\s+67%\s+"
                     r"50%\s+1", writer), writer
    # thinker: q6's second sample is unscored, not a failure: pass@2 left out for q6
    assert re.search(r"thinker\s+12\s+11\s+1\s+0\s+0\s+6", text), text
    assert "thinker: 1 flaky: q4" in text and "writer: 1 flaky: q2" in text
    assert "thinker: 1 prompt with fewer than 2 scored samples left out of pass@2" in text
    assert "95% intervals: bootstrap over prompts (10,000 resamples, seed 13)" in text
    assert re.search(r"writer\s+\$0\.012\s+12\s+0", text) and re.search(
        r"thinker\s+-\s+0\s+12", text)
    assert "total $0.012+ (12 records of unknown cost)" in text
    # the models-by-scorers matrix first (k = 2: the mean over samples), then the summary
    assert lines[0] == "mean score [95% CI]" and lines[1].split() == ["model", "exact"]
    assert re.search(r"writer\s+0\.58 \[0\.25, 0\.92\]", text), text
    summary = lines.index("") + 1
    assert lines[summary].split()[:1] == ["timed"] or "runs" in lines[summary + 1]


@pytest.mark.parametrize("by", [None, "category"])
@pytest.mark.parametrize("width", [120, 80, 60, 40])
def test_every_layout_fits_and_keeps_every_number_whole(tmp_path: Path, width: int,
                                                        by: Any) -> None:
    results, _ = evaluation_files(tmp_path)
    out = io.StringIO()
    console = Console(file=out, width=width, color_system=None, highlight=False, markup=False)
    assert report(str(results), as_json=False, stdout=out, console=console, by=by) == 0
    lines = out.getvalue().splitlines()
    assert max(cell_len(line) for line in lines) <= width, out.getvalue()
    text = "\n".join(lines)
    # writer 0.58 overall; by category writer · math 0.50, writer · chat 0.67 ($0.006 each)
    numbers = ("0.58", "67%", "50%", "$0.012+") if by is None else ("0.50", "0.67", "$0.006")
    for number in numbers:
        assert number in text, (number, text)
    table = [line for line in lines if not line.startswith("  ") and "…" in line]
    assert not table, table


def test_json_has_everything_under_stable_keys(tmp_path: Path) -> None:
    results, scores = evaluation_files(tmp_path)
    done = run(str(results), "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert list(data) == ["files", "summary", "evaluation"]
    assert data["files"] == {"results": str(results), "scores": str(scores), "prompts": None,
                             "against": None, "against_scores": None,
                             "against_prompts": None, "html": None}
    assert set(data["summary"]) == {"writer", "thinker"} and data["summary"]["writer"]["runs"] == 12
    evaluation = data["evaluation"]
    assert evaluation["samples"] == 2 and evaluation["scorers"] == ["exact"]
    assert evaluation["interval"] == {"method": "bootstrap", "confidence": 0.95, "seed": 13,
                                      "resamples": 10000}
    thinker, writer = evaluation["models"]
    assert (thinker["model"], writer["model"]) == ("thinker", "writer")
    exact = writer["scorers"]["exact"]
    assert exact["mean"]["value"] == pytest.approx(7 / 12, abs=1e-6)
    assert exact["pass_at_k"] == {"1": pytest.approx(7 / 12, abs=1e-6),
                                  "2": pytest.approx(4 / 6, abs=1e-6)}
    assert exact["pass_hat_k"] == {"2": 0.5} and exact["flaky"] == ["q2"]
    assert thinker["scorers"]["exact"]["unscored"] == 1
    assert thinker["scorers"]["exact"]["short_prompts"] == 1
    assert writer["cost"] == {"total": 0.012, "known": 12, "unknown": 0, "text": "$0.012"}
    assert thinker["cost"] == {"total": None, "known": 0, "unknown": 12, "text": "-"}
    assert len(writer["ttft"]["values"]) == 12 and writer["ttft"]["p50"] == pytest.approx(0.055)
    analytic = json.loads(run(str(results), "--json", "--interval", "analytic").stdout)
    assert analytic["evaluation"]["models"][1]["scorers"]["exact"]["pass_rate"]["method"] \
        == "wilson"


def test_by_category_and_samples(tmp_path: Path) -> None:
    results, _ = evaluation_files(tmp_path)
    data = json.loads(run(str(results), "--json", "--by", "category", "--samples", "1").stdout)
    rows = [(m["model"], m["group"], m["units"]) for m in data["evaluation"]["models"]]
    assert rows == [("thinker", "chat", 6), ("thinker", "math", 6), ("writer", "chat", 6),
                    ("writer", "math", 6)]
    assert data["evaluation"]["samples"] == 1
    assert all(m["scorers"]["exact"]["pass_at_k"] == {} for m in data["evaluation"]["models"])
    text = run(str(results), "--by", "tag").stdout
    assert "writer · t" in text


def test_without_scores_the_report_is_todays(tmp_path: Path) -> None:
    records = [answer(f"q{i}", m, "yes") for i in range(3) for m in ("a", "b")]
    records[1] = answer("q0", "b", "", outcome="error")
    for record in records:
        del record["expected"]
    path = write(tmp_path / "plain.jsonl", records)
    out = io.StringIO()
    console = Console(file=out, width=80, color_system=None, highlight=False, markup=False)
    assert report(str(path), as_json=False, stdout=out, console=console) == 0
    expected = io.StringIO()
    other = Console(file=expected, width=80, color_system=None, highlight=False, markup=False)
    other.print(summary_view(model_summary(records), other))
    assert out.getvalue() == expected.getvalue()
    assert "scores" not in out.getvalue() and "cost" not in out.getvalue()
    out = io.StringIO()
    assert report(str(path), as_json=True, stdout=out) == 0
    assert json.loads(out.getvalue()) == json.loads(json.dumps(model_summary(records)))


def test_without_scores_cost_is_shown_when_records_carry_it(tmp_path: Path) -> None:
    records = [answer("q1", "a", "yes", cost=0.25, cost_source="reported"),
               answer("q2", "a", "yes", cost=None, cost_source=None)]
    path = write(tmp_path / "cost.jsonl", records)
    done = run(str(path))
    assert done.returncode == 0 and "scores:" not in done.stdout
    assert re.search(r"a\s+\$0\.25\+\s+1\s+1", done.stdout), done.stdout
    data = json.loads(run(str(path), "--json").stdout)
    assert data["a"]["cost"] == {"total": 0.25, "known": 1, "unknown": 1, "text": "$0.25+"}
    assert data["a"]["runs"] == 2  # today's keys stay


def test_against_lists_flips_and_counts_keys_on_one_side(tmp_path: Path) -> None:
    a_records, a_scores, b_records, b_scores = [], [], [], []
    base = {"q1": 1, "q2": 1, "q3": 0, "q4": 0, "q5": 1, "q6": 1}
    new = {"q1": 0, "q2": 1, "q3": 1, "q4": 0, "q5": 0, "q7": 1}  # q6 only in B, q7 only in A
    for passes, records, scores in ((new, a_records, a_scores), (base, b_records, b_scores)):
        for prompt, passed in passes.items():
            record = answer(prompt, "m", "yes" if passed else "no")
            records.append(record)
            scores.append(score(record, bool(passed)))
    a = write(tmp_path / "a.jsonl", a_records)
    write(tmp_path / "a.scores.jsonl", a_scores)
    b = write(tmp_path / "b.jsonl", b_records)
    b_scored = write(tmp_path / "baseline-scores.jsonl", b_scores)
    done = run(str(a), "--against", str(b), "--against-scores", str(b_scored))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert max(cell_len(line) for line in lines) <= 80, done.stdout
    assert "5 keys in both (0 not completed in both), 1 only in A, 1 only in B" in done.stdout
    assert "scorer: exact" in done.stdout
    assert "  m pass→fail: q1, q5" in done.stdout
    assert "  m fail→pass: q3" in done.stdout
    # A 0.40, B 0.60 over q1..q5: A-B -0.20; McNemar exact on 1 against 2: p = 1
    row = next(line for line in lines if re.match(r"m\s+5\s", line))
    assert re.search(r"m\s+5\s+0\.40\s+0\.60\s+-0\.20\s+\[-0\.\d\d, \+0\.\d\d\]", row), row
    assert re.search(r"\s2\s+1\s+1\.000$", row), row
    data = json.loads(run(str(a), "--json", "--against", str(b), "--against-scores",
                          str(b_scored)).stdout)
    against = data["evaluation"]["against"]
    assert (against["only_a"], against["only_b"], against["both"]) == (1, 1, 5)
    (compared,) = against["rows"]
    assert compared["pass_to_fail"] == [{"id": "q1", "sample": 0}, {"id": "q5", "sample": 0}]
    assert compared["fail_to_pass"] == [{"id": "q3", "sample": 0}]
    assert compared["mcnemar"]["b"] == 1 and compared["mcnemar"]["c"] == 2
    assert compared["difference"]["value"] == pytest.approx(-0.2)
    assert data["files"]["against_scores"] == str(b_scored)


def test_scores_made_with_a_prompts_file_need_it_to_be_current(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # results without expected values, scored (fanout score --prompts) against the
    # prompts file's: each score's answer_key hashes the expected value it was scored with
    records = [answer(p, "m", "yes" if p != "q2" else "no") for p in ("q1", "q2", "q3")]
    for record in records:
        del record["expected"]
    lines = {"q1": {"expected": "yes", "category": "easy"},
             "q2": {"expected": "yes", "category": "hard"}, "q3": {"expected": "yes"}}
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": p, "prompt": f"question {p}", **f}) + "\n"
                               for p, f in lines.items()))
    results = write(tmp_path / "r.jsonl", records)
    write(tmp_path / "r.scores.jsonl", [
        {**score(r, r["text"] == "yes"),
         "answer_key": answer_key({**r, "expected": lines[r["id"]]["expected"]})}
        for r in records])
    plain = json.loads(run(str(results), "--json").stdout)["evaluation"]
    assert plain["stale_scores"] == 3  # without the file, none is of these answers
    done = run(str(results), "--json", "--prompts", str(prompts), "--by", "category")
    evaluation = json.loads(done.stdout)["evaluation"]
    assert evaluation["stale_scores"] == 0
    groups = {m["group"]: m["scorers"]["exact"]["mean"]["value"] for m in evaluation["models"]}
    assert groups == {"easy": 1.0, "hard": 0.0, "(none)": 1.0}
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "q1"}\n')
    status, err = _err([str(results), "--prompts", str(bad)], capsys)
    assert status == 2 and err[-1] == f"fanout report: {bad}: 1 bad line"
    assert _err([str(results), "--against-prompts", str(prompts)], capsys) == (
        2, ["fanout report: --against-prompts needs --against"])


def test_stale_scores_are_said_and_left_out(tmp_path: Path) -> None:
    first = answer("q1", "m", "no")
    redone = answer("q1", "m", "yes")
    path = write(tmp_path / "r.jsonl", [first, redone, answer("q2", "m", "yes")])
    write(tmp_path / "r.scores.jsonl", [score(first, False),
                                         score(answer("q2", "m", "yes"), True)])
    done = run(str(path))
    assert "1 stale scores left out (of an older answer: fanout score rescores them)" in \
        done.stdout
    data = json.loads(run(str(path), "--json").stdout)["evaluation"]
    assert data["stale_scores"] == 1
    exact = data["models"][0]["scorers"]["exact"]
    assert (exact["scored"], exact["missing"], exact["mean"]["value"]) == (1, 1, 1.0)


def test_hostile_names_reach_the_terminal_inert(tmp_path: Path) -> None:
    record = answer("q\x1b[31mred", "m\x1b]0;title\x07", "yes")
    path = write(tmp_path / "r.jsonl", [record])
    write(tmp_path / "r.scores.jsonl", [score(record, True, scorer="ex\x1b[2Jact")])
    done = run(str(path))
    assert done.returncode == 0
    assert "\x1b" not in done.stdout and "\x07" not in done.stdout


# ---------------------------------------------------------------------- bad input

def _err(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    status = main(["report", *args])
    return status, capsys.readouterr().err.splitlines()


def test_bad_files_are_one_line_and_exit_2(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    results, scores = evaluation_files(tmp_path)
    missing = tmp_path / "none.scores.jsonl"
    assert _err([str(results), "--scores", str(missing)], capsys) == (
        2, [f"fanout report: {missing}: no such file"])
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text("hello\nworld\n")
    status, lines = _err([str(results), "--scores", str(garbage)], capsys)
    assert status == 2 and lines[-1] == (
        f"fanout report: {garbage}: not a fanout scores file: no line is a score record (an "
        "object with id, model, sample, scorer, status, answer_key and scorer_key)")
    assert _err([str(results), "--scores", str(tmp_path)], capsys) == (
        2, [f"fanout report: {tmp_path}: cannot read: Is a directory"])
    assert _err([str(results), "--against", str(tmp_path / "b.jsonl")], capsys) == (
        2, [f"fanout report: {tmp_path / 'b.jsonl'}: no such file"])
    assert _err([str(results), "--against", str(garbage)], capsys)[0] == 2
    assert _err([str(results), "--samples", "0"], capsys) == (
        2, ["fanout report: --samples 0: must be 1 or more"])
    assert _err([str(results), "--against-scores", str(scores)], capsys) == (
        2, ["fanout report: --against-scores needs --against"])
    status, lines = _err([str(results), "--html", str(tmp_path / "no" / "such" / "r.html")],
                         capsys)
    assert status == 2 and len(lines) == 1 and lines[0].startswith(
        f"fanout report: --html {tmp_path / 'no' / 'such' / 'r.html'}: cannot write: ")


def test_html_never_replaces_an_input_or_a_file_that_is_not_a_page(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results, scores = evaluation_files(tmp_path)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": "q1", "prompt": "hi"}\n')
    link = tmp_path / "link.html"
    link.symlink_to(results)
    before = {p: p.read_bytes() for p in (results, scores, prompts)}
    assert _err([str(results), "--html", str(results)], capsys) == (
        2, [f"fanout report: --html {results}: is {results}, an input of the report; "
            "name another file"])
    assert _err([str(results), "--html", str(link)], capsys)[0] == 2
    assert _err([str(results), "--html", str(scores)], capsys)[0] == 2
    assert _err([str(results), "--html", str(prompts)], capsys) == (
        2, [f"fanout report: --html {prompts}: exists and is not an HTML page (it is left "
            "as it was); name another file"])
    assert _err([str(results), "--html", "/dev/null"], capsys) == (
        2, ["fanout report: --html /dev/null: not a regular file (a character device); "
            "name a file to write the page to"])
    assert {p: p.read_bytes() for p in before} == before
    page_file = tmp_path / "r.html"
    assert main(["report", str(results), "--html", str(page_file)]) == 0
    assert main(["report", str(results), "--html", str(page_file)]) == 0  # a page: replaced
    assert page_file.read_text().startswith("<!doctype html>")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_damaged_scores_line_is_counted_like_results_lines(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results, scores = evaluation_files(tmp_path)
    lines = scores.read_bytes().splitlines(keepends=True)
    scores.write_bytes(lines[0] + b"not json\n" + b"".join(lines[1:]) + b'{"id": "q1", "mo')
    status = main(["report", str(results), "--json"])
    captured = capsys.readouterr()
    assert status == 0
    assert captured.err.splitlines() == [
        f"fanout report: {scores}: 1 line is not JSON: line 2",
        f"fanout report: {scores}: ignored a torn last line (16 bytes, from an interrupted run)"]
    data = json.loads(captured.out)
    assert data["evaluation"]["models"][1]["scorers"]["exact"]["scored"] == 12


def test_the_html_files_data_cannot_close_its_script(tmp_path: Path) -> None:
    from fanout.eval.aggregate import evaluate, prepare

    record = answer("q<1>", "m</script>", HOSTILE, reasoning="\ud800 & <!--")
    record["choices"][0]["reasoning"] = "lone \ud800 and <!-- a comment"
    run_ = prepare([record], {})
    data = report_data(run_, evaluate(run_, resamples=10), title="</title><b>x</b>")
    text = page(data)
    text.encode("utf-8")  # valid UTF-8: the lone surrogate is an escape
    body = text.split('<script type="application/json" id="data">', 1)[1].split("</script>")[0]
    assert "<" not in body and ">" not in body and "&" not in body and "\u2028" not in body
    assert json.loads(body) == json.loads(json.dumps(data))
    assert json.loads(body)["cells"][0]["text"] == HOSTILE
    assert "<title>fanout report · &lt;/title&gt;&lt;b&gt;x&lt;/b&gt;</title>" in text
    assert text.count("<script") == 2 and text.count("</script>") == 2
    policy = re.search(r'content="(default-src [^"]+)"', text)
    assert policy and "'unsafe-inline'" not in policy.group(1)
    assert "script-src 'sha256-" in policy.group(1) and "connect-src" not in policy.group(1)


def test_the_report_opens_with_the_models_by_scorers_matrix(tmp_path: Path) -> None:
    models = ["mock/echo", "openai/gpt-4o-mini-2024-07-18", "anthropic/claude-3-5-haiku-latest",
              "mock/steady", "meta-llama/llama-3.1-70b-instruct", "mock/fast"]
    results, scores = [], []
    for prompt in range(8):
        for index, model in enumerate(models):
            record = answer(f"p{prompt}", model, "yes")
            results.append(record)
            for number, scorer in enumerate(("exact", "contains", "judge")):
                scores.append(score(record, (prompt + index + number) % 3 != 0, scorer=scorer))
    path = write(tmp_path / "six.jsonl", results)
    write(tmp_path / "six.scores.jsonl", scores)
    buffer = io.StringIO()
    console = Console(file=buffer, width=80, color_system=None)
    assert report(str(path), as_json=False, console=console) == 0
    lines = buffer.getvalue().splitlines()
    assert all(cell_len(line) <= 80 for line in lines), [line for line in lines if cell_len(line) > 80]
    # The first table is the matrix: a model per row, a scorer per column, mean [CI] cells.
    assert lines[0] == "mean score [95% CI]"
    assert lines[1].split() == ["model", "contains", "exact", "judge"]
    body = lines[3:lines.index("")]
    cells = [re.findall(r"\d\.\d\d \[\d\.\d\d, \d\.\d\d\]", line) for line in body]
    assert sum(1 for row in cells if row) == 6 and all(len(row) in (0, 3) for row in cells)
    assert lines.index("") < next(i for i, line in enumerate(lines) if "completed" in line)
