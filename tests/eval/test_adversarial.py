"""The evaluation used by a hostile user: files and runs that the happy path never sees.

Every case here was a defect found by running the CLI in a subprocess (or
through its ``run_*`` entry points) against the embedded upstream: a traceback,
a hang, a verdict that changes between two runs, a ``NaN``/``Infinity`` in
``--json``, or a failure nobody was told about.
"""

from __future__ import annotations

import io
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fanout.cli.batch import BatchOptions, run_batch
from fanout.cli.report import report
from fanout.cli.score import ScoreOptions, run_score
from fanout.store.scores import read_scores, scores_path
from tests.helpers import interrupt, sigint_default

COMMAND = [sys.executable, "-m", "fanout.cli.main"]

CONFIG = """
[endpoint]
base_url = "embedded"

[deadlines]
idle = 5
total = 30

[[models]]
name = "echo"
id = "mock/echo"
price = { input = 1.00, output = 2.00 }

[[models]]
name = "judge"
id = "mock/judge"
params = { max_tokens = 100 }

[[models]]
name = "slow-judge"
id = "mock/judge:0.2"

[[models]]
name = "cut-judge"
id = "fault/truncate:2"

[[scorers]]
name = "judged"
kind = "judge"
model = "judge"

[[scorers]]
name = "slow-judged"
kind = "judge"
model = "slow-judge"
concurrency = 2

[[scorers]]
name = "cut-judged"
kind = "judge"
model = "cut-judge"
"""


def _write(path: Path, lines: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


@pytest.fixture
def config(tmp_path: Path) -> str:
    path = tmp_path / "fanout.toml"
    path.write_text(CONFIG)
    return str(path)


def _batch(tmp_path: Path, config: str, prompts: list[dict[str, Any]] | str,
           *models: str, **options: Any) -> tuple[int, str, str, str]:
    out, err = io.StringIO(), io.StringIO()
    output = str(tmp_path / "results.jsonl")
    source = prompts if isinstance(prompts, str) else _write(tmp_path / "prompts.jsonl",
                                                              prompts)
    status = run_batch(BatchOptions(prompts=source, output=output, models=models or ("echo",),
                                    config=config, **options), stdout=out, stderr=err)
    return status, output, out.getvalue(), err.getvalue()


def _score(results: str, config: str, *scorers: str, **options: Any) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = run_score(ScoreOptions(results=results, scorers=scorers, config=config, **options),
                       stdout=out, stderr=err)
    return status, out.getvalue(), err.getvalue()


def _report(path: str, **options: Any) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = report(path, as_json=options.pop("as_json", False), stdout=out, stderr=err,
                    **options)
    return status, out.getvalue(), err.getvalue()


def _one_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


# ------------------------------------------------------------------ prompts files

def test_a_deeply_nested_expected_is_a_bad_line_not_a_traceback(tmp_path: Path,
                                                                config: str) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    prompts = tmp_path / "deep.jsonl"
    prompts.write_text('{"id": "ok", "prompt": "x"}\n'
                       f'{{"id": "deep", "prompt": "x", "expected": {deep}}}\n')
    run = subprocess.run([*COMMAND, "batch", str(prompts), "-m", "echo", "-o",
                          str(tmp_path / "r.jsonl"), "--config", config, "--score", "exact"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr
    assert f"{prompts}:2: bad JSON: nested too deeply" in run.stderr
    assert not (tmp_path / "r.jsonl").exists()  # nothing was sent


def test_score_prompts_deeply_nested_is_one_line(tmp_path: Path, config: str) -> None:
    status, output, _, _ = _batch(tmp_path, config, [{"id": "a", "prompt": "a"}])
    assert status == 0
    fixed = tmp_path / "fixed.jsonl"
    fixed.write_text('{"id": "a", "prompt": "a", "expected": ' + "{\"a\": " * 50_000
                     + "1" + "}" * 50_000 + "}\n")
    status, _, err = _score(output, config, "exact", prompts=str(fixed))
    assert status == 2
    assert "Traceback" not in err
    assert f"{fixed}:1: bad JSON: nested too deeply" in err
    assert not scores_path(output).exists()


def test_an_expected_integer_past_64_bits_scores_the_same_after_the_round_trip(
        tmp_path: Path, config: str) -> None:
    # The results file reads 12345678901234567890123 back as a float: the batch must
    # score what the file will say, or its scores are stale at once and `fanout score`
    # gives another verdict.
    big = 12345678901234567890123
    status, output, out, err = _batch(
        tmp_path, config, [{"id": "big", "prompt": str(big), "expected": big},
                           {"id": "small", "prompt": "12", "expected": 12}],
        scorers=("exact", "numeric"))
    assert status == 0, err
    first = {(s["id"], s["scorer"]): s for s in read_scores(scores_path(output)).values()}
    status, out, err = _score(output, config, "exact", "numeric")
    assert status == 0, err
    assert "exact: 0 new" in out and "numeric: 0 new" in out, out
    status, out, err = _report(output, as_json=True)
    assert status == 0, err
    evaluation = json.loads(out)["evaluation"]
    assert evaluation["stale_scores"] == 0
    # the verdict is the one a rescore gives
    status, out, err = _score(output, config, "exact", "numeric", rescore=True)
    assert status == 0, err
    again = {(s["id"], s["scorer"]): s for s in read_scores(scores_path(output)).values()}
    assert {k: v["passed"] for k, v in again.items()} == \
        {k: v["passed"] for k, v in first.items()}


def test_prompts_override_with_a_huge_integer_is_not_stale_in_the_report(
        tmp_path: Path, config: str) -> None:
    status, output, _, _ = _batch(tmp_path, config, [{"id": "big", "prompt": "1"}])
    assert status == 0
    fixed = _write(tmp_path / "fixed.jsonl",
                   [{"id": "big", "prompt": "1", "expected": 10 ** 30}])
    status, out, err = _score(output, config, "exact", prompts=fixed)
    assert status == 0, err
    status, out, err = _score(output, config, "exact", prompts=fixed)
    assert "exact: 0 new" in out, out
    status, out, err = _report(output, as_json=True, prompts=fixed)
    assert status == 0, err
    assert json.loads(out)["evaluation"]["stale_scores"] == 0


# ------------------------------------------------------------------ scores files

def test_report_reads_scores_from_a_pipe(tmp_path: Path, config: str) -> None:
    # `fanout report run.jsonl --scores <(...)`: a pipe is read once, like any input
    status, output, _, _ = _batch(tmp_path, config, [{"id": "a", "prompt": "a",
                                                      "expected": "a"}], scorers=("exact",))
    assert status == 0
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    process = subprocess.Popen([*COMMAND, "report", output, "--scores", str(fifo), "--json"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        with open(fifo, "wb") as pipe:
            pipe.write(scores_path(output).read_bytes())
        out, err = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 0, err
    (model,) = json.loads(out)["evaluation"]["models"]
    assert model["scorers"]["exact"]["passed"] == 1


def test_score_scores_on_a_fifo_is_refused(tmp_path: Path, config: str) -> None:
    status, output, _, _ = _batch(tmp_path, config, [{"id": "a", "prompt": "a"}])
    assert status == 0
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    status, out, err = _score(output, config, "exact", scores=str(fifo))
    assert status == 2 and out == ""
    assert _one_line(err).startswith(f"fanout score: --scores {fifo}: not a regular file "
                                     "(a pipe)")


def test_report_scores_naming_the_results_file_is_one_line(tmp_path: Path,
                                                           config: str) -> None:
    status, output, _, _ = _batch(tmp_path, config, [{"id": "a", "prompt": "a"}])
    assert status == 0
    for given in (output, os.path.join(os.path.dirname(output), ".", "results.jsonl")):
        status, out, err = _report(output, scores=given)
        assert status == 2
        assert _one_line(err) == (f"fanout report: --scores {given}: is the results file "
                                  f"{output}; name its scores file")
        assert out == ""


def test_against_scores_naming_a_results_file_is_one_line(tmp_path: Path,
                                                          config: str) -> None:
    status, output, _, _ = _batch(tmp_path, config, [{"id": "a", "prompt": "a"}])
    assert status == 0
    status, out, err = _report(output, against=output, against_scores=output)
    assert status == 2 and out == ""
    assert _one_line(err) == (f"fanout report: --against-scores {output}: is the results "
                              f"file {output}; name its scores file")


# ------------------------------------------------------------------ --json

def test_json_has_no_infinity_from_huge_metrics(tmp_path: Path, config: str) -> None:
    status, output, _, _ = _batch(tmp_path, config,
                                  [{"id": f"q{i}", "prompt": "a"} for i in range(4)])
    assert status == 0
    records = [json.loads(line) for line in Path(output).read_text().splitlines()]
    for record in records:  # a hostile or broken writer: finite, but near the limit
        record["metrics"]["ttft"] = 1.7e308
        record["metrics"]["tokens_per_second"] = 1.7e308
    _write(Path(output), records)
    for options in ({}, {"scores": None, "samples": 1}):
        status, out, err = _report(output, as_json=True, **options)
        assert status == 0, err
        assert "Infinity" not in out and "NaN" not in out
        data = json.loads(out)
        summary = data.get("summary", data)
        assert summary["echo"]["ttft_p50"] == 1.7e308
        assert summary["echo"]["tokens_per_second_p50"] == 1.7e308
        assert math.isfinite(summary["echo"]["ttft_p95"])


# ------------------------------------------------------------------ judges

def test_batch_says_when_judge_streams_did_not_complete(tmp_path: Path, config: str) -> None:
    status, output, out, err = _batch(tmp_path, config,
                                      [{"id": "a", "prompt": "a", "expected": "a"}],
                                      scorers=("cut-judged",))
    # the answers completed, the judging did not: exit 75 (a rerun asks the judge again),
    # and the way to finish said
    assert status == 75, err
    assert "cut-judged: 1 new (0 scored, 0 passed, 0 unscored, 1 error)" in out
    assert ("fanout batch: 1 judge stream did not complete (error scores); "
            f"`fanout score {output} --score cut-judged --config {config}` asks it again") in err
    status, out, err = _score(output, config, "cut-judged")
    assert status == 75 and "cut-judged: 1 new" in out  # not current: asked again


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupting_score_keeps_what_was_judged_and_writes_no_false_errors(
        tmp_path: Path, config: str, sig: signal.Signals) -> None:
    prompts = [{"id": f"q{i}", "prompt": f"answer {i}", "expected": f"answer {i}"}
               for i in range(12)]
    status, output, _, _ = _batch(tmp_path, config, prompts)
    assert status == 0
    target = scores_path(output)
    process = subprocess.Popen([*COMMAND, "score", output, "--score", "slow-judged",
                                "--config", config], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, preexec_fn=sigint_default)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and process.poll() is None:
            if target.exists() and target.read_bytes().count(b"\n") >= 2:
                break
            time.sleep(0.02)
        assert process.poll() is None, process.communicate()
        interrupt(process, sig)
        out, err = process.communicate(timeout=30)
    finally:
        process.kill()
    assert "Traceback" not in err
    assert process.returncode == 128 + sig, err
    assert "interrupted: the judges not asked yet are left; run the same command again" in err
    written = [json.loads(line) for line in target.read_bytes().splitlines()]
    # judges cut by the interrupt are not the model's errors: nothing is written for them
    assert written and all(line["status"] == "scored" for line in written), written
    status, out, err = _score(output, config, "slow-judged")
    assert status == 0, err
    assert f"slow-judged: {12 - len(written)} new" in out
    assert f"{len(written)} current" in out
    assert len(read_scores(target)) == 12


# ------------------------------------------------------------------ pass@k by hand

def _unit(prompt: str, sample: int, text: str) -> dict[str, Any]:
    return {"id": prompt, "model": "m", "sample": sample, "outcome": "completed",
            "reason": None, "flags": [], "content_key": f"ck-{prompt}", "text": text,
            "finish_reason": "stop",
            "choices": [{"index": 0, "text": text, "finish_reason": "stop", "tool_calls": []}],
            "expected": "yes"}


def test_pass_at_k_of_flaky_samples_matches_the_hand_computation(tmp_path: Path) -> None:
    from fanout.store.scores import answer_key

    # three samples a prompt: p1 passes 2 of 3, p2 1 of 3, p3 3 of 3, p4 0 of 3
    plan = {"p1": [1, 0, 1], "p2": [0, 0, 1], "p3": [1, 1, 1], "p4": [0, 0, 0]}
    results, scores = [], []
    for prompt, passes in plan.items():
        for sample, passed in enumerate(passes):
            unit = _unit(prompt, sample, "yes" if passed else f"no {sample}")
            results.append(unit)
            scores.append({"id": prompt, "model": "m", "sample": sample, "scorer": "exact",
                           "kind": "exact", "scorer_key": "k", "answer_key": answer_key(unit),
                           "status": "scored", "score": float(passed),
                           "passed": bool(passed), "explanation": "",
                           "scored_at": "2026-12-01T11:00:00.000+00:00"})
    output = _write(tmp_path / "run.jsonl", results)
    _write(tmp_path / "run.scores.jsonl", scores)
    status, out, err = _report(output, as_json=True, samples=3)
    assert status == 0, err
    (model,) = json.loads(out)["evaluation"]["models"]
    exact = model["scorers"]["exact"]
    # pass@k = mean over prompts of 1 - C(n-c, k)/C(n, k); pass^k = C(c, k)/C(n, k)
    c = {"p1": 2, "p2": 1, "p3": 3, "p4": 0}
    by_hand_at = {k: sum(1 - math.comb(3 - n, k) / math.comb(3, k) for n in c.values()) / 4
                  for k in (1, 2, 3)}
    by_hand_hat = {k: sum(math.comb(n, k) / math.comb(3, k) for n in c.values()) / 4
                   for k in (2, 3)}
    assert by_hand_at == {1: 0.5, 2: pytest.approx(2 / 3), 3: 0.75}
    # the report gives pass@1, pass@K and pass^K (K = --samples 3)
    assert exact["pass_at_k"] == {"1": pytest.approx(by_hand_at[1], abs=1e-6),
                                  "3": pytest.approx(by_hand_at[3], abs=1e-6)}
    assert exact["pass_hat_k"] == {"3": pytest.approx(by_hand_hat[3], abs=1e-6)}
    assert by_hand_hat[3] == 0.25
    assert sorted(exact["flaky"]) == ["p1", "p2"]
    assert exact["mean"]["value"] == pytest.approx(0.5, abs=1e-6)


def test_score_says_when_a_batch_is_still_writing_the_results(tmp_path: Path) -> None:
    config = tmp_path / "slow.toml"
    config.write_text(CONFIG + '\n[[models]]\nname = "slow-echo"\nid = "mock/echo:0.2"\n')
    prompts = _write(tmp_path / "prompts.jsonl",
                     [{"id": f"q{i}", "prompt": f"answer {i}", "expected": f"answer {i}"}
                      for i in range(12)])
    output = tmp_path / "results.jsonl"
    batch = subprocess.Popen([*COMMAND, "batch", prompts, "-m", "slow-echo", "-o", str(output),
                              "--config", str(config), "--concurrency", "1"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and batch.poll() is None:
            if output.exists() and output.read_bytes().count(b"\n") >= 2:
                break
            time.sleep(0.02)
        assert batch.poll() is None, batch.communicate()
        status, out, err = _score(str(output), str(config), "exact")
        assert batch.poll() is None  # the batch was still running all along
        batch.communicate(timeout=60)
    finally:
        batch.kill()
    assert status == 0, err
    assert f"fanout score: {output}: being written by a running fanout batch (pid " in err
    assert "recorded so far: run the same command again once it ends to score the rest" in err
    scored = int(out.split("exact: ")[1].split(" new")[0])
    assert 2 <= scored < 12
    status, out, err = _score(str(output), str(config), "exact")
    assert status == 0 and "being written" not in err
    assert f"exact: {12 - scored} new" in out and f"{scored} current" in out
