"""The suite as a background job runs it: ``nohup make test &``.

A shell without job control (a script, many CI runners, ``nohup make test &`` from one)
starts a background job with SIGINT and SIGQUIT ignored and stdin from /dev/null, and
every process started from it inherits the ignored signals across exec.  A child that a
test sends SIGINT would never see it: each such child is started with
``preexec_fn=sigint_default`` (``tests/helpers.py``), and is sent it by ``interrupt``,
which fails at once on a child that ignores it.  Here: both helpers, and a few of those
tests run again by a pytest started the way such a shell starts it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import ignores, interrupt, sigint_default

ROOT = Path(__file__).resolve().parents[1]

#: What the child says of its SIGINT handler.
_SAYS = ("import signal; handler = signal.getsignal(signal.SIGINT); "
         "print({signal.SIG_IGN: 'ignored', signal.default_int_handler: 'KeyboardInterrupt'}"
         ".get(handler, repr(handler)))")


@contextlib.contextmanager
def _ignoring_sigint() -> Iterator[None]:
    """This process ignores SIGINT for the block, as a background job's does."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _as_a_background_job() -> None:
    # What the shell does in the child before it runs `nohup make test` in the background.
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)


def test_sigint_default_gives_the_child_pythons_own_handler_back() -> None:
    with _ignoring_sigint():
        inherited = subprocess.run([sys.executable, "-c", _SAYS], capture_output=True,
                                   text=True, check=True, timeout=60)
        restored = subprocess.run([sys.executable, "-c", _SAYS], capture_output=True,
                                  text=True, check=True, timeout=60,
                                  preexec_fn=sigint_default)
    # Inherited, SIGINT stays ignored: Python installs no handler, no Ctrl-C is seen.
    assert inherited.stdout == "ignored\n"
    assert restored.stdout == "KeyboardInterrupt\n"


def test_interrupt_refuses_a_child_that_ignores_sigint() -> None:
    process = subprocess.Popen(
        [sys.executable, "-c", "import signal, sys; signal.signal(signal.SIGINT, "
         "signal.SIG_IGN); print('ignoring', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None and process.stdout.readline() == "ignoring\n"
        assert ignores(process.pid) and not ignores(process.pid, signal.SIGTERM)
        with pytest.raises(AssertionError, match=r"ignores signal 2 .*preexec_fn=sigint_default"):
            interrupt(process)
        process.communicate("", timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0  # nothing was sent
    assert not ignores(process.pid)  # gone: nothing to say


#: One test of each way the suite starts a child it interrupts: a Popen sent SIGINT while
#: blocked, a child that sends it itself, a fixture's server.
_REPRESENTATIVE = [
    "tests/eval/test_interrupts.py::test_sigint_while_report_waits_on_a_fifo[results]",
    "tests/eval/test_interrupts.py::"
    "test_sigint_while_importing_or_reporting_is_one_line_and_130[fanout.cli.report]",
    "tests/cli/test_mock.py::test_mock_stops_cleanly[2]",
]


def test_interrupt_tests_pass_in_a_background_job() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *_REPRESENTATIVE],
        cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300,
        preexec_fn=_as_a_background_job,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])})
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert f"{len(_REPRESENTATIVE)} passed" in done.stdout
