"""CPython's cyclic garbage collector, set for thousands of concurrent streams.

Every time a stream waits for its next read, trio allocates the objects of that
wait (coroutines, a closure, the wake-up's value); with thousands of streams the
net count of new container objects passes CPython's young threshold (700) every
few hundred wake-ups.  Each young collection walks the waits in flight and moves
the survivors to the older generations, which then fill and are walked in turn,
over every stream's state (about 140 tracked objects a stream).  Measured with
``bench/fanout.py``'s client at 3,000 streams: about a third of the process's
CPU, in collections that freed nothing (a streaming fan-out makes no reference
cycles).  Collecting rarely therefore costs no memory here.
"""

from __future__ import annotations

import gc

__all__ = ["YOUNG_THRESHOLD", "tune_gc"]

#: Net new container objects between two young collections under ``tune_gc()``
#: (CPython's default is 700).
YOUNG_THRESHOLD = 50_000


def tune_gc(young: int = YOUNG_THRESHOLD) -> tuple[int, int, int]:
    """Set the process's garbage collector for many concurrent streams; returns the
    thresholds it replaced.

    Freezes every object allocated so far (``gc.freeze()``: imported modules,
    configuration; call it once the imports are done) so that no collection walks
    them again, and collects the young generation only after ``young`` net new
    container objects, the older ones at CPython's usual ratios.  The ``fanout``
    command does this when it starts.  It changes the whole process, so a library
    never does it on its own: an application that runs thousands of streams calls
    it once.  Undo with ``gc.unfreeze()`` and ``gc.set_threshold(*previous)``.
    """
    if isinstance(young, bool) or not isinstance(young, int) or young < 1:
        raise ValueError(f"young must be a whole number >= 1, not {young!r}")
    previous = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(young, previous[1], previous[2])
    return previous
