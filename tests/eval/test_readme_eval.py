"""The evaluation walk-through (docs/evaluation/index.md) tells the truth: its commands, run as written on the
default config (the embedded upstream, no key), print the numbers the page shows.

Timings differ from run to run; counts, scores, intervals, flips and costs do not (the mock
models and ``mock/judge`` are deterministic, the bootstrap has a fixed seed)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from ..docs import ROOT, page, section

WALK = section(page("evaluation/index.md"), "A walk-through")


def _blocks(text: str) -> list[str]:
    return re.findall(r"```[a-z]*\n(.*?)```", text, re.S)


def _commands(block: str) -> list[tuple[list[str], list[str]]]:
    """Each ``$ fanout ...`` command of a block (continuation lines joined) and the lines
    the page shows after it, up to the next command."""
    joined = block.replace("\\\n", " ")
    found: list[tuple[list[str], list[str]]] = []
    for line in joined.splitlines():
        if line.startswith("$ "):
            found.append((shlex.split(line[2:]), []))
        elif found:
            found[-1][1].append(line)
    return found


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    assert argv[0] == "fanout"
    env = {**os.environ, "COLUMNS": "80"}
    return subprocess.run([sys.executable, "-m", "fanout.cli.main", *argv[1:]], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=300)


def _comparable(line: str) -> re.Pattern[str] | None:
    """A shown line as a pattern of what does not depend on timing, else ``None``.

    Times differ, and so does how many of ``flaky``'s streams were cut while others ran and
    redone (each redo is one more record of unknown cost): those counts match any number."""
    if not line.strip() or line.strip() == "…" or "streams in" in line or "ms " in line:
        return None
    tokens = line.split()
    parts = []
    for number, token in enumerate(tokens):
        if tokens[:3] == ["flaky", "-", "0"] and number == 3:
            parts.append(r"\d+")  # flaky's records of unknown cost: one more per redo
        elif token.startswith("(") and tokens[number + 1:number + 2] == ["records"]:
            parts.append(r"\(\d+")
        else:
            parts.append(re.escape(token))
    return re.compile(r"^\s*" + r"\s+".join(parts) + r"\s*$", re.M)


def test_the_walk_through_prints_what_the_readme_shows(tmp_path: Path) -> None:
    blocks = _blocks(WALK)
    prompts = blocks[0]
    # The commands name no config: ./fanout.toml is the one they read.
    (tmp_path / "fanout.toml").write_text((ROOT / "config/default.toml").read_text())
    (tmp_path / "prompts.jsonl").write_text(prompts)
    lines = [json.loads(line) for line in prompts.splitlines()]
    # prompts-v2.jsonl: as the page says, `river` asks `The Nile`, `greet` asks `Wave`.
    assert "`river` asks `The Nile`, `greet`\nasks `Wave`" in WALK
    asks = {"river": "The Nile", "greet": "Wave"}
    (tmp_path / "prompts-v2.jsonl").write_text("".join(
        json.dumps({**line, "prompt": asks.get(line["id"], line["prompt"])}) + "\n"
        for line in lines))
    shown_commands = [command for block in blocks[1:] for command in _commands(block)]
    ran = 0
    for argv, shown in shown_commands:
        if argv[0] == "echo":
            continue
        result = _run(argv, tmp_path)
        ran += 1
        out = result.stdout + result.stderr
        assert "Traceback" not in out
        if argv[1] == "batch":
            assert result.returncode == 1  # flaky's streams did not complete: said, exit 1
        else:
            assert result.returncode == 0, out
        for line in shown:
            expected = _comparable(line)
            if expected is not None:
                assert expected.search(out), (argv, expected.pattern)
    assert ran == 4
    assert (tmp_path / "report.html").stat().st_size > 10_000
    # What the prose says of the numbers.
    assert "4 of 6 prompts, both samples, 8 passes" in WALK
    assert "exact McNemar on 2 + 2\nflips, p = 1.000" in WALK
