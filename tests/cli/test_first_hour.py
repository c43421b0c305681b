"""The first hour, still (#27 item 11): what a person meets first, said where it happens.

A typo'd option names the subcommand and what was meant; a judge cost no one knows is
``-``; a model id is shown and recorded as typed; a refused key says where it came from
and went; ``OPENAI_BASE_URL`` over the embedded default is said; a base URL without ``/v1``
gets one diagnosis; ``fanout init`` writes the endpoint's ids; Ctrl-C while judging shows
the judges done and says what was interrupted.  Upstreams on 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from fanout.cli.main import _parser, main
from fanout.config import load_config
from fanout.store.scores import scores_path
from fanout.upstream import MODELS, open_upstream
from tests.helpers import JUDGING_CONFIG, fanout_mock

COMMAND = [sys.executable, "-m", "fanout.cli.main"]

# -- a typo'd option ------------------------------------------------------------------------

def _commands() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _close(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a, b).ratio()


@pytest.mark.parametrize("command", sorted(_commands()))
def test_a_typod_option_says_the_subcommands_usage_and_what_was_meant(
        command: str, capsys: pytest.CaptureFixture[str]) -> None:
    sub = _commands()[command]
    options = [o for a in sub._actions for o in a.option_strings
               if o.startswith("--") and o != "--help"]
    assert options, command
    for option in options:
        # two letters swapped (not a prefix: argparse takes those as the option)
        i = 3 if len(option) > 4 and option[3] != option[4] else len(option) - 2
        typo = option[:i] + option[i + 1] + option[i] + option[i + 2:]
        assert typo != option
        with pytest.raises(SystemExit) as exited:
            main([command, typo, "x.jsonl", "y.jsonl"])
        assert exited.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith(f"usage: fanout {command} "), err
        last = err.splitlines()[-1]
        assert last.startswith(f"fanout {command}: error: "), err
        suggested = last.rsplit(" (did you mean ", 1)[1].removesuffix("?)")
        # it, or one as close (--scorse: --score or --scores)
        assert suggested == option or (suggested in options and _close(suggested, typo)
                                       >= _close(option, typo)), (typo, last)


@pytest.mark.parametrize(("argv", "meant"), [
    (["compare", "hi", "--modle", "gpt-4o"], "--model"),
    (["batch", "p.jsonl", "--ouput", "r.jsonl"], "--output"),
    (["batch", "p.jsonl", "-o", "r.jsonl", "--concurency=3"], "--concurrency"),
    (["report", "r.jsonl", "--agaisnt", "b.jsonl"], "--against")])
def test_the_issues_typos(argv: list[str], meant: str,
                          capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert err.startswith(f"usage: fanout {argv[0]} ")
    assert err.splitlines()[-1].endswith(f"(did you mean {meant}?)")
    assert "COMMAND ..." not in err  # not the top level's usage


# -- a judge cost no one knows --------------------------------------------------------------

UNPRICED = """
[endpoint]
base_url = "embedded"

[[models]]
name = "echo"
id = "mock/echo"

[[models]]
name = "judge"
id = "mock/judge"
{price}

[[scorers]]
name = "judged"
kind = "judge"
model = "judge"
"""


def _prompts(path: Path, count: int) -> str:
    path.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"answer {i}",
                                        "expected": f"answer {i}"}) + "\n"
                            for i in range(count)))
    return str(path)


@pytest.mark.parametrize(("price", "cost"), [
    ("", "; judge cost - (3 unknown)"),
    ("price = { input = 1.0, output = 4.0 }", "; judge cost $0.0")])
def test_an_unknown_judge_cost_is_a_dash_as_report_says(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], price: str, cost: str) -> None:
    config = tmp_path / "fanout.toml"
    config.write_text(UNPRICED.format(price=price))
    status = main(["batch", _prompts(tmp_path / "p.jsonl", 3), "-m", "echo", "-o",
                   str(tmp_path / "r.jsonl"),
                   "--config", str(config), "--score", "judged"])
    out = capsys.readouterr().out
    assert status == 0
    line = next(line for line in out.splitlines() if line.startswith("judged: "))
    assert cost in line and "$0.000000" not in line, line


# -- a model id is shown as typed -----------------------------------------------------------

def test_a_model_id_is_shown_and_recorded_as_typed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)  # the packaged default: fault/truncate is its "flaky"'s id
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    assert main(["compare", "hi", "-m", "fast", "-m", "fault/truncate"]) == 1
    shown = capsys.readouterr()
    assert "fanout compare: fault/truncate: truncated: " in shown.err
    assert "== fault/truncate" in shown.out
    assert "flaky" not in shown.out + shown.err
    results = tmp_path / "r.jsonl"
    main(["batch", _prompts(tmp_path / "p.jsonl", 2), "-m", "fault/truncate", "-m", "fast",
          "-o", str(results)])
    shown = capsys.readouterr()
    records = [json.loads(line) for line in results.read_text().splitlines()]
    assert {r["model"] for r in records} == {"fault/truncate", "fast"}
    assert any(line.split()[:1] == ["fault/truncate"] for line in shown.out.splitlines())
    assert "flaky" not in shown.out + shown.err
    # the same entry twice, by its name and its id, is asked for twice
    assert main(["compare", "hi", "-m", "flaky", "-m", "fault/truncate"]) == 2
    assert capsys.readouterr().err == ("fanout compare: model 'fault/truncate' is asked for "
                                       "twice (it is 'flaky')\n")


# -- a key sent and refused -----------------------------------------------------------------

KEY = "sk-first-hour-RIGHT-31"
WRONG = "sk-first-hour-WRONG-47"


@pytest.fixture(scope="module")
def keyed() -> Iterator[str]:
    """`fanout mock --key KEY`: its base URL (ending in /v1)."""
    with fanout_mock("--key", KEY) as base_url:
        yield base_url


def test_a_refused_key_says_where_it_came_from_where_it_went_and_what_to_check(
        keyed: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OPENAI_BASE_URL", keyed)
    monkeypatch.setenv("OPENAI_API_KEY", WRONG)
    assert main(["compare", "hi", "-m", "mock/fast"]) == 1
    shown = capsys.readouterr()
    assert shown.err.splitlines()[-1] == (
        f"fanout compare: mock/fast: error: HTTP 401: the key in OPENAI_API_KEY was sent to "
        f"{keyed} and refused: check that it is valid for this endpoint, not expired, and the "
        "right variable (the server said: Incorrect API key provided.)")
    assert main(["models"]) == 1
    shown_too = capsys.readouterr()
    assert shown_too.err.splitlines(keepends=True)[-1] == (
        f"fanout models: HTTP 401: the key in OPENAI_API_KEY was sent to {keyed} and refused: "
        "check that it is valid for this endpoint, not expired, and the right variable (the "
        "server said: Incorrect API key provided.)\n")
    # A config's api_key_env is the variable named.
    monkeypatch.delenv("OPENAI_BASE_URL")
    monkeypatch.setenv("RELAY_KEY", WRONG)
    (tmp_path / "fanout.toml").write_text(
        f'[endpoint]\nbase_url = "{keyed}"\napi_key_env = "RELAY_KEY"\n')
    assert main(["compare", "hi", "-m", "mock/fast"]) == 1
    last = capsys.readouterr()
    assert f"HTTP 401: the key in RELAY_KEY was sent to {keyed} and refused" in last.err
    for text in (shown.out, shown.err, shown_too.out, shown_too.err, last.out, last.err):
        assert WRONG not in text and KEY not in text


# -- OPENAI_BASE_URL over the embedded default ----------------------------------------------

def test_openai_base_url_over_the_embedded_default_is_said_once(
        keyed: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)  # no fanout.toml: the packaged default, given over
    monkeypatch.setenv("OPENAI_BASE_URL", keyed)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    note = (f"using OPENAI_BASE_URL={keyed} from the environment, not the embedded upstream "
            "(unset it to use the embedded upstream)")
    prompts = _prompts(tmp_path / "p.jsonl", 1)
    for command, argv, status in (
            ("compare", ["compare", "hi", "-m", "mock/fast"], 0),
            ("batch", ["batch", prompts, "-m", "mock/fast", "-o", str(tmp_path / "r.jsonl")], 0),
            ("models", ["models"], 0),
            ("score", ["score", str(tmp_path / "r.jsonl"), "--score", "exact"], 0)):
        assert main(argv) == status, command
        err = capsys.readouterr().err
        wanted = 0 if command == "score" else 1  # score sends nothing without a judge
        assert err.count(note) == wanted, (command, err)
        if wanted:
            assert err.splitlines()[0] == f"fanout {command}: {note}"
    # Never the user info of the URL; not said with a config file, nor without the variable.
    port = keyed.split(":")[2].split("/")[0]
    monkeypatch.setenv("OPENAI_BASE_URL", f"http://me:pw-secret-5@127.0.0.1:{port}/v1")
    main(["compare", "hi", "-m", "mock/fast"])
    err = capsys.readouterr().err
    assert f"using OPENAI_BASE_URL=http://127.0.0.1:{port}/v1 from the environment" in err
    assert "pw-secret-5" not in err
    (tmp_path / "fanout.toml").write_text(f'[endpoint]\nbase_url = "{keyed}"\n')
    assert main(["compare", "hi", "-m", "mock/fast"]) == 0
    assert "using OPENAI_BASE_URL" not in capsys.readouterr().err
    (tmp_path / "fanout.toml").unlink()
    monkeypatch.delenv("OPENAI_BASE_URL")
    assert main(["compare", "hi", "-m", "mock/fast"]) == 0
    assert "OPENAI_BASE_URL" not in capsys.readouterr().err


def test_serve_says_openai_base_url_took_the_embedded_defaults_place(
        keyed: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    process = subprocess.Popen([*COMMAND, "serve", "--port", "0"], cwd=tmp_path,
                               env={**env, "OPENAI_BASE_URL": keyed}, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None and process.stdout.readline().startswith("http")
    finally:
        process.terminate()
        _, err = process.communicate(timeout=30)
    assert err.splitlines()[0] == (f"fanout serve: using OPENAI_BASE_URL={keyed} from the "
                                   "environment, not the embedded upstream (unset it to use "
                                   "the embedded upstream)")


# -- a base URL without /v1 -----------------------------------------------------------------

def test_batch_on_a_base_url_without_v1_gives_one_diagnosis(
        keyed: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    root = keyed.removesuffix("/v1")
    config = tmp_path / "relay.toml"
    config.write_text(f'[endpoint]\nbase_url = "{root}"\n')
    status = main(["batch", _prompts(tmp_path / "p.jsonl", 2), "-m", "mock/fast", "-o",
                   str(tmp_path / "r.jsonl"), "--config", str(config)])
    shown = capsys.readouterr()
    assert status == 1
    said = [line for line in (shown.out + shown.err).splitlines() if "404" in line]
    assert len(said) >= 3, said  # the summary's why, the refused line, the exit line
    diagnosis = f"the base URL probably needs /v1: try {root}/v1"
    for line in said:
        # one diagnosis (the exit line cuts its reason short)
        assert diagnosis in line or line.endswith("…)"), line
        assert "is base_url right?" not in line and "usually end it" not in line, line
        assert "fix the prompt" not in line, line
    assert any(line.endswith("running again sends them unchanged; fix the base URL")
               for line in said), said


# -- fanout init writes the endpoint's own ids ----------------------------------------------

def test_init_writes_the_endpoints_ids_and_its_next_command_runs(
        keyed: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OPENAI_BASE_URL", keyed)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    assert main(["init"]) == 0
    shown = capsys.readouterr()
    assert shown.err == ""
    config = load_config(tmp_path / "fanout.toml")
    ids = [m.id for m in config.models]
    assert len(ids) == 2 and config.compare == config.batch == tuple(ids)
    assert set(ids) <= set(MODELS) and not any(i.startswith("fault/") for i in ids)
    assert "gpt-4o" not in (tmp_path / "fanout.toml").read_text()
    assert f"wrote fanout.toml: the endpoint {keyed}, {ids[0]} and {ids[1]}" in shown.out
    # Its next command, as it says it: runs, every stream completed (no 404).
    nxt = shown.out.rsplit("Next: `", 1)[1].rstrip("`\n")
    assert nxt == 'fanout compare "hi"'
    assert main(shlex.split(nxt)[1:]) == 0
    assert KEY not in capsys.readouterr().err


def test_init_says_when_the_ids_are_placeholders_and_what_to_do_first(
        keyed: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)  # the list is refused: 401
    assert main(["init", "--base-url", keyed]) == 0
    shown = capsys.readouterr()
    assert shown.err == ("fanout init: the endpoint gave no model ids, so the file has "
                         "placeholders (gpt-4o-mini, gpt-4o) that it may not serve: HTTP 401: "
                         "no API key was sent: set OPENAI_API_KEY or [endpoint] api_key_env "
                         "(the server said: Incorrect API key provided.)\n")
    assert [m.id for m in load_config(tmp_path / "fanout.toml").models] == ["gpt-4o-mini",
                                                                           "gpt-4o"]
    # The next thing to do is editing the file, not a command that would 404.
    assert shown.out.split("Next: ", 1)[1].startswith(
        "put two of the endpoint's model ids in the file (`fanout models` lists them")


# -- Ctrl-C while judging -------------------------------------------------------------------


#: The child restores Python's SIGINT handler itself: a run started under nohup inherits
#: SIGINT ignored, and the test's SIGINT would then do nothing.
_DEFAULT_SIGINT = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler);"
                   " from fanout.cli.main import main; sys.exit(main(sys.argv[1:]))")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


async def test_ctrl_c_while_judging_shows_the_judges_done_and_says_they_were_interrupted(
        tmp_path: Path) -> None:
    results = tmp_path / "r.jsonl"
    prompts = _prompts(tmp_path / "p.jsonl", 6)
    async with open_upstream() as upstream:
        config = tmp_path / "fanout.toml"
        config.write_text(JUDGING_CONFIG.format(base_url=upstream.base_url))
        stats = upstream.stats
        with trio.fail_after(60):
            # FORCE_COLOR: the progress bar, as a terminal shows it
            process = await trio.lowlevel.open_process(
                [sys.executable, "-c", _DEFAULT_SIGINT, "batch", prompts, "-m", "echo", "-o",
                 str(results), "--score", "judged", "--score", "stuck-judged", "--config",
                 str(config)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env={**os.environ, "FORCE_COLOR": "1", "COLUMNS": "200"})
            try:
                target = scores_path(results)
                # two judged scores written; the stuck judge's request hangs: SIGINT
                while not (stats.requests.get("fault/no-response", 0) == 1
                           and target.exists() and target.read_bytes().count(b"\n") >= 2):
                    assert process.returncode is None
                    await trio.sleep(0.02)
                await trio.sleep(0.2)
                process.send_signal(signal.SIGINT)
                assert process.stderr is not None
                err = b""
                async with process.stderr:
                    async for chunk in process.stderr:
                        err += chunk
                await process.wait()
            finally:
                if process.returncode is None:
                    process.kill()
    text = _ANSI.sub("", err.decode())
    assert process.returncode == 130, text
    assert "Traceback" not in text
    scored = target.read_bytes().count(b"\n")
    # The bar's last frame: the 6 answers and the judges that answered, of all to do.
    frames = re.findall(r"(\d+)/(\d+) .*?judged (\d+)", text)
    assert frames, text
    done, total, judged = map(int, frames[-1])
    assert judged == scored == 2
    assert done == 6 + scored < total, frames[-1]
    assert ("fanout batch: interrupted: 1 judge stream was in flight, cancelled without a "
            "score; run the same command again to finish") in text.splitlines()
    assert "recorded as cancelled" not in text  # no answer was in flight
