"""`fanout score` and `fanout batch --score` end to end against the embedded upstream."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import trio

from fanout.cli.batch import BatchOptions, run_batch
from fanout.cli.main import main
from fanout.cli.score import ScoreOptions, run_score
from fanout.store.results import work_key
from fanout.store.scores import answer_key, read_scores, scores_path
from fanout.upstream import RunningUpstream
from tests.helpers import on_pty

COMMAND = [sys.executable, "-m", "fanout.cli.main"]

MODELS = """
[[models]]
name = "echo"
id = "mock/echo"
price = { input = 1.00, output = 2.00 }

[[models]]
name = "flaky"
id = "fault/truncate:2"

[[models]]
name = "judge"
id = "mock/judge"
params = { max_tokens = 100 }
price = { input = 1.00, output = 4.00 }

[[models]]
name = "slow-judge"
id = "mock/judge:0.15"

[[models]]
name = "garbage-judge"
id = "mock/judge-garbage"

[[scorers]]
name = "exact-ci"
kind = "exact"
ignore_case = true
ignore_punctuation = true

[[scorers]]
name = "has-answer"
kind = "includes"
ignore_case = true

[[scorers]]
name = "judged"
kind = "judge"
model = "judge"

[[scorers]]
name = "slow-judged"
kind = "judge"
model = "slow-judge"
concurrency = 1

[[scorers]]
name = "garbage"
kind = "judge"
model = "garbage-judge"
"""

CONFIG = """
[endpoint]
base_url = "embedded"

[deadlines]
idle = 5
total = 30
""" + MODELS

# mock/echo answers the prompt itself: whether it holds `expected` is known in advance.
PROMPTS = [
    {"id": "capital", "prompt": "Paris", "expected": "paris", "category": "geo"},
    {"id": "sum", "prompt": "The sum is 4", "expected": "4", "tags": ["math"]},
    {"id": "colour", "prompt": "The sky is green", "expected": ["blue", "azure"]},
    {"id": "open", "prompt": "Say something."},
]


def _write(path: Path, lines: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


@pytest.fixture
def config(tmp_path: Path) -> str:
    path = tmp_path / "fanout.toml"
    path.write_text(CONFIG)
    return str(path)


def _batch(tmp_path: Path, config: str, *models: str, prompts: list[dict[str, Any]] = PROMPTS,
           **options: Any) -> tuple[int, str, str, str]:
    out, err = io.StringIO(), io.StringIO()
    output = str(tmp_path / "results.jsonl")
    status = run_batch(BatchOptions(prompts=_write(tmp_path / "prompts.jsonl", prompts),
                                    output=output, models=models, config=config, **options),
                       stdout=out, stderr=err)
    return status, output, out.getvalue(), err.getvalue()


def _score(results: str, config: str, *scorers: str, **options: Any) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = run_score(ScoreOptions(results=results, scorers=scorers, config=config, **options),
                       stdout=out, stderr=err)
    return status, out.getvalue(), err.getvalue()


def _lines(path: Path | str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line]


@pytest.fixture
def results(tmp_path: Path, config: str) -> str:
    status, output, _, err = _batch(tmp_path, config, "echo")
    assert status == 0, err
    return output


# ------------------------------------------------------------------ records and prompts

def test_results_records_carry_the_evaluation_fields(results: str) -> None:
    by_id = {r["id"]: r for r in _lines(results)}
    capital = by_id["capital"]
    assert capital["messages"] == [{"role": "user", "content": "Paris"}]
    assert capital["expected"] == "paris" and capital["category"] == "geo"
    assert "tags" not in capital
    assert by_id["sum"]["tags"] == ["math"] and "category" not in by_id["sum"]
    assert "expected" not in by_id["open"]  # absent, not null
    usage = capital["usage"]
    # priced at 1 and 2 USD per million tokens
    assert capital["cost_source"] == "price"
    assert capital["cost"] == pytest.approx((usage["prompt_tokens"] * 1.0
                                             + usage["completion_tokens"] * 2.0) / 1e6)


def test_a_results_file_from_before_these_fields_still_resumes(tmp_path: Path,
                                                               config: str) -> None:
    status, output, _, _ = _batch(tmp_path, config, "echo")
    assert status == 0
    old = [{k: v for k, v in r.items()
            if k not in ("messages", "expected", "category", "tags", "cost", "cost_source")}
           for r in _lines(output)]
    _write(Path(output), old)
    status, _, _, err = _batch(tmp_path, config, "echo")
    assert status == 0, err
    assert "4 already completed, 0 to run" in err
    # Changing only what is graded against does not redo an answer either.
    changed = [{**p, "expected": "other"} for p in PROMPTS]
    status, _, _, err = _batch(tmp_path, config, "echo", prompts=changed)
    assert "4 already completed, 0 to run" in err


@pytest.mark.parametrize(("line", "problem"), [
    ({"id": "a", "prompt": "x", "tags": "math"}, "tags must be a list of strings, not 'math'"),
    ({"id": "a", "prompt": "x", "tags": ["ok", 3]}, "tags[1] must be a non-empty string, not 3"),
    ({"id": "a", "prompt": "x", "category": 7}, "category must be a non-empty string, not 7"),
])
def test_bad_evaluation_fields_are_listed_bad_lines(tmp_path: Path, config: str,
                                                   line: dict[str, Any], problem: str) -> None:
    prompts = [{"id": "fine", "prompt": "x"}, line]
    status, output, _, err = _batch(tmp_path, config, "echo", prompts=prompts)
    assert status == 2
    assert f"prompts.jsonl:2: {problem}" in err
    assert "1 bad line; nothing was sent" in err
    assert not Path(output).exists() or not Path(output).read_text()


def test_expected_nan_is_a_bad_line(tmp_path: Path, config: str) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"id": "a", "prompt": "x", "expected": NaN}\n')
    err = io.StringIO()
    status = run_batch(BatchOptions(prompts=str(path), output=str(tmp_path / "r.jsonl"),
                                    models=("echo",), config=config), stderr=err,
                       stdout=io.StringIO())
    assert status == 2
    assert "p.jsonl:1: expected must be JSON (NaN and Infinity are not)" in err.getvalue()


# ------------------------------------------------------------------ fanout score

def test_score_then_nothing_new(results: str, config: str) -> None:
    status, out, err = _score(results, config, "exact-ci", "has-answer")
    assert status == 0, err
    assert "exact-ci: 4 new (3 scored, 1 passed, 0 unscored, 1 error), 0 current" in out
    assert "has-answer: 4 new (3 scored, 2 passed, 0 unscored, 1 error), 0 current" in out
    path = scores_path(results)
    assert f"scores: {path}" in out
    scores = read_scores(path)
    capital = scores[(work_key("capital", "echo", 0), "exact-ci")]
    assert capital["status"] == "scored" and capital["passed"] is True
    assert capital["score"] == 1.0 and capital["kind"] == "exact"
    record = next(r for r in _lines(results) if r["id"] == "capital")
    assert capital["answer_key"] == answer_key(record)
    colour = scores[(work_key("colour", "echo", 0), "has-answer")]
    assert colour["passed"] is False and colour["score"] == 0.0
    missing = scores[(work_key("open", "echo", 0), "exact-ci")]
    assert missing["status"] == "error" and "no expected" in missing["explanation"]

    size = path.stat().st_size
    status, out, _ = _score(results, config, "exact-ci", "has-answer")
    assert status == 0
    assert "exact-ci: 0 new (0 scored, 0 passed, 0 unscored, 0 error), 4 current" in out
    assert path.stat().st_size == size  # idempotent: nothing appended


def test_rescore_scores_again_and_the_latest_wins(results: str, config: str) -> None:
    assert _score(results, config, "exact-ci")[0] == 0
    status, out, _ = _score(results, config, "exact-ci", rescore=True)
    assert status == 0
    assert "exact-ci: 4 new" in out
    assert len(_lines(scores_path(results))) == 8
    assert len(read_scores(scores_path(results))) == 4


def test_a_changed_answer_is_rescored_the_rest_kept(results: str, config: str) -> None:
    assert _score(results, config, "exact-ci")[0] == 0
    records = _lines(results)
    changed = {**next(r for r in records if r["id"] == "capital"), "text": "London"}
    changed["choices"] = [{**changed["choices"][0], "text": "London"}]
    with open(results, "a") as file:
        file.write(json.dumps(changed) + "\n")
    status, out, _ = _score(results, config, "exact-ci")
    assert status == 0
    assert "exact-ci: 1 new (1 scored, 0 passed, 0 unscored, 0 error), 3 current" in out
    latest = read_scores(scores_path(results))[(work_key("capital", "echo", 0), "exact-ci")]
    assert latest["passed"] is False


def test_prompts_override_expected_and_missing_ids_are_said(tmp_path: Path, results: str,
                                                            config: str) -> None:
    assert _score(results, config, "exact-ci")[0] == 0
    corrected = [{"id": "capital", "prompt": "Paris", "expected": "Lyon"},
                 {"id": "sum", "prompt": "The sum is 4", "expected": "the sum is 4"}]
    prompts = _write(tmp_path / "corrected.jsonl", corrected)
    status, out, err = _score(results, config, "exact-ci", prompts=prompts)
    assert status == 0, err
    # capital and sum are scored against the new expected values; colour and open have no
    # line: counted and said, their records' expected values used (so still current).
    assert "exact-ci: 2 new (2 scored, 1 passed, 0 unscored, 0 error), 2 current" in out
    assert "2 prompt ids of the results have no line there ('colour', 'open')" in err
    scores = read_scores(scores_path(results))
    assert scores[(work_key("capital", "echo", 0), "exact-ci")]["passed"] is False
    assert scores[(work_key("sum", "echo", 0), "exact-ci")]["passed"] is True


def test_a_bad_prompts_file_scores_nothing(tmp_path: Path, results: str, config: str) -> None:
    prompts = tmp_path / "bad.jsonl"
    prompts.write_text('{"id": "a", "prompt": "x", "tags": 5}\n')
    status, _, err = _score(results, config, "exact-ci", prompts=str(prompts))
    assert status == 2
    assert "bad.jsonl:1: tags must be a list of strings, not 5" in err
    assert not scores_path(results).exists()


def test_unknown_scorer_is_one_line_with_a_suggestion(results: str, config: str) -> None:
    status, out, err = _score(results, config, "exact-cj")
    assert status == 2 and not out
    assert err.count("\n") == 1
    assert "--score 'exact-cj': no such scorer (did you mean 'exact-ci'?)" in err
    assert not scores_path(results).exists()


def test_builtin_scorers_need_no_config_entry(results: str, config: str) -> None:
    status, out, _ = _score(results, config, "exact", "finish")
    assert status == 0
    assert "exact: 4 new (3 scored, 0 passed, 0 unscored, 1 error)" in out  # case differs
    assert "finish: 4 new (4 scored, 4 passed, 0 unscored, 0 error)" in out


def test_units_that_did_not_complete_are_unscored_and_listed(tmp_path: Path,
                                                            config: str) -> None:
    status, output, _, _ = _batch(tmp_path, config, "echo", "flaky")
    assert status == 1  # flaky truncates every stream
    status, out, err = _score(output, config, "has-answer", "judged")
    assert status == 0, err
    assert "has-answer: 8 new (3 scored, 2 passed, 4 unscored, 1 error)" in out
    assert "judged: 8 new (4 scored" in out and "4 unscored" in out
    assert "4 units did not complete and are unscored (not failed): " in err
    assert "capital/flaky#0" in err
    scores = read_scores(scores_path(output))
    flaky = scores[(work_key("capital", "flaky", 0), "judged")]
    assert flaky["status"] == "unscored" and flaky["score"] is None
    assert flaky["explanation"].startswith("truncated")
    assert "judge" not in flaky  # no judge was asked


def test_a_missing_or_foreign_results_file(tmp_path: Path, config: str) -> None:
    status, _, err = _score(str(tmp_path / "none.jsonl"), config, "exact")
    assert status == 2 and "none.jsonl: no such results file" in err
    other = tmp_path / "other.jsonl"
    other.write_text('{"a": 1}\n')
    status, _, err = _score(str(other), config, "exact")
    assert status == 2 and "no results records" in err


def test_scores_file_must_not_be_the_results_file(results: str, config: str) -> None:
    before = Path(results).read_bytes()
    status, _, err = _score(results, config, "exact", scores=results)
    assert status == 2
    assert "is the results file" in err
    assert Path(results).read_bytes() == before


def test_judge_that_answers_garbage_gives_error_scores(results: str, config: str) -> None:
    status, out, err = _score(results, config, "garbage")
    assert status == 0, err  # the judge answered: its answer is no verdict
    assert "garbage: 4 new (0 scored, 0 passed, 0 unscored, 4 error)" in out
    for record in read_scores(scores_path(results)).values():
        assert record["status"] == "error" and record["passed"] is None
        assert record["judge"]["outcome"] == "completed"
        assert record["judge"]["model_id"] == "mock/judge-garbage"


def test_score_subcommand_through_main(results: str, config: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["score", results, "--score", "exact-ci", "--config", config]) == 0
    assert "exact-ci: 4 new" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        main(["score", results, "--config", config])  # --score is required
    assert exit_info.value.code == 2


# ------------------------------------------------------------------ batch --score

def test_batch_scores_as_results_arrive(tmp_path: Path, config: str) -> None:
    status, output, out, err = _batch(tmp_path, config, "echo",
                                      scorers=("exact-ci", "judged"))
    assert status == 0, err
    assert "exact-ci: 4 new (3 scored, 1 passed, 0 unscored, 1 error), 0 current" in out
    # mock/judge: the expected text occurs in capital's and sum's answers, not colour's;
    # open has none, and its answer ends with a full stop: a pass.
    assert "judged: 4 new (4 scored, 3 passed, 0 unscored, 0 error), 0 current; judge cost $" in out
    scores = read_scores(scores_path(output))
    assert len(scores) == 8
    judged = scores[(work_key("capital", "echo", 0), "judged")]
    assert judged["passed"] is True
    assert re.search(r"\nVERDICT [0-9a-f]{16}: PASS$", judged["judge"]["text"])
    # A rerun has nothing to send and nothing to score.
    status, _, out, err = _batch(tmp_path, config, "echo", scorers=("exact-ci", "judged"))
    assert status == 0
    assert "judged: 0 new (0 scored, 0 passed, 0 unscored, 0 error), 4 current" in out
    # A new scorer on a finished batch scores what the file holds.
    status, _, out, _ = _batch(tmp_path, config, "echo", scorers=("has-answer",))
    assert "has-answer: 4 new" in out


def test_batch_unknown_scorer_sends_nothing(tmp_path: Path, config: str) -> None:
    status, output, _, err = _batch(tmp_path, config, "echo", scorers=("nope",))
    assert status == 2
    assert "--score 'nope': no such scorer" in err and "nothing was sent" in err
    assert not Path(output).exists()


def test_batch_scores_to_a_named_file(tmp_path: Path, config: str) -> None:
    target = tmp_path / "elsewhere.jsonl"
    status, output, _, _ = _batch(tmp_path, config, "echo", scorers=("exact",),
                                  scores=str(target))
    assert status == 0
    assert len(read_scores(target)) == 4 and not scores_path(output).exists()


# ------------------------------------------------------------------ judge resumability

async def test_current_judge_scores_send_no_second_request(
        tmp_path: Path, upstream: RunningUpstream) -> None:
    config = tmp_path / "live.toml"
    config.write_text(f'[endpoint]\nbase_url = "{upstream.base_url}"\n' + MODELS)
    prompts = _write(tmp_path / "prompts.jsonl", PROMPTS)
    output = str(tmp_path / "results.jsonl")

    async def fanout(*args: str) -> tuple[int, str, str]:
        done = await trio.run_process([*COMMAND, *args, "--config", str(config)],
                                      capture_stdout=True, capture_stderr=True, check=False)
        return done.returncode, done.stdout.decode(), done.stderr.decode()

    status, _, err = await fanout("batch", prompts, "-m", "echo", "-o", output)
    assert status == 0, err
    assert upstream.stats.requests == {"mock/echo": 4}
    status, out, err = await fanout("score", output, "--score", "judged")
    assert status == 0, err
    assert upstream.stats.requests["mock/judge"] == 4
    status, out, err = await fanout("score", output, "--score", "judged", "--score", "exact")
    assert status == 0, err
    assert "judged: 0 new (0 scored, 0 passed, 0 unscored, 0 error), 4 current" in out
    assert upstream.stats.requests == {"mock/echo": 4, "mock/judge": 4}  # none again
    status, out, err = await fanout("score", output, "--score", "judged", "--rescore")
    assert status == 0, err
    assert upstream.stats.requests == {"mock/echo": 4, "mock/judge": 8}


# ------------------------------------------------------------------ crash safety

def test_sigkill_mid_scoring_then_the_rerun_completes(tmp_path: Path, config: str) -> None:
    prompts = [{"id": f"q{i}", "prompt": f"answer {i}", "expected": f"answer {i}"}
               for i in range(12)]
    status, output, _, _ = _batch(tmp_path, config, "echo", prompts=prompts)
    assert status == 0
    target = scores_path(output)
    process = subprocess.Popen([*COMMAND, "score", output, "--score", "slow-judged",
                                "--config", config], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and process.poll() is None:
            if target.exists() and target.read_bytes().count(b"\n") >= 3:
                break
            time.sleep(0.02)
        assert process.poll() is None, process.communicate()
        process.kill()  # SIGKILL: no cleanup at all
        process.communicate(timeout=30)
    finally:
        process.kill()
    before = target.read_bytes()
    whole = before[:before.rfind(b"\n") + 1]
    first = read_scores(target)  # readable, whatever the kill left
    assert 3 <= len(first) < 12
    status, out, err = _score(output, config, "slow-judged")
    assert status == 0, err
    assert f"slow-judged: {12 - len(first)} new" in out and f"{len(first)} current" in out
    assert target.read_bytes().startswith(whole)  # what was written stays
    scores = read_scores(target)
    assert len(scores) == 12
    assert all(s["passed"] is True for s in scores.values())
    judged = Counter(json.loads(line)["id"] for line in target.read_bytes().splitlines()
                     if line.endswith(b"}"))
    assert set(judged.values()) == {1}  # no unit judged twice


def test_hostile_answers_stay_data(tmp_path: Path, results: str, config: str) -> None:
    record = _lines(results)[0]
    hostile = "\x1b[31mred\x1b[0m \ud800 \u202e <img src=x onerror=alert(1)>"
    record.update(id="hostile", text=hostile)
    record["choices"] = [{**record["choices"][0], "text": hostile}]
    path = tmp_path / "hostile.jsonl"
    path.write_text(json.dumps(record) + "\n")
    status, out, err = _score(str(path), config, "exact-ci", "judged")
    assert status == 0, err
    assert "\x1b" not in out + err and "\u202e" not in out + err
    data = scores_path(path).read_bytes()
    data.decode("utf-8")  # valid UTF-8: the lone surrogate is an escape
    assert b"\x1b" not in data and "\u202e".encode() not in data
    scores = read_scores(scores_path(path))
    assert {s["status"] for s in scores.values()} == {"scored"}


# ------------------------------------------------------------------ progress while judging

def _on_pty(args: list[str]) -> tuple[int, str]:
    return on_pty([*COMMAND, *args], rows=40, columns=160)


def test_score_shows_a_progress_bar_of_the_judges_on_a_terminal(results: str,
                                                                 config: str) -> None:
    status, screen = _on_pty(["score", results, "--score", "slow-judged", "--config", config])
    assert status == 0, screen
    assert "fanout score" in screen and "4/4" in screen and "judged 4" in screen, screen
    # off a terminal: no bar
    status, _, err = _score(results, config, "slow-judged", rescore=True)
    assert status == 0 and "━" not in err and "fanout score: 4 judge requests to send" in err


def test_the_batch_bar_counts_the_judge_requests(tmp_path: Path, config: str) -> None:
    from rich.console import Console

    terminal = Console(file=io.StringIO(), force_terminal=True, width=160, record=True)
    status = run_batch(BatchOptions(prompts=_write(tmp_path / "prompts.jsonl", PROMPTS),
                                    output=str(tmp_path / "results.jsonl"), models=("echo",),
                                    config=config, scorers=("slow-judged", "exact-ci")),
                       stdout=io.StringIO(), stderr=io.StringIO(), progress_console=terminal)
    assert status == 0
    screen = terminal.export_text()
    # 4 answers and 4 judge requests (the exact scorer sends none)
    assert "8/8" in screen and "judged 4" in screen, screen
    assert "4/4" not in screen.splitlines()[-1]
