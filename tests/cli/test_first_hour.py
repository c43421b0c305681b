"""The first hour, still (#27 item 11): what a person meets first, said where it happens.

A typo'd option names the subcommand and what was meant; ...
"""

from __future__ import annotations

import argparse
import difflib

import pytest

from fanout.cli.main import _parser, main

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
