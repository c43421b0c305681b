"""Ctrl-C, for real: SIGINT to a ``fanout`` process, never a traceback, always exit 130.

- ``fanout score`` and ``fanout batch --score``: after SIGINT no judge request
  reaches the upstream (counted there: the test runs the embedded upstream
  itself), the judges in flight are cancelled, not waited for (one of them
  never answers: the process could not end otherwise), the scores written
  stay.
- ``fanout report`` (plain, ``--html``, and reading a FIFO no one writes).
- The first moments of any command, while it imports: the console script's
  entry point (``_fanout_entry``, as ``[project.scripts]`` names it) handles
  SIGINT before the package is imported.  A SIGINT is placed exactly, inside
  the import of a given module (a ``sitecustomize`` whose import hook sends
  it), and at random delays after the spawn.

Every child gets SIGINT's default action (``preexec_fn=sigint_default``): a suite run in
the background would otherwise pass it on ignored, and no Ctrl-C would reach ``fanout``.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
import trio

from fanout.store.scores import scores_path
from fanout.upstream import open_upstream
from tests.helpers import JUDGING_CONFIG, interrupt, sigint_default

ROOT = Path(__file__).resolve().parents[2]
COMMAND = [sys.executable, "-m", "fanout.cli.main"]



def _prompts(path: Path, count: int) -> str:
    path.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"answer {i}",
                                        "expected": f"answer {i}"}) + "\n"
                            for i in range(count)))
    return str(path)


def _environ(*first: Path) -> dict[str, str]:
    paths = [*map(str, first), str(ROOT)]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def _last_line(err: str) -> str:
    assert "Traceback" not in err, err
    return err.rstrip("\n").splitlines()[-1]


async def _interrupted_while_judging(tmp_path: Path, argv: list[str], results: Path) -> None:
    """Run ``argv`` (with ``--score judged --score stuck-judged``) against an upstream this
    test serves; once the two judged scores are written and the stuck judge's first request
    hangs, SIGINT.  The scorers' order alternates judged, stuck-judged per answer, each at
    concurrency 1, so the submitter is then waiting for the stuck judge's slot."""
    async with open_upstream() as upstream:
        config = tmp_path / "fanout.toml"
        config.write_text(JUDGING_CONFIG.format(base_url=upstream.base_url))
        stats = upstream.stats
        with trio.fail_after(60):
            process = await trio.lowlevel.open_process(
                [*COMMAND, *argv, "--score", "judged", "--score", "stuck-judged",
                 "--config", str(config)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env=_environ(), preexec_fn=sigint_default)
            try:
                target = scores_path(results)
                while not (stats.requests.get("fault/no-response", 0) == 1
                           and target.exists()
                           and target.read_bytes().count(b"\n") >= 2):
                    assert process.returncode is None
                    await trio.sleep(0.02)
                # Its one slot is held by the stuck judge: the submitter waits for it.
                await trio.sleep(0.2)
                assert stats.requests.get("mock/judge", 0) == 2
                asked = dict(stats.requests)
                written = target.read_bytes()
                interrupt(process)
                while process.poll() is None:
                    # No request after the SIGINT: the stuck judge's slot, freed by its
                    # cancellation, is not given to the next judge (which would hang too).
                    assert stats.requests == asked, "a judge request was sent after SIGINT"
                    await trio.sleep(0.02)
                assert process.stderr is not None
                err = b""
                async with process.stderr:
                    async for chunk in process.stderr:
                        err += chunk
            finally:
                if process.returncode is None:
                    process.kill()
        assert stats.requests == asked
    text = err.decode()
    assert process.returncode == 130, text
    assert "exit 130: interrupted (Ctrl-C)" in _last_line(text)
    # The scores written stay, and nothing was written for the cancelled judge.
    assert target.read_bytes() == written
    lines = [json.loads(line) for line in written.splitlines()]
    assert [line["scorer"] for line in lines] == ["judged", "judged"]
    assert all(line["status"] == "scored" for line in lines)


async def test_score_sends_no_judge_after_sigint_and_cancels_those_in_flight(
        tmp_path: Path) -> None:
    results = tmp_path / "results.jsonl"
    prompts = _prompts(tmp_path / "prompts.jsonl", 6)
    config = tmp_path / "answers.toml"
    config.write_text(JUDGING_CONFIG.format(base_url="embedded"))
    with trio.fail_after(60):
        done = await trio.run_process([*COMMAND, "batch", prompts, "-m", "echo", "-o",
                                       str(results), "--config", str(config)],
                                      capture_stderr=True, capture_stdout=True,
                                      env=_environ(), check=False)
    assert done.returncode == 0, done.stderr
    await _interrupted_while_judging(tmp_path, ["score", str(results)], results)


async def test_batch_score_sends_no_judge_after_sigint(tmp_path: Path) -> None:
    results = tmp_path / "results.jsonl"
    prompts = _prompts(tmp_path / "prompts.jsonl", 6)
    await _interrupted_while_judging(
        tmp_path, ["batch", prompts, "-m", "echo", "-o", str(results)], results)
    records = [json.loads(line) for line in results.read_bytes().splitlines()]
    assert len(records) == 6 and all(r["outcome"] == "completed" for r in records)


# ------------------------------------------------------------------ fanout report

def _results(tmp_path: Path) -> Path:
    record = {"id": "a", "model": "m", "sample": 0, "outcome": "completed", "reason": None,
              "flags": [], "content_key": "k", "text": "yes", "finish_reason": "stop",
              "choices": [{"index": 0, "text": "yes", "finish_reason": "stop",
                           "tool_calls": []}],
              "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
              "metrics": {"ttft": 0.1, "tokens_per_second": 10.0}, "expected": "yes",
              "cost": 0.0001, "cost_source": "price"}
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(record) + "\n")
    return path


_HOOK = """
import os, signal, sys

class _InterruptAt:
    # SIGINT to this process when {module!r} is first imported: exactly there.
    def find_spec(self, name, path=None, target=None):
        if name == {module!r}:
            sys.meta_path.remove(self)
            if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
                sys.stderr.write("the hook: SIGINT is ignored here (inherited SIG_IGN)\\n")
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, _InterruptAt())
"""


def _console_script(tmp_path: Path) -> list[str]:
    """The script pip writes for ``[project.scripts] fanout``, run by this Python."""
    entry = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, function = entry["fanout"].split(":")
    script = tmp_path / "fanout-script"
    script.write_text(f"import sys\nfrom {module} import {function}\n"
                      f"if __name__ == '__main__':\n    sys.exit({function}())\n")
    return [sys.executable, str(script)]


def _run_interrupted_at(tmp_path: Path, module: str, argv: list[str]) -> tuple[int, str]:
    hook = tmp_path / f"hook-{module}"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_HOOK.format(module=module))
    done = subprocess.run([*_console_script(tmp_path), *argv], capture_output=True,
                          text=True, env=_environ(hook), timeout=60,
                          preexec_fn=sigint_default)
    return done.returncode, done.stderr


@pytest.mark.parametrize("module", [
    "argparse",  # imported by fanout.cli.main: early
    "trio", "httpx", "rich.console", "fanout.config", "fanout.cli.main",
    "fanout.cli.report",  # once the command runs
    "fanout.cli.eval_report",  # the report, computed, about to be drawn
])
def test_sigint_while_importing_or_reporting_is_one_line_and_130(tmp_path: Path,
                                                                  module: str) -> None:
    results = _results(tmp_path)
    status, err = _run_interrupted_at(tmp_path, module, ["report", str(results)])
    assert status == 130, err
    assert len(err.splitlines()) == 1, err
    assert _last_line(err) in ("fanout: interrupted (Ctrl-C)", "fanout report: interrupted (Ctrl-C)")


def test_sigint_while_writing_the_html_leaves_no_page(tmp_path: Path) -> None:
    results = _results(tmp_path)
    page = tmp_path / "page.html"
    status, err = _run_interrupted_at(tmp_path, "fanout.eval.html",
                                      ["report", str(results), "--html", str(page)])
    assert status == 130, err
    assert _last_line(err) == "fanout report: interrupted (Ctrl-C)" and len(err.splitlines()) == 1
    assert not page.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".fanout-report-")]


@pytest.mark.parametrize("where", ["results", "scores", "html"])
def test_sigint_while_report_waits_on_a_fifo(tmp_path: Path, where: str) -> None:
    # A FIFO no one ever writes: the open blocks until the SIGINT.
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    results = _results(tmp_path)
    argv = {"results": ["report", str(fifo)],
            "scores": ["report", str(results), "--scores", str(fifo)],
            "html": ["report", str(fifo), "--html", str(tmp_path / "page.html")]}[where]
    process = subprocess.Popen([*_console_script(tmp_path), *argv], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=_environ(),
                               preexec_fn=sigint_default)
    try:
        # Blocked in open() of the FIFO (the kernel says where it waits), however slowly
        # the machine started it.
        wchan = Path(f"/proc/{process.pid}/wchan")
        for _ in range(3000):
            if wchan.exists() and wchan.read_text() == "wait_for_partner":
                break
            assert process.poll() is None, process.communicate()
            time.sleep(0.01)
        interrupt(process)
        out, err = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 130, err
    assert err == "fanout report: interrupted (Ctrl-C)\n" and out == ""


def _startup_traceback(err: str) -> bool:
    """A traceback of the interpreter's own start (``site``), before any of fanout's or the
    console script's code ran: no program can prevent it."""
    return "Traceback" in err and "fanout" not in err


def test_sigint_at_random_moments_of_the_start_is_never_a_traceback(tmp_path: Path) -> None:
    # `fanout report FIFO` blocks once started, so every SIGINT lands before or after the
    # imports, never after the end.
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    command = [*_console_script(tmp_path), "report", str(fifo)]
    # Once, undisturbed: the entry point's bytecode is cached then (pip compiles it at
    # install), so no trial lands in its compilation.
    subprocess.run([*_console_script(tmp_path), "--version"], check=True, env=_environ(),
                   capture_output=True, timeout=60)
    seen: list[tuple[float, int | None]] = []
    rng = random.Random()
    for _ in range(12):
        delay = rng.uniform(0.0, 0.6)
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, env=_environ(), preexec_fn=sigint_default)
        try:
            time.sleep(delay)
            interrupt(process)
            out, err = process.communicate(timeout=30)
        finally:
            process.kill()
        seen.append((delay, process.returncode))
        if process.returncode in (-signal.SIGINT, 1) and (not err or _startup_traceback(err)):
            continue  # before the interpreter ran any of the script (Python's own start)
        assert process.returncode == 130, (delay, err)
        assert err in ("fanout: interrupted (Ctrl-C)\n", "fanout report: interrupted (Ctrl-C)\n"), (delay, err)
        assert out == ""
    assert any(status == 130 for _, status in seen), seen
