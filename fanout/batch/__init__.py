"""The batch as a library: every prompt x model x sample through one endpoint, into a
results file, crash-safe and resumable.

::

    import fanout.batch

    options = fanout.batch.BatchOptions(prompts="prompts.jsonl", output="results-0.jsonl",
                                        models=("writer",), shard=(0, 4))
    summary = fanout.batch.run_sync(options)        # a script, a worker, a Ray task
    summary = await fanout.batch.run(options)       # inside a trio program
    if summary.exit_code == fanout.batch.ExitCode.TEMPFAIL:
        ...                                         # work is left: run it again
    report = fanout.batch.merge(["shards/"], "results.jsonl", prompts="prompts.jsonl",
                                config="fanout.toml")   # shard files into one, checked

``fanout batch`` is this library with a progress bar.  The library never prints:
pass a ``BatchObserver`` to watch a run.  Bad options, config or input raise
``fanout.ConfigError`` before anything is sent.
"""

from .options import BatchOptions as BatchOptions
from .options import ExitCode as ExitCode
from .progress import BatchObserver as BatchObserver
from .progress import BatchProgress as BatchProgress
from .runner import run as run
from .runner import run_sync as run_sync
from .shards import MergeReport as MergeReport
from .shards import merge as merge
from .summary import BatchSummary as BatchSummary
from .summary import Failure as Failure

__all__ = ["BatchObserver", "BatchOptions", "BatchProgress", "BatchSummary", "ExitCode",
           "Failure", "MergeReport", "merge", "run", "run_sync"]
