"""``python -m fanout``: the ``fanout`` command line, where no ``fanout`` script is on
the PATH (a Ray worker, a bare virtualenv).

It runs the console script's own entry point (``_fanout_entry``, installed beside
the package), so a Ctrl-C is one line and exit 130 from here on.  Python imports
the package (``fanout/__init__.py``) before this module runs: a Ctrl-C during
that import is Python's own ``KeyboardInterrupt``, which only the ``fanout``
script avoids.
"""

import sys

try:
    from _fanout_entry import main
except ImportError:  # a source tree without the entry module on the path
    from fanout.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
