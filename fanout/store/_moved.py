"""What the merge reads from where it lives until issue #20's move lands.

The results and prompts files (``cli/results.py``, ``cli/prompts.py``), the scores
file (``eval/scores.py``) and the plan (``cli/batch.py``'s ``plan_work``) move
below ``store/`` and ``batch/``; this is the one module that imports them from
their old homes, so the move changes these lines only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..cli.prompts import PromptFileError, load_prompts
from ..cli.results import (
    STATES,
    Line,
    Unreadable,
    _holder,
    lock_path,
    record_problem,
    scan,
    shard_of,
    state_of,
    work_key,
)
from ..eval.scores import answer_key, score_problem, scores_path

__all__ = ["STATES", "Line", "PromptFileError", "Unreadable", "answer_key", "holder",
           "load_prompts", "lock_path", "plan_work", "record_problem", "scan",
           "score_problem", "scores_path", "shard_of", "state_of", "work_key"]

if TYPE_CHECKING:
    from ..cli.batch import Work

holder = _holder


def plan_work(*args: Any, **kwargs: Any) -> list[Work]:
    """``fanout batch``'s plan (imported when called: ``cli.batch`` imports
    ``cli.report``, which imports ``store``)."""
    from ..cli.batch import plan_work as plan

    return plan(*args, **kwargs)
