"""The exit codes a scheduler acts on, one per case, through `fanout batch` and
`fanout score`: 0 done, 1 failed for good, 2 usage, 75 left for a rerun, 143 SIGTERM
(3 and 130: tests/eval/test_budget.py, tests/eval/test_interrupts.py)."""

from __future__ import annotations

import io
import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fanout.batch import BatchOptions, ExitCode
from fanout.cli.batch import run_batch
from fanout.cli.main import main
from fanout.store.results import ResultsFile

MODELS = {
    "fast": "mock/fast",
    "refused": "fault/400",                    # HTTP 400: the request as sent
    "broken": "fault/500-then-ok:1000",       # 500 on every attempt
    "truncating": "fault/truncate:2",          # truncates every stream, alone too
    "slow": "mock/slow:0.05",
    "unfinished": "fault/unfinished-choice",  # n = 2: choice 1 never gets its finish
}


def _config(tmp_path: Path, base_url: str = "embedded", concurrency: int = 4) -> str:
    path = tmp_path / "fanout.toml"
    path.write_text(f'[endpoint]\nbase_url = "{base_url}"\n[deadlines]\nidle = 5\ntotal = 30\n'
                    f"[concurrency]\nmax = {concurrency}\n" + "".join(
                        f'[[models]]\nname = "{name}"\nid = "{model}"\n'
                        for name, model in MODELS.items()))
    return str(path)


def _prompts(tmp_path: Path, count: int = 3) -> str:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"Question {i}?"}) + "\n"
                            for i in range(count)))
    return str(path)


def _batch(tmp_path: Path, *models: str, **options: Any) -> tuple[int, str]:
    err = io.StringIO()
    config = options.pop("config", None) or _config(tmp_path, concurrency=1)
    status = run_batch(BatchOptions(prompts=_prompts(tmp_path), output=str(
        tmp_path / "results.jsonl"), models=models, config=config, **options),
        stdout=io.StringIO(), stderr=err, environ={})
    return status, err.getvalue()


def test_0_every_unit_done(tmp_path: Path) -> None:
    status, err = _batch(tmp_path, "fast")
    assert status == ExitCode.DONE == 0
    assert err.splitlines()[-1] == "fanout batch: exit 0: every unit is done (3 of 3)"


def test_1_a_request_the_server_refuses_as_sent(tmp_path: Path) -> None:
    status, err = _batch(tmp_path, "fast", "refused")
    assert status == ExitCode.FAILED == 1, err
    assert err.splitlines()[-1].startswith(
        "fanout batch: exit 1: 3 units failed in ways a rerun will not fix (HTTP 400")


def test_1_a_model_that_always_truncates(tmp_path: Path) -> None:
    status, err = _batch(tmp_path, "truncating")
    assert status == ExitCode.FAILED, err
    assert "all 3 of its streams were truncated" in err
    assert err.splitlines()[-1].startswith("fanout batch: exit 1: 3 units failed")


def test_1_a_model_whose_every_answer_leaves_a_choice_unfinished(tmp_path: Path) -> None:
    # Completed, but a choice without its finish reason is a unit not done: never exit 0.
    config = Path(_config(tmp_path, concurrency=1))
    config.write_text(config.read_text().replace(
        'id = "fault/unfinished-choice"\n', 'id = "fault/unfinished-choice"\nparams = { n = 2 }\n'))
    status, err = _batch(tmp_path, "unfinished", config=str(config))
    assert status == ExitCode.FAILED == 1, err
    assert "all 3 of its streams were truncated (choice 1 unfinished" in err
    assert err.splitlines()[-1].startswith("fanout batch: exit 1: 3 units failed")
    records = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [(r["outcome"], r["flags"]) for r in records] == [
        ("completed", ["unfinished_choice"])] * 3
    # The same command again redoes them (not done), and says the same.
    status, err = _batch(tmp_path, "unfinished", config=str(config))
    assert status == ExitCode.FAILED, err
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == 6


def test_75_5xx_after_every_retry(tmp_path: Path) -> None:
    status, err = _batch(tmp_path, "fast", "broken")
    assert status == ExitCode.TEMPFAIL == 75, err
    assert err.splitlines()[-1].startswith(
        "fanout batch: exit 75: 3 units are left that a rerun may finish (HTTP 500")


def test_75_temporary_wins_over_permanent(tmp_path: Path) -> None:
    status, err = _batch(tmp_path, "refused", "broken")
    assert status == ExitCode.TEMPFAIL, err
    assert err.splitlines()[-1].endswith("; 3 more failed for good")


def test_75_connection_refused(tmp_path: Path) -> None:
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    config = _config(tmp_path, f"http://127.0.0.1:{port}/v1", concurrency=4)
    status, err = _batch(tmp_path, "fast", config=config)
    assert status == ExitCode.TEMPFAIL, err
    last = err.splitlines()[-1]
    assert last.startswith("fanout batch: exit 75: 3 units are left that a rerun may finish")
    assert "connect" in last.lower() or "refused" in last.lower(), last


def test_75_the_results_file_locked_by_another_run(tmp_path: Path) -> None:
    holder = ResultsFile(tmp_path / "results.jsonl")
    try:
        status, err = _batch(tmp_path, "fast")
    finally:
        holder.close()
    assert status == ExitCode.TEMPFAIL, err
    assert "in use by another" in err and "nothing was sent" in err
    assert err.splitlines()[-1].startswith("fanout batch: exit 75: 3 units are left")


def test_2_usage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, err = _batch(tmp_path, "no-such-model")
    assert status == ExitCode.USAGE == 2
    assert "no-such-model" in err
    assert main(["batch", _prompts(tmp_path), "-o", str(tmp_path / "r.jsonl"),
                 "--shard-concurrency", "0", "--config", _config(tmp_path)]) == 2
    assert "--shard-concurrency must be >= 1, not 0" in capsys.readouterr().err


def test_the_table_is_in_the_help(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("batch", "score"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        out = capsys.readouterr().out
        assert "exit status:" in out and "\n  75   work is left that a rerun may finish" in out


def test_143_sigterm_records_what_ran_and_says_so(tmp_path: Path) -> None:
    config = _config(tmp_path, concurrency=2)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": i, "prompt": "x"}) + "\n" for i in range(40)))
    output = tmp_path / "results.jsonl"
    process = subprocess.Popen(
        [sys.executable, "-m", "fanout", "batch", str(prompts), "-m", "slow", "-o",
         str(output), "--config", config], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and process.poll() is None:
            if output.exists() and output.read_bytes().count(b"\n") >= 2:
                break
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == ExitCode.TERMINATED == 143, err
    assert err.splitlines()[-1].startswith("fanout batch: exit 143: interrupted (SIGTERM)")
    records = [json.loads(line) for line in output.read_text().splitlines()]
    assert 2 <= len(records) < 40
    assert "cancelled" in {r["outcome"] for r in records}  # those in flight: recorded
