"""The user's documentation as the tests read it: the pages under ``docs/`` and the README.

The snippet tests run what the pages show (commands, Python, config errors, records) and
compare it with what the pages say it prints; these helpers find the pages and their
sections."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text(encoding="utf-8")


def page(name: str) -> str:
    """The text of ``docs/<name>`` (``"batch.md"``, ``"evaluation/scorers.md"``)."""
    return (DOCS / name).read_text(encoding="utf-8")


def pages(*names: str) -> str:
    """Several pages, one after the other."""
    return "\n".join(page(name) for name in names)


def section(text: str, title: str) -> str:
    """The section of ``text`` whose heading starts with ``title`` (any level, outside code
    blocks), up to the next heading of the same or a higher level."""
    lines = text.split("\n")
    fence = False
    start = level = None
    for number, line in enumerate(lines):
        if line.startswith("```"):
            fence = not fence
        if fence:
            continue
        heading = re.match(r"(#{1,6}) (.*)", line)
        if heading is None:
            continue
        if start is None:
            if heading.group(2).startswith(title):
                start, level = number, len(heading.group(1))
        elif level is not None and len(heading.group(1)) <= level:
            return "\n".join(lines[start:number])
    assert start is not None, f"no section {title!r}"
    return "\n".join(lines[start:])


#: Every page of the evaluation guide, in reading order.
EVALUATION = ("evaluation/index.md", "evaluation/scorers.md", "evaluation/judge.md",
              "evaluation/scoring.md", "evaluation/cost.md", "evaluation/report.md")
