"""The results-file record of one finished unit of work."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from ..core.result import StreamResult
from ..eval.cost import cost_of, usage_record
from ..records import result_record
from .plan import Work

__all__ = ["batch_record", "stamp"]


def stamp(shard: tuple[int, int], plan: str, run: str) -> dict[str, str]:
    """The fields that say which batch wrote a record: ``{"shard": "I/N", "plan": ...,
    "run": ...}`` (an unsharded run is shard ``0/1``)."""
    return {"shard": f"{shard[0]}/{shard[1]}", "plan": plan, "run": run}


def batch_record(work: Work, result: StreamResult, *, cut: bool = False, redo: int = 0,
                 run: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The results-file line of one finished unit of work.

    ``cut``: the server cut this stream while others ran, and it is redone
    (a later record of the same key follows); ``redo``: how many times this
    unit had been cut and redone in this run before this record; ``run``: the
    ``stamp`` of the batch (``shard``, ``plan``, ``run``), written after
    ``content_key``.

    For evaluation it carries the prompt's ``messages`` as sent, its
    ``expected`` (absent when the prompt has none), ``category`` and ``tags``
    (absent when unset), and the stream's ``cost`` (USD, ``None`` when unknown)
    with its ``cost_source`` (``fanout.eval.cost.cost_of``: ``"reported"``,
    ``"price"`` or ``None``).  ``usage`` keeps every field the relay sent
    (``cost``, ``prompt_tokens_details``, ...) after the three counts.  None of
    these is in ``content_key``: an older results file resumes as before.
    """
    base = result_record(result)
    usage = usage_record(result.usage)
    cost, cost_source = cost_of(usage, work.model.price)
    attempts = result.attempts
    rate_limited = sum(1 for a in attempts if a.status == 429)
    retry_wait = sum(a.waited for i, a in enumerate(attempts)
                     if i and attempts[i - 1].status == 429)
    first = result.choices[0] if result.choices else None
    return {
        "id": work.prompt.id,
        "model": work.model.name,
        "sample": work.sample,
        "outcome": base["outcome"],
        "reason": base["reason"],
        "flags": base["flags"],
        "flag_labels": base["flag_labels"],
        "cut": cut,
        "redo": redo,
        "others_running": result.others_running,
        "model_id": work.model.id,
        "api": work.model.api,
        "content_key": work.content_key,
        **(run or {}),
        "finished_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds"),
        "text": base["text"],
        "finish_reason": first.finish_reason if first else None,
        "choices": base["choices"],
        "usage": usage,
        "cost": cost,
        "cost_source": cost_source,
        "error": base["error"],
        "timed_out": base["timed_out"],
        "status": base["status"],
        "attempts": base["attempts"],
        "rate_limited": rate_limited,
        "retry_wait": round(retry_wait, 6),
        "skipped_frames": base["skipped_frames"],
        "response_model": base["model"],
        "response_id": base["response_id"],
        "metrics": base["metrics"],
        "messages": [dict(message) for message in work.prompt.messages],
        **work.prompt.eval_fields(),
    }
