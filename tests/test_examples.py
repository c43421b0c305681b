"""The examples (what `make demo` runs) keep working."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).parent.parent / "examples"


def test_first_fanout_shows_every_outcome() -> None:
    out = subprocess.run([sys.executable, str(EXAMPLES / "first_fanout.py")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "mock/slow: completed, finish_reason=length" in out.stdout
    assert "mock/reasoning: completed" in out.stdout and "reasoning: " in out.stdout
    assert "fault/truncate: truncated" in out.stdout
    assert "fault/heartbeat-stall:6: timed_out (idle deadline)" in out.stdout
    assert out.stdout.count("started (HTTP 200)") == 4
