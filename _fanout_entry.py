"""The ``fanout`` command's entry point: Ctrl-C is one line and exit 130 from the start.

Importing fanout's command line takes a few hundred milliseconds (trio, httpx,
rich, the package itself); a Ctrl-C in that time would be Python's
``KeyboardInterrupt`` traceback.  This module sits outside the package, so
that running it imports nothing but the interpreter's own C modules: ``main``
installs a SIGINT handler (``_signal``: ``signal`` would import ``enum`` and
more first) that writes one line and exits 130, then imports and runs
``fanout.cli.main.main``, which puts the previous handler back as soon as it
can handle ``KeyboardInterrupt`` itself (one line, 130, after cleaning up).  In
between, ``fanout.tune_gc()`` sets the process's garbage collector for many
concurrent streams (the command is the whole process; the library never does).
"""

import _signal
import os
import sys

__all__ = ["main"]


def _interrupted_while_starting(signum: int, frame: object) -> None:
    # Nothing was done yet: no file opened, no request sent.
    try:
        os.write(2, b"fanout: interrupted (Ctrl-C)\n")
    finally:
        os._exit(130)


def main() -> int:
    """Run the ``fanout`` command line; returns its exit status."""
    previous = _signal.getsignal(_signal.SIGINT)
    if previous is not _signal.default_int_handler:  # ignored (a background job): leave it
        previous = None
    else:
        _signal.signal(_signal.SIGINT, _interrupted_while_starting)
    from fanout import tune_gc
    from fanout.cli.main import main as run

    # A command that runs thousands of streams spends a third of its CPU in the
    # collector's walks otherwise; everything imported so far is frozen out of them.
    tune_gc()
    status: int = run(restore_sigint=previous)
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
