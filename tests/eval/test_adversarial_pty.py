"""`fanout report` with scores on a real pseudo-terminal: 30 models with long names (wide
characters among them), every layout from 40 to 200 columns, hostile ids and groups.

The child gets a pty of the given size (``TIOCSWINSZ``) and ``COLUMNS`` unset, so the
width it uses is the terminal's own, as for a user; every line it draws must fit.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.cells import cell_len

from fanout.records import dumps_bytes
from fanout.store.scores import answer_key
from tests.helpers import on_pty

COMMAND = [sys.executable, "-m", "fanout.cli.main"]
_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def _answer(prompt: str, model: str, sample: int, text: str) -> dict[str, Any]:
    return {"id": prompt, "model": model, "sample": sample, "outcome": "completed",
            "reason": None, "flags": [], "content_key": f"ck-{prompt}-{model}", "text": text,
            "finish_reason": "stop",
            "choices": [{"index": 0, "text": text, "finish_reason": "stop", "tool_calls": []}],
            "usage": {"prompt_tokens": 4, "completion_tokens": 9, "total_tokens": 13},
            "metrics": {"ttft": 0.05 + sample / 100, "tokens_per_second": 40.0},
            "expected": "yes", "category": f"cat\u2028{prompt[-1]}\x1b[2J",
            "tags": ["t\u202eag", "\x1b]0;title\x07x"], "cost": 0.0001, "cost_source": "price"}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    where = tmp_path_factory.mktemp("pty")
    results, scores, baseline = [], [], []
    for m in range(30):
        model = f"provider-{m:02d}/a-very-long-model-name-\u4e2d\u6587-instruct-2026-preview"
        for p in range(4):
            for sample in range(2):
                text = "yes" if (m + p + sample) % 3 else "no"
                unit = _answer(f"q\x1b[31m{p}", model, sample, text)
                results.append(unit)
                for into, passed in ((scores, text == "yes"), (baseline, bool(p % 2))):
                    into.append({"id": unit["id"], "model": model, "sample": sample,
                                 "scorer": "exact", "kind": "exact", "scorer_key": "k",
                                 "answer_key": answer_key(unit), "status": "scored",
                                 "score": float(passed), "passed": passed,
                                 "explanation": "", "scored_at": "2026-12-01T11:00:00+00:00"})
    a = where / "a.jsonl"
    a.write_bytes(b"".join(dumps_bytes(r) for r in results))
    (where / "a.scores.jsonl").write_bytes(b"".join(dumps_bytes(s) for s in scores))
    b = where / "b.jsonl"
    b.write_bytes(a.read_bytes())
    (where / "b.scores.jsonl").write_bytes(b"".join(dumps_bytes(s) for s in baseline))
    return a, b


def _on_pty(args: list[str], columns: int) -> tuple[int, str]:
    return on_pty([*COMMAND, *args], rows=50, columns=columns)


@pytest.mark.parametrize("columns", [40, 60, 80, 120, 200])
def test_every_line_fits_the_terminal(files: tuple[Path, Path], columns: int) -> None:
    a, b = files
    status, text = _on_pty(["report", str(a), "--against", str(b), "--by", "tag",
                            "--samples", "2"], columns)
    assert status == 0, text
    assert "Traceback" not in text
    lines = _ESCAPES.sub("", text).replace("\r", "").split("\n")
    wide = [line for line in lines if cell_len(line) > columns]
    assert wide == []
    plain = "\n".join(lines)
    assert "scores: exact" in plain and "against" in plain
    # hostile ids and groups reach the terminal inert: no escape survives but colour
    assert "\x1b]" not in text and "\x1b[2J" not in text and "\u202e" not in text
    assert "\u2028" not in text


def test_json_is_strict_with_the_same_files(files: tuple[Path, Path]) -> None:
    a, b = files
    done = subprocess.run([*COMMAND, "report", str(a), "--against", str(b), "--json"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout, parse_constant=lambda name: pytest.fail(name))
    assert len({row["model"] for row in data["evaluation"]["models"]}) == 30
