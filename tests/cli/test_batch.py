"""`fanout batch` and `fanout report` end to end against the embedded upstream."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fanout.cli.batch import BatchOptions, run_batch
from fanout.cli.main import main
from fanout.store.results import work_key
from tests.helpers import interrupt, sigint_default

COMMAND = [sys.executable, "-m", "fanout.cli.main"]

CONFIG = """
[endpoint]
base_url = "embedded"

[deadlines]
idle = 3
total = 30

[concurrency]
max = 16
per_model = 8

[[models]]
name = "fast"
id = "mock/fast"

[[models]]
name = "echo"
id = "mock/echo"

[[models]]
name = "short"
id = "mock/length"
params = { max_tokens = 5 }

[[models]]
name = "tools"
id = "mock/tools"

[[models]]
name = "flaky"
id = "fault/truncate:3"

[[models]]
name = "stalled"
id = "fault/heartbeat-stall:2"
deadlines = { idle = 0.5 }

[[models]]
name = "busy"
id = "fault/busy:2"

[[models]]
name = "slow"
id = "mock/slow:0.02"

[[models]]
name = "empty"
id = "replay/L10_context_overflow_stream:x0"

[[models]]
name = "missing"
id = "mock/no-such-model"
"""

EXPECTED = {"fast": "completed", "echo": "completed", "short": "completed",
            "tools": "completed", "flaky": "truncated", "stalled": "timed_out"}


@pytest.fixture
def config(tmp_path: Path) -> str:
    path = tmp_path / "fanout.toml"
    path.write_text(CONFIG)
    return str(path)


def prompts_file(tmp_path: Path, count: int, name: str = "prompts.jsonl") -> str:
    path = tmp_path / name
    with path.open("w") as file:
        for i in range(count):
            line: dict[str, Any] = {"id": f"q{i}", "prompt": f"Question number {i}?"}
            if i % 3 == 0:
                line = {"id": i, "messages": [{"role": "user", "content": f"Question {i}"}],
                        "system": "Answer briefly.", "params": {"temperature": 0.5}}
            file.write(json.dumps(line) + "\n")
    return str(path)


def batch(prompts: str, output: str, config: str, *models: str,
          **options: Any) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = run_batch(BatchOptions(prompts=prompts, output=output, models=models,
                                    config=config, **options),
                       stdout=out, stderr=err, environ={})
    return status, out.getvalue(), err.getvalue()


def records(path: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as file:
        return [json.loads(line) for line in file]


def latest(path: str) -> dict[str, dict[str, Any]]:
    return {work_key(r["id"], r["model"], r["sample"]): r for r in records(path)}


def test_every_unit_of_work_once_with_its_outcome(tmp_path: Path, config: str) -> None:
    prompts = prompts_file(tmp_path, 6)
    output = str(tmp_path / "results.jsonl")
    status, out, err = batch(prompts, output, config, *EXPECTED, samples=2)
    assert status == 1, err  # some models fail by design, each the same way every time
    every = records(output)
    keys = Counter(work_key(r["id"], r["model"], r["sample"]) for r in every)
    assert len(keys) == 6 * len(EXPECTED) * 2
    # flaky's streams break off: while others run they look cut, and are redone, until
    # one breaks off alone (then flaky's endings are its own). Each record is kept.
    redone = [r for r in every if r["cut"]]
    assert {r["model"] for r in redone} <= {"flaky"}
    assert all(n == 1 for key, n in keys.items() if "flaky" not in key)
    rows = list(latest(output).values())
    assert not any(r["cut"] for r in rows)
    for row in rows:
        assert row["outcome"] == EXPECTED[row["model"]], row
        assert row["sample"] in (0, 1)
        assert list(row)[:4] == ["id", "model", "sample", "outcome"]
        metrics = row["metrics"]
        assert metrics["queue_wait"] >= 0 and metrics["e2e_latency"] > 0
        assert metrics["chunks"] >= 1 and metrics["output_chars"] > 0
    ids = {r["id"] for r in rows}
    assert ids == {0, "q1", "q2", 3, "q4", "q5"}  # ids kept as given
    fast = next(r for r in rows if r["model"] == "fast")
    assert fast["usage"]["completion_tokens"] > 0 and fast["finish_reason"] == "stop"
    assert fast["metrics"]["ttft"] > 0 and fast["metrics"]["ttfc"] > 0
    assert fast["metrics"]["tokens_estimated"] is False
    short = next(r for r in rows if r["model"] == "short")
    assert short["finish_reason"] == "length" and short["outcome"] == "completed"
    tools = next(r for r in rows if r["model"] == "tools")
    calls = tools["choices"][0]["tool_calls"]
    assert [c["name"] for c in calls] == ["get_weather", "get_time"]
    assert all(c["valid_json"] for c in calls)
    flaky = next(r for r in rows if r["model"] == "flaky")
    assert flaky["text"] and flaky["error"]["message"]  # partial output and why
    stalled = next(r for r in rows if r["model"] == "stalled")
    assert stalled["timed_out"] == "idle"
    echo = next(r for r in rows if r["model"] == "echo" and r["id"] == 0)
    assert echo["text"] == "Question 0"  # messages + system were sent as given
    assert "72 streams: 6 prompts x 6 models x 2 samples; 0 already completed, 72 to run" in err
    lines = err.splitlines()
    assert "fanout batch: 24 of 72 streams are not completed" in lines  # no advice to rerun
    assert ("fanout batch: flaky: all 12 of its streams were truncated (the connection "
            "broke after 3 events without [DONE]: the server closed the connection mid-response "
            "(RemoteProtocolError: peer closed connection without sending …): running the same "
            "command again will not help") in lines
    assert ("fanout batch: stalled: all 12 of its streams timed out (no event within "
            "0.5 s): running the same command again will not help") in lines
    assert not any("run the same command again" in line for line in lines)
    if redone:
        assert (f"fanout batch: flaky: {len(redone)} of its streams that ended while others ran "
                "were redone; it ends that way alone too, so it was not the server cutting them; "
                "concurrency is back to 16") in lines
        assert not any(line.startswith("fanout batch: the server cut") for line in lines)
    for model in EXPECTED:
        assert f" {model} " in out  # the summary table
    assert "\x1b" not in out


def test_resume_skips_completed_and_redoes_the_rest(tmp_path: Path, config: str) -> None:
    prompts = prompts_file(tmp_path, 4)
    output = str(tmp_path / "results.jsonl")
    batch(prompts, output, config, "fast", "flaky")
    first = records(output)
    assert len(latest(output)) == 8  # (flaky's, redone while they looked cut, more than once)
    status, _, err = batch(prompts, output, config, "fast", "flaky")
    assert status == 1
    assert "8 streams: 4 prompts x 2 models x 1 samples; 4 already completed, 4 to run" in err
    rows = records(output)
    assert rows[:len(first)] == first  # appended, never rewritten
    again = rows[len(first):]
    assert {r["model"] for r in again} == {"flaky"}
    assert len({(r["id"], r["sample"]) for r in again}) == 4
    # Only the latest counts: the report sees 4 flaky runs, not 8.
    out = io.StringIO()
    from fanout.cli.report import report
    assert report(output, as_json=True, stdout=out) == 0
    summary = json.loads(out.getvalue())
    assert summary["flaky"]["runs"] == 4 and summary["fast"]["completed"] == 4


def test_a_changed_prompt_or_param_is_redone(tmp_path: Path, config: str) -> None:
    prompts = prompts_file(tmp_path, 3)
    output = str(tmp_path / "results.jsonl")
    assert batch(prompts, output, config, "fast")[0] == 0
    lines = Path(prompts).read_text().splitlines()
    lines[1] = json.dumps({"id": "q1", "prompt": "A different question"})
    Path(prompts).write_text("\n".join(lines) + "\n")
    status, _, err = batch(prompts, output, config, "fast")
    assert status == 0
    assert "2 already completed, 1 to run (1 changed since completed)" in err
    assert [r["id"] for r in records(output)][3:] == ["q1"]


def test_a_torn_last_line_from_a_crash(tmp_path: Path, config: str) -> None:
    prompts = prompts_file(tmp_path, 3)
    output = tmp_path / "results.jsonl"
    assert batch(prompts, str(output), config, "fast")[0] == 0
    whole = output.read_bytes()
    lines = whole.splitlines(keepends=True)
    output.write_bytes(b"".join(lines[:2]) + lines[2][:40])  # the third record, torn
    status, _, err = batch(prompts, str(output), config, "fast")
    assert status == 0
    assert "cut off a torn last line (40 bytes, from an interrupted run) before appending" in err
    assert "2 already completed, 1 to run" in err
    rows = records(str(output))  # every line parses again
    assert len(rows) == 3 and rows[:2] == [json.loads(line) for line in lines[:2]]


def test_rate_limits_lower_the_concurrency_and_still_complete(tmp_path: Path,
                                                               config: str) -> None:
    prompts = prompts_file(tmp_path, 24)
    output = str(tmp_path / "results.jsonl")
    status, _, err = batch(prompts, output, config, "busy", per_model_concurrency=8)
    assert status == 0, err
    rows = records(output)
    assert len(rows) == 24 and {r["outcome"] for r in rows} == {"completed"}
    limited = sum(r["rate_limited"] for r in rows)
    assert limited > 0
    assert sum(r["retry_wait"] for r in rows) > 0
    line = next(line for line in err.splitlines() if line.startswith("fanout batch: busy: "))
    assert f"busy: {limited} 429s; concurrency went down to " in line
    lowest = int(line.split("went down to ")[1].split()[0])
    assert lowest < 8


def test_bad_prompts_stop_the_run_before_anything_is_sent(tmp_path: Path, config: str) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": "a", "prompt": "ok"}\n{"id": "a", "prompt": "dup"}\n{"prompt": 1}\n')
    output = tmp_path / "results.jsonl"
    status, out, err = batch(str(prompts), str(output), config, "fast")
    assert status == 2 and out == ""
    assert err.splitlines() == [
        f"fanout batch: {prompts}:2: duplicate id 'a' (first on line 1)",
        f"fanout batch: {prompts}:3: missing id",
        f"fanout batch: {prompts}: 2 bad lines; nothing was sent",
    ]
    assert not output.exists()


@pytest.mark.parametrize(("options", "message"), [
    ({"samples": 0}, "--samples must be >= 1, not 0"),
    ({"concurrency": 0}, "--concurrency must be >= 1, not 0"),
    ({"models": ("nope",)}, "no model named 'nope'"),
])
def test_bad_options(tmp_path: Path, config: str, options: dict[str, Any], message: str) -> None:
    prompts = prompts_file(tmp_path, 1)
    models = options.pop("models", ("fast",))
    status, _, err = batch(prompts, str(tmp_path / "r.jsonl"), config, *models, **options)
    assert status == 2 and message in err


def test_shards_run_disjoint_slices_that_merge_by_concatenation(tmp_path: Path,
                                                                config: str) -> None:
    prompts = prompts_file(tmp_path, 10)
    parts = []
    for index in range(3):
        output = str(tmp_path / f"shard{index}.jsonl")
        assert batch(prompts, output, config, "fast", "echo", shard=(index, 3))[0] == 0
        parts.append({work_key(r["id"], r["model"], r["sample"]) for r in records(output)})
    assert sum(map(len, parts)) == 20 and len(set().union(*parts)) == 20


def test_the_results_load_in_pandas_and_duckdb(tmp_path: Path, config: str) -> None:
    import duckdb
    import pandas
    prompts = prompts_file(tmp_path, 4)
    output = str(tmp_path / "results.jsonl")
    batch(prompts, output, config, "fast", "tools", "flaky")
    frame = pandas.read_json(output, lines=True)  # flaky's may have been redone: records > 12
    assert {"id", "model", "sample", "outcome", "metrics", "reason", "flags"} <= set(frame)
    assert len(frame.drop_duplicates(["id", "model", "sample"], keep="last")) == 12  # (README)
    rows = duckdb.sql(f"select model, count(distinct id), count(metrics.ttft) = count(*) "
                      f"from read_json_auto('{output}') group by model order by model").fetchall()
    assert rows == [("fast", 4, True), ("flaky", 4, True), ("tools", 4, True)]


def test_the_command_line(tmp_path: Path, config: str, capsys: pytest.CaptureFixture[str]) -> None:
    prompts = prompts_file(tmp_path, 2)
    output = str(tmp_path / "results.jsonl")
    assert main(["batch", prompts, "-m", "fast", "-o", output, "--config", config,
                 "--samples", "2", "--shard", "0/1"]) == 0
    assert len(records(output)) == 4
    assert main(["batch", prompts, "-o", output, "--shard", "2/2", "--config", config]) == 2
    assert "--shard '2/2': I must be in 0..N-1" in capsys.readouterr().err
    assert main(["report", output]) == 0
    assert " fast " in capsys.readouterr().out
    assert main(["report", str(tmp_path / "missing.jsonl")]) == 2


# ---------------------------------------------------------------- subprocesses

def _start(tmp_path: Path, config: str, count: int) -> tuple[subprocess.Popen[str], Path]:
    prompts = prompts_file(tmp_path, count)
    output = tmp_path / "results.jsonl"
    process = subprocess.Popen(
        [*COMMAND, "batch", prompts, "-m", "slow", "-m", "fast", "-o", str(output),
         "--config", config, "--concurrency", "6"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=sigint_default)
    return process, output


def _wait_for(output: Path, process: subprocess.Popen[str], what: str,
              done: Callable[[list[bytes]], bool]) -> None:
    """Until ``done`` holds for the whole lines written to ``output``."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        if output.exists():
            whole = output.read_bytes()
            if done(whole[:whole.rfind(b"\n") + 1].splitlines()):
                return
        time.sleep(0.05)
    raise AssertionError(f"{output} never {what}")


def _wait_for_lines(output: Path, count: int, process: subprocess.Popen[str]) -> None:
    _wait_for(output, process, f"reached {count} lines", lambda lines: len(lines) >= count)


def test_a_batch_started_with_sigint_ignored_is_not_stopped_by_it(tmp_path: Path,
                                                                  config: str) -> None:
    # A background job of a shell without job control (`fanout batch ... &` in a
    # script, nohup) inherits SIGINT ignored: a Ctrl-C meant for the shell is not for it.
    prompts = prompts_file(tmp_path, 12)
    output = tmp_path / "results.jsonl"
    process = subprocess.Popen(
        [*COMMAND, "batch", prompts, "-m", "slow", "-m", "fast", "-o", str(output),
         "--config", config, "--concurrency", "6"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        _wait_for_lines(output, 2, process)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0, err
    assert "interrupted" not in err and len(records(str(output))) == 24


def test_sigkill_mid_run_then_resume(tmp_path: Path, config: str) -> None:
    process, output = _start(tmp_path, config, 40)
    try:
        _wait_for_lines(output, 12, process)
        process.kill()  # SIGKILL: no cleanup at all
        process.communicate(timeout=30)
    finally:
        process.kill()
    before = output.read_bytes()
    whole = before[:before.rfind(b"\n") + 1]
    done_before = {work_key(r["id"], r["model"], r["sample"])
                   for r in map(json.loads, whole.splitlines()) if r["outcome"] == "completed"}
    assert 12 <= len(done_before) < 80
    status, _, err = batch(str(tmp_path / "prompts.jsonl"), str(output), config, "slow", "fast",
                           concurrency=6)
    assert status == 0, err
    rows = records(str(output))
    completed = Counter(work_key(r["id"], r["model"], r["sample"])
                        for r in rows if r["outcome"] == "completed")
    assert len(completed) == 80  # 0 lost
    assert set(completed.values()) == {1}  # 0 completed work redone, 0 duplicates
    assert f"{len(done_before)} already completed, {80 - len(done_before)} to run" in err
    assert output.read_bytes().startswith(whole)  # earlier lines untouched


def _wait_for_model(output: Path, model: str, process: subprocess.Popen[str]) -> None:
    _wait_for(output, process, f"had a record of {model}",
              lambda lines: any(json.loads(line)["model"] == model for line in lines))


def test_ctrl_c_records_the_streams_in_flight_as_cancelled(tmp_path: Path, config: str) -> None:
    process, output = _start(tmp_path, config, 40)
    try:
        # Once a slow stream has finished, the slow ones in flight beside it have text
        # (after only six fast records, they may not have had their first token yet).
        _wait_for_lines(output, 6, process)
        _wait_for_model(output, "slow", process)
        interrupt(process)
        out, err = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 130, err
    assert "Traceback" not in err
    assert re.search(r"interrupted: \d+ answer streams? (were|was) in flight, recorded as "
                     r"cancelled with what had arrived; run the same command again", err), err
    assert "judge" not in err
    assert "fanout batch: exit 130: interrupted (Ctrl-C);" in err
    # The summary was printed (as wide as COLUMNS says: GNU readline, loaded by pytest,
    # exports the terminal's size to children).
    assert any(line.split()[:1] == ["slow"] for line in out.splitlines())
    rows = records(str(output))
    cancelled = [r for r in rows if r["outcome"] == "cancelled"]
    assert cancelled and all(r["model"] == "slow" for r in cancelled)
    assert any(r["text"] for r in cancelled)  # partial output kept
    assert len(rows) < 80  # nothing new was submitted after Ctrl-C
    assert os.path.getsize(output) == len(output.read_bytes())


def test_progress_bar_on_a_terminal_and_lines_elsewhere(tmp_path: Path, config: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console

    import fanout.cli.batch as batch_module

    prompts = prompts_file(tmp_path, 16)
    terminal = Console(file=io.StringIO(), force_terminal=True, width=160, record=True)
    status = run_batch(BatchOptions(prompts=prompts, output=str(tmp_path / "a.jsonl"),
                                    models=("slow", "flaky"), config=config),
                       stdout=io.StringIO(), stderr=io.StringIO(), environ={},
                       progress_console=terminal)
    assert status == 1
    screen = terminal.export_text()
    assert "fanout batch" in screen and "32/32" in screen
    assert "completed 16" in screen and "truncated 16" in screen and "/s" in screen

    monkeypatch.setattr(batch_module, "PLAIN_PROGRESS_EVERY", 0.2)
    plain = io.StringIO()
    run_batch(BatchOptions(prompts=prompts, output=str(tmp_path / "b.jsonl"), models=("slow",),
                           config=config),
              stdout=io.StringIO(), stderr=plain, environ={},
              progress_console=Console(file=plain, width=200))
    lines = [line for line in plain.getvalue().splitlines() if "/16 done (" in line]
    assert lines and lines[0].startswith("fanout batch: ") and "/s" in lines[0]



# ---------------------------------------------------------------- honest outcomes

def test_an_empty_answer_is_not_done_unless_accepted(tmp_path: Path, config: str) -> None:
    # A relay's invented finish_reason "stop" on a stream that produced nothing.
    prompts = prompts_file(tmp_path, 3)
    output = str(tmp_path / "results.jsonl")
    status, out, err = batch(prompts, output, config, "empty", "fast")
    assert status == 1
    rows = latest(output)
    empty = [r for r in rows.values() if r["model"] == "empty"]
    assert len(empty) == 3
    assert all(r["outcome"] == "completed" and r["flags"][0] == "empty_answer"
               and r["reason"] is None and not r["cut"] for r in empty)
    run = next(line for line in err.splitlines() if line.startswith("fanout batch: this run: "))
    assert run.endswith(("3 completed, 3 empty", "3 empty, 3 completed")) \
        or ", 3 empty" in run or ": 3 empty" in run
    assert ("fanout batch: empty: all 3 of its streams came back empty: running the "
            "same command again will not help; --accept-empty counts empty answers as done"
            ) in err.splitlines()
    header, *table = out.splitlines()
    assert "completed   empty " in header
    assert [line.split()[:4] for line in table if line.startswith(" empty ")] == [
        ["empty", "3", "0", "(0%)"]]
    assert [line.split()[4] for line in table if line.startswith(" empty ")] == ["3"]

    # Resume: the empty answers are redone, the completed ones are not.
    status, _, err = batch(prompts, output, config, "empty", "fast")
    assert status == 1 and "3 already completed, 3 to run" in err
    # --accept-empty: the old behaviour, they count as done.
    status, _, err = batch(prompts, output, config, "empty", "fast", accept_empty=True)
    assert status == 0, err
    assert "6 already completed, 0 to run" in err
    report = io.StringIO()
    from fanout.cli.report import report as report_command
    assert report_command(output, as_json=True, stdout=report) == 0
    summary = json.loads(report.getvalue())
    assert summary["empty"]["empty"] == 3 and summary["empty"]["completed"] == 0
    assert summary["fast"]["completed"] == 3 and summary["fast"]["empty"] == 0


def test_accept_empty_on_the_command_line(tmp_path: Path, config: str) -> None:
    prompts = prompts_file(tmp_path, 2)
    output = str(tmp_path / "results.jsonl")
    assert main(["batch", prompts, "-m", "empty", "-o", output, "--config", config]) == 1
    assert main(["batch", prompts, "-m", "empty", "-o", output, "--config", config,
                 "--accept-empty"]) == 0


def test_an_old_results_file_without_flags_still_redoes_empty_answers(
        tmp_path: Path, config: str) -> None:
    prompts = prompts_file(tmp_path, 2)
    output = tmp_path / "results.jsonl"
    assert batch(prompts, str(output), config, "fast")[0] == 0
    rows = records(str(output))
    for row in rows:  # as the first release wrote them: no flags, no cut
        del row["flags"], row["cut"], row["reason"]
    rows[0]["text"] = rows[0]["choices"][0]["text"] = ""
    output.write_text("".join(json.dumps(row) + "\n" for row in rows))
    status, _, err = batch(prompts, str(output), config, "fast")
    assert status == 0 and "1 already completed, 1 to run" in err


def test_requests_the_server_refuses_get_no_advice_to_run_again(tmp_path: Path,
                                                                 config: str) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "ok", "prompt": "fine"}) + "\n"
                       + json.dumps({"id": "ok2", "prompt": "fine too"}) + "\n"
                       + json.dumps({"id": "bad", "prompt": "x",
                                     "params": {"temperature": "hot"}}) + "\n")
    output = str(tmp_path / "results.jsonl")
    status, _, err = batch(str(prompts), output, config, "fast", "missing")
    assert status == 1  # every failure is the request's: a rerun will not fix it
    lines = err.splitlines()
    unknown = ("HTTP 404: the endpoint does not know model 'mock/no-such-model'; `fanout "
               "models` lists what it offers (the server said: The model 'mock/no-such-model' "
               "does not…")
    # the closing line names the case and the reason, cut to 120 characters
    closing = f"fanout batch: exit 1: 4 units failed in ways a rerun will not fix ({unknown}"
    assert lines.pop() == closing[:closing.index("(") + 1 + 120] + "…)"
    assert lines[-3:] == [
        "fanout batch: 4 of 6 streams are not completed",
        f"fanout batch: missing: 3 requests refused as sent (HTTP 400, 404; e.g. {unknown}): "
        "running again sends them unchanged; fix the prompt, the params or the model",
        "fanout batch: fast: 1 request refused as sent (HTTP 400: 'temperature' must be a "
        "number, not 'hot'.): running again sends it unchanged; fix the prompt, the params or "
        "the model"]
    assert latest(output)[work_key("bad", "fast", 0)]["status"] == 400


# ---------------------------------------------------------------- a single-slot server

@pytest.mark.parametrize("cut", ["clean", "broken", "relay", "litellm-error"])
def test_a_single_slot_server_still_completes_every_unit(tmp_path: Path, cut: str) -> None:
    # Four model names, one server-wide slot: each new request cuts the stream that
    # holds it ([DONE] without a finish reason; then broken framing; or a relay's
    # empty "stop"). Lowering the concurrency and redoing the cut units completes them.
    config = tmp_path / "slot.toml"
    config.write_text('[endpoint]\nbase_url = "embedded"\n[deadlines]\nidle = 5\ntotal = 60\n'
                      + "".join(f'[[models]]\nname = "m{i}"\nid = "slot/{cut}:0.005"\n'
                                'params = { max_tokens = 10 }\n' for i in range(4)))
    prompts = prompts_file(tmp_path, 10)
    output = str(tmp_path / "results.jsonl")
    status, out, err = batch(prompts, output, str(config), concurrency=4)
    assert status == 0, err
    final = latest(output)
    assert len(final) == 40
    assert all(r["outcome"] == "completed" and r["flags"] == [] and not r["cut"]
               and r["usage"]["completion_tokens"] == 10 for r in final.values())
    every = records(output)
    redone = [r for r in every if r["cut"]]
    assert redone and len(every) >= 40 + len(redone)  # each attempt is its own record
    assert all(r["others_running"] > 0 for r in redone)
    assert {r["outcome"] for r in redone} == {"relay": {"completed"},
                                              "litellm-error": {"error"}}.get(cut, {"truncated"})
    if cut == "litellm-error":  # the relay's in-band error, after partial text or not: a cut
        assert any(r["text"] for r in redone)
        assert all("APIConnectionError" in r["reason"] for r in redone)
    elif cut != "relay":
        assert {r["reason"] for r in redone} == {
            "[DONE] arrived but no choice had a finish reason (the server cut the stream)"}
    assert max(r["redo"] for r in final.values()) >= 1
    lines = err.splitlines()
    line = next(line for line in lines if "streams ran at once" in line)
    # the endpoint and the most streams that ran on it when one was cut are named
    assert re.fullmatch(
        rf"fanout batch: the server cut {len(every) - 40} answers while up to [234] streams "
        r"ran at once on http://127\.0\.0\.1:\d+/v1; they were redone at lower concurrency "
        r"\(4 → 1\); set \[concurrency\] max = 1 for this endpoint \(or --concurrency 1\)",
        line), line
    relayed = [line for line in lines if "came as a normal end" in line]
    if cut == "relay":  # cuts a relay turned into finished answers: the relay is named
        assert relayed == [
            f"fanout batch: {len(every) - 40} of the cuts came as a normal end: a relay in front of "
            "the server turns cuts into finished answers, and one that also sends usage makes "
            "them impossible to tell from real ones; a one-slot server behind a relay needs "
            "[concurrency] max = 1"]
    else:
        assert relayed == []
    assert "not completed" not in err
    assert all(f" m{i} " in out for i in range(4))  # the summary


def _one_slot_judged(tmp_path: Path, answers: str, cadence: float, extra: str = "") -> Path:
    # Two answer models and a judge model on one llama.cpp-like slot: whoever sends
    # the next request cuts the stream the slot serves, answer or judge.
    config = tmp_path / "slot.toml"
    config.write_text(
        '[endpoint]\nbase_url = "embedded"\n[deadlines]\nidle = 5\ntotal = 60\n' + extra
        + "".join(f'[[models]]\nname = "m{i}"\nid = "slot/{answers}:{cadence}"\n'
                  'params = { max_tokens = 10 }\n' for i in range(2))
        + f'[[models]]\nname = "judge"\nid = "slot/judge:{cadence}"\n'
        + '[[scorers]]\nname = "judged"\nkind = "judge"\nmodel = "judge"\nconcurrency = 2\n')
    return config


@pytest.mark.parametrize("cadence", [0.003, 0.005, 0.008])
def test_answers_and_judges_on_one_slot_share_its_limit(tmp_path: Path, cadence: float) -> None:
    # The judge's streams cut answers and answers cut judges: each is counted as a
    # stream running on the endpoint, so a cut answer is redone (before it is judged)
    # and a cut judge is asked again (never scored), at the endpoint's lowered limit.
    from fanout.store.scores import answer_key, read_scores, scores_path
    config = _one_slot_judged(tmp_path, "clean", cadence)
    prompts = prompts_file(tmp_path, 10)
    output = str(tmp_path / "results.jsonl")
    status, out, err = batch(prompts, output, str(config), "m0", "m1", concurrency=4,
                             scorers=("judged",))
    assert status == 0, err
    final = latest(output)
    assert len(final) == 20
    assert all(r["outcome"] == "completed" and not r["cut"]
               and r["usage"]["completion_tokens"] == 10 for r in final.values()), err
    scores = read_scores(scores_path(output))
    assert {key for key, _ in scores} == set(final)
    for (key, _), score in scores.items():
        # each verdict is the judge's whole reply, about the answer that stands
        assert score["status"] == "scored" and score["judge"]["outcome"] == "completed", score
        assert re.search(r"\nVERDICT [0-9a-f]{16}: (PASS|FAIL)$", score["judge"]["text"].rstrip())
        assert score["answer_key"] == answer_key(final[key])
    cut_answers = len(records(output)) - 20
    line = next(line for line in err.splitlines() if "streams ran at once" in line)
    assert re.fullmatch(r"fanout batch: the server cut (\d+ answers?)?( and )?(\d+ judge "
                        r"requests?)? while up to \d+ streams ran at once on http://\S+/v1; .*",
                        line), line
    said = re.search(r"(\d+) answers?", line.split(" while ")[0])
    assert (int(said[1]) if said else 0) == cut_answers
    judge_cuts = re.search(r"(\d+) judge requests?", line)
    tally = next(line for line in out.splitlines() if line.startswith("judged: "))
    assert re.match(r"judged: 20 new \(20 scored, \d+ passed, 0 unscored, 0 error\), 0 current"
                    + (f", {judge_cuts[1]} judge streams? cut by the server and asked again;"
                       if judge_cuts else ";"), tally), tally


@pytest.mark.parametrize("cadence", [0.003, 0.008])
def test_a_relay_that_hides_cuts_is_met_by_capping_the_endpoint(tmp_path: Path,
                                                                 cadence: float) -> None:
    # slot/litellm: a cut comes as finish_reason "stop", usage and [DONE], byte for byte
    # a finished answer; nothing can tell it.  [concurrency] max = 1 caps the endpoint
    # for answers and judges alike: one stream at a time, nothing is cut.
    from fanout.store.scores import read_scores, scores_path
    config = _one_slot_judged(tmp_path, "litellm", cadence, "[concurrency]\nmax = 1\n")
    prompts = prompts_file(tmp_path, 10)
    output = str(tmp_path / "results.jsonl")
    status, out, err = batch(prompts, output, str(config), "m0", "m1", scorers=("judged",))
    assert status == 0, err
    every = records(output)
    assert len(every) == 20  # nothing was cut, nothing redone
    assert all(r["outcome"] == "completed" and r["usage"]["completion_tokens"] == 10
               and r["others_running"] == 0 for r in every)
    scores = read_scores(scores_path(output))
    assert len(scores) == 20 and all(
        s["status"] == "scored"
        and re.search(r"\nVERDICT [0-9a-f]{16}: (PASS|FAIL)$", s["judge"]["text"].rstrip())
        for s in scores.values())
    assert "ran at once" not in err and "cut by the server" not in out


# ---------------------------------------------------------------- the first run

def test_the_default_config_runs_its_batch_models_and_completes(tmp_path: Path) -> None:
    # No fanout.toml here: the checkout's config/default.toml, whose [batch] models are
    # the well-behaved embedded ones (the fault models are for -m).
    from fanout.config import load_config
    expected = load_config(cwd=tmp_path).batch
    assert expected and not any(
        m.id.startswith("fault/") for m in load_config(cwd=tmp_path).select(expected))
    prompts = prompts_file(tmp_path, 2)
    done = subprocess.run([*COMMAND, "batch", prompts, "-o", "results.jsonl"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "run the same command again" not in done.stderr
    assert f"{2 * len(expected)} streams: 2 prompts x {len(expected)} models" in done.stderr
    rows = records(str(tmp_path / "results.jsonl"))
    assert {r["model"] for r in rows} == set(expected)
    assert {r["outcome"] for r in rows} == {"completed"}


def test_the_docs_duckdb_query_counts_each_key_s_latest_record(tmp_path: Path) -> None:
    import re

    import duckdb

    from fanout.cli.report import report

    batch_page = (Path(__file__).parents[2] / "docs" / "batch.md").read_text()
    query = re.search(r'duckdb\.sql\("""(.*?)"""\)', batch_page, re.S)
    assert query is not None
    # One slot, four names: cut streams are redone, so keys have several records.
    config = tmp_path / "slot.toml"
    config.write_text('[endpoint]\nbase_url = "embedded"\n[deadlines]\nidle = 5\ntotal = 60\n'
                      + "".join(f'[[models]]\nname = "m{i}"\nid = "slot/clean:0.005"\n'
                                'params = { max_tokens = 10 }\n' for i in range(4)))
    prompts = prompts_file(tmp_path, 10)
    output = tmp_path / "results.jsonl"
    batch(prompts, str(output), str(config), concurrency=4)
    # And a second run that redoes a failure: the first record says error, the last completed.
    rows = records(str(output))
    first = {**rows[-1], "outcome": "error", "finished_at": "2000-01-01T00:00:00.000+00:00"}
    output.write_text(json.dumps(first) + "\n" + output.read_text())
    assert len(rows) + 1 > 40  # redone keys
    summary = io.StringIO()
    assert report(str(output), as_json=True, stdout=summary) == 0
    expected = [(model, row["runs"], row["completed"])
                for model, row in sorted(json.loads(summary.getvalue()).items())]
    sql = query.group(1).replace("results.jsonl", str(output))
    got = [(model, runs, completed) for model, runs, completed, _ in duckdb.sql(sql).fetchall()]
    assert got == expected == [(f"m{i}", 10, 10) for i in range(4)]
    naive = duckdb.sql(f"select model, count(*) from read_json_auto('{output}') group by model "
                       "order by model").fetchall()
    assert sum(n for _, n in naive) > 40  # what the old example counted
