"""The README tells the truth about what exists."""

from __future__ import annotations

from pathlib import Path

from fanout.upstream import MODELS

README = (Path(__file__).parent.parent / "README.md").read_text()


def test_every_upstream_model_is_documented() -> None:
    for model in MODELS:
        assert f"| `{model}` |" in README, model


def test_the_two_commands_are_stated() -> None:
    assert "make test" in README and "make demo" in README
