"""The evaluation pages (docs/evaluation/), beyond the walk-through (tests/eval/test_readme_eval.py):
its Python scorer snippet, its `fanout score` / `fanout batch --score` / `--budget` sessions,
its config errors and its records, run as written on the default config (the embedded
upstream, no key, no network), print what the pages show.

Timings and the abridged table rows (``…``) differ from run to run and are not compared; every
other line a session shows is, and so is each ``echo $?``."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from ..docs import EVALUATION, ROOT, pages, section

SECTION = pages(*EVALUATION)
DEFAULT = (ROOT / "config/default.toml").read_text()


def _part(heading: str) -> str:
    """The part of the evaluation pages under ``heading`` (its text, without the ``#``s)."""
    return section(SECTION, heading)


def _block(text: str, after: str, language: str = "") -> str:
    """The first fenced block of ``language`` after ``after`` (its fences alone on their
    lines: a snippet may hold a fence inside a string)."""
    match = re.compile(rf"^```{language}\n(.*?)^```$", re.S | re.M).search(text,
                                                                           text.index(after))
    assert match is not None, after
    return match.group(1)


def _session(block: str) -> list[tuple[str, list[str]]]:
    """Each ``$ `` command of a block and the lines shown after it."""
    found: list[tuple[str, list[str]]] = []
    for line in block.replace("\\\n", " ").splitlines():
        if line.startswith("$ "):
            found.append((line[2:], []))
        elif found:
            found[-1][1].append(line)
    return found


def _compared(line: str) -> bool:
    return bool(line.strip()) and "…" not in line and " streams in " not in line


def _replay(block: str, cwd: Path) -> int:
    """Run a session as written in ``cwd``: every line it shows (but timings and abridged
    rows) must be in the output; ``echo $?`` is the exit status of the command before."""
    status = None
    ran = 0
    for command, shown in _session(block):
        if command == "echo $?":
            assert shown == [str(status)], (command, status)
            continue
        argv = shlex.split(command)
        if argv[0] == "fanout":
            done = subprocess.run([sys.executable, "-m", "fanout.cli.main", *argv[1:]],
                                  cwd=cwd, env={**os.environ, "COLUMNS": "80"},
                                  capture_output=True, text=True, timeout=300)
            ran += 1
        else:  # the shell lines that make an input file
            done = subprocess.run(["bash", "-c", command], cwd=cwd, capture_output=True,
                                  text=True, timeout=60)
            assert done.returncode == 0, done.stderr
        status = done.returncode
        out = done.stdout + done.stderr
        assert "Traceback" not in out, out
        lines = {line.rstrip() for line in out.splitlines()}
        for line in filter(_compared, shown):
            assert line.rstrip() in lines, (command, line, out)
    return ran


def _default_config(cwd: Path) -> None:
    (cwd / "fanout.toml").write_text(DEFAULT)


def test_the_scorer_snippet_prints_what_the_readme_shows(tmp_path: Path) -> None:
    scorers = _part("Scorers")
    code = _block(scorers, "The scorers are plain functions", "python")
    shown = _block(scorers, "print(close.score(answer(\"I cannot say.\"", "text")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == shown


def test_the_command_line_scorers_give_the_scores_shown(tmp_path: Path) -> None:
    scorers = _part("Scorers")
    session = _block(scorers, "On the command line, against `mock/echo`", "console")
    commands = _session(session)
    assert commands[0][0] == "cat prompts.jsonl"
    (tmp_path / "prompts.jsonl").write_text("\n".join(commands[0][1]) + "\n")
    _default_config(tmp_path)
    assert _replay(session, tmp_path) == 2
    table = _block(scorers, "The explanations in `results.scores.jsonl`", "text")
    shown = {tuple(re.split(r"\s{2,}", line.strip())) for line in table.splitlines()}
    records = [json.loads(line) for line in
               (tmp_path / "results.scores.jsonl").read_text().splitlines()]
    real = {(r["id"], r["scorer"], r["status"], str(r["score"]), r["explanation"])
            for r in records}
    assert real == shown


def test_the_scorer_config_errors_are_the_real_ones(tmp_path: Path) -> None:
    scorers = _part("Scorers")
    shown = _block(scorers, "naming the scorer, the option and the value", "console")
    (tmp_path / "results.jsonl").write_text("")
    head = DEFAULT[:DEFAULT.index("# Scorers for")]  # the models; one scorer of its own
    lines = [line for line in shown.splitlines() if not line.startswith("$ ")]
    for option, line in zip(("tolerence = 1e-3", 'tolerance = "abc"'), lines, strict=True):
        (tmp_path / "bad.toml").write_text(
            head + f'[[scorers]]\nname = "close"\nkind = "numeric"\n{option}\n')
        done = subprocess.run([sys.executable, "-m", "fanout.cli.main", "score",
                               "results.jsonl", "--config", "bad.toml", "--score", "close"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and done.stderr == line + "\n"


def test_the_default_config_excerpt_is_the_file() -> None:
    excerpt = _block(_part("Scoring"), "The end\nof `config/default.toml`:", "toml")
    assert DEFAULT.endswith(excerpt)


def test_the_scoring_sessions_print_what_the_readme_shows(tmp_path: Path) -> None:
    prompts = _block(_part("Expected answers"), "A wrong type is a bad line", "json")
    (tmp_path / "prompts.jsonl").write_text(prompts)
    _default_config(tmp_path)
    scoring = _part("Scoring")
    sessions = re.findall(r"```\n(\$ .*?)```", scoring, re.S)
    # Three sessions run on the default config as they are; the others need what they say
    # (a config with a cut judge, a SIGTERM mid-run, a batch running beside): tested in
    # tests/eval/test_adversarial*.py, not replayed here.
    replayable = [session for session in sessions
                  if "key.toml" not in session and " &" not in session]
    assert len(sessions) == 6 and len(replayable) == 3
    assert sum(_replay(session, tmp_path) for session in replayable) == 5
    # The capital record of mock/echo, as shown.
    shown = _block(_part("Expected answers"), "The `capital` record of `mock/echo`", "json")
    shown_record = json.loads(shown.replace(", …}", "}"))
    records = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    capital = next(r for r in records if (r["id"], r["model"]) == ("capital", "echo"))
    assert {key: capital.get(key) for key in shown_record} == shown_record
    # The judge's score record, as shown (but when it was scored).
    shown = _block(_part("The scores file"), "A judge's record, from", "json")
    shown_score = json.loads(shown)
    scores = [json.loads(line) for line in
              (tmp_path / "results.scores.jsonl").read_text().splitlines()]
    sky = next(s for s in scores
               if (s["id"], s["model"], s["scorer"]) == ("sky", "echo", "judged"))
    assert list(sky) == list(shown_score)
    # the nonce is new in every request: the shown one is any 16 hex digits
    nonce = re.compile(r"(?<=\nVERDICT )[0-9a-f]{16}(?=: )")
    for record in (sky, shown_score):
        assert nonce.search(record["judge"]["text"]), record["judge"]
        record["judge"]["text"] = nonce.sub("<nonce>", record["judge"]["text"])
    assert {**sky, "scored_at": None} == {**shown_score, "scored_at": None}


def test_the_budget_sessions_print_what_the_readme_shows(tmp_path: Path) -> None:
    _default_config(tmp_path)
    budget = _part("`fanout batch --budget USD`")
    sessions = re.findall(r"```\n(\$ .*?)```", budget, re.S)
    assert len(sessions) == 2
    assert sum(_replay(session, tmp_path) for session in sessions) == 4
    assert len((tmp_path / "twenty.jsonl").read_text().splitlines()) == 20
    # Refused before anything was sent: the results file holds nothing.
    other = tmp_path / "other.jsonl"
    assert not other.exists() or other.read_bytes() == b""


def test_the_scorer_table_names_every_option_of_every_kind() -> None:
    from fanout.eval import scorers
    from fanout.eval.judge import JudgeScorer

    table = _part("Scorers")
    rows = {match.group(1): match.group(2)
            for match in re.finditer(r"^\| `(\w+)` \| (.*?) \|", table, re.M)}
    classes = {"exact": scorers.Exact, "includes": scorers.Includes, "regex": scorers.Regex,
               "numeric": scorers.Numeric, "choice": scorers.Choice, "json": scorers.Json,
               "tool_call": scorers.ToolCall, "finish": scorers.Finish,
               "python": scorers.Python, "judge": JudgeScorer}
    assert set(rows) == set(classes) == set(scorers.KINDS)
    normalisation = {option.name for option in scorers.Exact.OPTIONS} - {"threshold"}
    for kind, cls in classes.items():
        names = {option.name for option in cls.OPTIONS} - {"threshold"}
        if "the normalisation options" in rows[kind]:
            names -= normalisation
        for name in names:
            assert f"`{name}`" in rows[kind], (kind, name)
        defaults = {option.name: option.default for option in cls.OPTIONS}
        checked = 0
        for name, shown in re.findall(r"`(\w+)` \(([^()`,]*)[,)]", rows[kind]):
            try:
                value = float(shown)
            except ValueError:
                continue  # not a number: a word of the table
            # a default shown as a number is the option's (``group``'s None is group 0)
            assert name in defaults and value == float(defaults[name] or 0), (kind, name)
            checked += 1
        assert checked or kind not in ("numeric", "regex", "tool_call"), kind
    assert "`threshold` (every kind, default 1.0)" in _flat_section()


def _flat_section() -> str:
    return " ".join(SECTION.split())
