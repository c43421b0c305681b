"""Bad input through the command line: every mistake one line, never a silent default."""

from __future__ import annotations

from pathlib import Path

import pytest

from fanout.cli.main import main


def test_every_unknown_top_level_key_is_reported(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "fanout.toml"
    config.write_text('endpont = 1\nmodles = []\ncolour = 1\n'
                      '[endpoint]\nbase_url = "embedded"\n')
    assert main(["compare", "hi", "--config", str(config)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3
    assert "top level: unknown key 'endpont' (did you mean 'endpoint'?)" in lines[0]
    assert "top level: unknown key 'modles' (did you mean 'models'?)" in lines[1]
    assert "top level: unknown key 'colour' (known: " in lines[2]
    assert all(str(config) in line for line in lines)


def test_a_malformed_fault_argument_is_a_one_line_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "fanout.toml"
    config.write_text('[endpoint]\nbase_url = "embedded"\n[deadlines]\ntotal = 20\n'
                      '[[models]]\nname = "s"\nid = "fault/stall:abc"\n')
    assert main(["compare", "hi", "--config", str(config), "-m", "s"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == ["fanout compare: s: error: HTTP 400: fault/stall: 'abc' is not a number "
                   "(fanout mock --list)"]
