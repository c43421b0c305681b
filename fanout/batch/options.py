"""What a batch is asked to do, and the exit codes it ends with."""

from __future__ import annotations

import enum
import math
from typing import final

import attrs

from .._exceptions import ConfigError
from ..eval.run import REFUSED_STATUSES
from ..request import RetryPolicy
from ..sharedlimit import shown_spec, spec_problem

__all__ = ["BATCH_RETRY", "DEFAULT_CONCURRENCY", "FINAL_STATUSES", "MAX_REDOS", "BatchOptions",
           "ExitCode"]

DEFAULT_CONCURRENCY = 32
#: A batch has time: more attempts than the library's default, so a burst of 429s
#: (before the adaptive cap has come down) costs waiting, not failed work; and a
#: Retry-After is stretched by up to 25 %, so streams refused together come back apart.
BATCH_RETRY = RetryPolicy(attempts=8, maximum=30.0, retry_after_spread=0.25)
#: How many times one unit is redone in one run after the server cut it.
MAX_REDOS = 4
#: HTTP statuses that say the request itself is refused: a rerun sends it again, unchanged.
FINAL_STATUSES = REFUSED_STATUSES


@final
class ExitCode(enum.IntEnum):
    """How a batch (or ``fanout score``, or ``fanout merge``) ended, as a scheduler
    acts on it: the process's exit status.

    ========== =====================================================================
    ``0``      every unit is done
    ``1``      finished; some units failed in ways a rerun will not fix (a request the
               server refuses as sent: HTTP 4xx but 408, 409 and 429; a model that
               failed all its units the same way of its own: always truncates, answers
               empty or times out)
    ``2``      usage, config or input errors: nothing was sent
    ``3``      the budget (``--budget``) stopped the run
    ``75``     ``EX_TEMPFAIL``: work is left that a rerun may finish (connection
               refused, 5xx or 429 after every retry, a timeout, a stream still cut
               after every redo, a write error, a full disk, the results file locked
               by another run)
    ``130``    interrupted by SIGINT (Ctrl-C)
    ``143``    interrupted by SIGTERM
    ========== =====================================================================
    """

    DONE = 0
    FAILED = 1
    USAGE = 2
    BUDGET = 3
    TEMPFAIL = 75
    INTERRUPTED = 130
    TERMINATED = 143


#: The exit codes as one table: ``--help`` of ``batch`` and ``score`` shows it.
EXIT_TABLE = """\
exit status:
  0    every unit done
  1    finished; some units failed in ways a rerun will not fix (HTTP 4xx but
       408/409/429, a model that fails every unit the same way: always truncates,
       answers empty or times out)
  2    usage, config or input errors (nothing was sent)
  3    the budget stopped the run (--budget)
  75   work is left that a rerun may finish (connection refused, 5xx/429 after every
       retry, timeouts, a write error, a full disk, the file locked by another run)
  130  interrupted (Ctrl-C); 143: SIGTERM
"""


def _shard(value: tuple[int, int] | None) -> tuple[int, int] | None:
    if value is None:
        return None
    index, count = value
    return (int(index), int(count))


@final
@attrs.frozen
class BatchOptions:
    """One batch: every prompt x model x sample of one shard, into one results file.

    ``prompts``: the prompts file (JSON Lines); ``output``: the results file
    (appended to, resumed from, locked for the run).  ``models``: model names of
    the config (empty: the config's ``[batch] models``, else every model);
    ``samples``: answers per prompt and model.  ``concurrency``: streams in flight
    on the endpoint (default: the config's ``[concurrency] max``, else 32);
    ``per_model_concurrency``: at most this many per model.  ``shard``: ``(i, n)``,
    only shard ``i`` of ``n`` (a hash of each unit's key); a shard takes
    ``max(1, concurrency // n)`` of the endpoint's concurrency unless
    ``shard_concurrency`` says how many, and each model's own concurrency the same way
    (``max(1, cap // n)``).  ``shared_limit``: a shared limit instead of the static share
    (``redis://HOST:PORT/DB``, ``ray://``, ``ray://ACTOR``; ``off``: none, whatever
    ``FANOUT_SHARED_LIMIT`` or the config's ``[concurrency] shared`` say): every shard
    then takes slots of the endpoint's and each model's whole concurrency, and shares
    the 429 back-off, through it (``fanout.sharedlimit``).  ``run_id``: written in every record
    (default: the plan's fingerprint).  ``config``: the config file (default as
    ``fanout.load_config``).  ``accept_empty``: a completed stream with an empty
    answer counts as done.  ``scorers``: scorer names each answer is scored with
    as it is written, into ``scores`` (default: ``RESULTS.scores.jsonl``);
    ``budget``: USD this run may spend.  ``retry_failed``: send again the units whose
    latest record is a refusal of the same request as sent (HTTP 4xx but 408, 409 and
    429); by default a resume skips them, and they stay failed for good.

    Nothing is checked at construction; ``check()`` (called by ``run``) raises
    ``fanout.ConfigError`` with a line per problem.
    """

    prompts: str
    output: str
    models: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    samples: int = 1
    concurrency: int | None = None
    per_model_concurrency: int | None = None
    shard: tuple[int, int] | None = attrs.field(default=None, converter=_shard)
    shard_concurrency: int | None = None
    shared_limit: str | None = None
    run_id: str | None = None
    config: str | None = None
    accept_empty: bool = False
    scorers: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    scores: str | None = None
    budget: float | None = None
    retry_failed: bool = False

    def check(self) -> None:
        """Raise ``fanout.ConfigError`` (a line per problem, named as the command line
        names the option) if these options cannot run."""
        problems = []
        if self.samples < 1:
            problems.append(f"--samples must be >= 1, not {self.samples}")
        if self.budget is not None and not (math.isfinite(self.budget) and self.budget > 0):
            problems.append(f"--budget must be a number of USD > 0, not {self.budget}")
        for flag, value in (("--concurrency", self.concurrency),
                            ("--per-model-concurrency", self.per_model_concurrency),
                            ("--shard-concurrency", self.shard_concurrency)):
            if value is not None and value < 1:
                problems.append(f"{flag} must be >= 1, not {value}")
        if self.shard is not None:
            index, count = self.shard
            if count < 1 or not 0 <= index < count:
                problems.append(f"--shard {index}/{count}: I must be in 0..N-1 and N >= 1")
        if self.shared_limit is not None:
            problem = spec_problem(self.shared_limit)
            if problem is not None:
                problems.append(f"--shared-limit {shown_spec(self.shared_limit)}: {problem}")
        if self.run_id is not None and (not self.run_id or not self.run_id.isprintable()
                                        or len(self.run_id) > 200):
            problems.append("--run-id must be 1 to 200 printable characters")
        if self.scores is not None and not self.scorers:
            problems.append("--scores names where --score NAME writes; give a --score too")
        if problems:
            raise ConfigError("\n".join(problems))
