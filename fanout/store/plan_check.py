"""Which plan a results file's records are of, and whether they hold all of it.

Every record ``fanout batch --shard I/N`` writes names its shard (``"shard":
"I/N"``, ``"0/1"`` unsharded), its plan (``"plan"``: ``plan_fingerprint`` of
the whole plan, all shards) and its run.  The fingerprint hashes N and every
(unit key, content key) pair of the plan, so the records alone can tell
whether every unit of their plan is there: the reported record of each key (its
latest, unless ``results.supersedes`` keeps an earlier one) gives the pairs, and
they hash to the plan's fingerprint exactly when no unit is missing and none of
another plan is mixed in.  ``PlanTally`` does that for
``fanout report``; ``fanout.batch.merge`` for a merge.

Records written before these fields existed have no plan: nothing can be told
of them but their keys.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from .results import Attempt, attempt_of, supersedes, work_key

__all__ = ["Completeness", "PlanTally", "plan_fingerprint", "record_plan", "record_shard"]

_PLAN = re.compile(r"[0-9a-f]{16}")
_SHARD = re.compile(r"(0|[1-9][0-9]{0,8})/([1-9][0-9]{0,8})")


def plan_fingerprint(units: Iterable[tuple[str, str]], shards: int) -> str:
    """The fingerprint of a plan of ``shards`` shards whose units are ``units``
    (every (unit key, content key) pair of the whole plan, in any order): the first
    16 hex digits of a sha256 over N in decimal and a newline, then each pair in
    sorted order as the compact JSON array ``["<unit key>","<content key>"]``
    (UTF-8, non-ASCII as itself) and a newline.  The same for every shard of one
    plan; other prompts, config, models, samples or N give another."""
    digest = hashlib.sha256(f"{shards}\n".encode())
    for key, content in sorted(units):
        digest.update(json.dumps([key, content], ensure_ascii=False, separators=(",", ":"))
                      .encode("utf-8", "surrogatepass") + b"\n")
    return digest.hexdigest()[:16]


def record_plan(record: Mapping[str, Any]) -> str | None:
    """A record's ``plan`` (16 lowercase hex digits), or ``None`` (absent or malformed)."""
    plan = record.get("plan")
    return plan if isinstance(plan, str) and _PLAN.fullmatch(plan) else None


def record_shard(record: Mapping[str, Any]) -> tuple[int, int] | None:
    """A record's ``shard`` as (I, N) with 0 <= I < N, or ``None`` (absent or malformed)."""
    shard = record.get("shard")
    match = _SHARD.fullmatch(shard) if isinstance(shard, str) else None
    if match is None:
        return None
    index, count = int(match[1]), int(match[2])
    return (index, count) if index < count else None


@attrs.frozen
class Completeness:
    """What the records of one file say of their plan."""

    plan: str
    shards: int
    units: int  # keys whose latest record is there
    complete: bool  # those keys are exactly the plan's (the fingerprint matches)
    not_done: Mapping[str, int]  # state -> how many of the units are not done
    shards_seen: tuple[int, ...]  # the shards of the plan that records name

    def line(self) -> str:
        """One line: whether the file is complete for its plan, and if not, what is off."""
        of = f"its plan {self.plan} ({self.shards} shard{'s' if self.shards != 1 else ''})"
        if self.complete and not self.not_done:
            every = "the one unit is" if self.units == 1 else f"all {self.units} units are"
            return f"complete for {of}: {every} there and done"
        if self.complete:
            states = ", ".join(f"{n} {state}" for state, n in sorted(
                self.not_done.items(), key=lambda item: (-item[1], item[0])))
            left = sum(self.not_done.values())
            return (f"every unit of {of} is there, {left} of {self.units} not done "
                    f"({states})")
        seen = ", ".join(map(str, self.shards_seen)) or "none"
        return (f"not complete for {of}: units are missing, or records of another plan are "
                f"mixed in (records of shards {seen} of {self.shards}); `fanout merge "
                "--prompts ... --config ...` names what is missing")


class PlanTally:
    """Reads a results file's records in order (``add``), then says what they tell of
    their plan (``check``): the plan is the one the last record with a plan names."""

    def __init__(self, *, accept_empty: bool = False) -> None:
        self._accept_empty = accept_empty
        self._latest: dict[str, Attempt] = {}  # key -> its reported record's
        self._plan: tuple[str, int] | None = None  # the last record's plan, N
        self._shards: dict[tuple[str, int], set[int]] = {}

    def add(self, record: Mapping[str, Any]) -> None:
        key = work_key(record["id"], record["model"], record["sample"])
        attempt = attempt_of(record)
        earlier = self._latest.get(key)
        if earlier is None or supersedes(earlier, attempt):
            self._latest[key] = attempt
        plan, shard = record_plan(record), record_shard(record)
        if plan is not None and shard is not None:
            self._plan = (plan, shard[1])
            self._shards.setdefault(self._plan, set()).add(shard[0])

    def check(self) -> Completeness | None:
        """``None`` when no record names its plan (it cannot be told)."""
        if self._plan is None:
            return None
        plan, shards = self._plan
        pairs = [(key, str(a.content_key)) for key, a in self._latest.items()]
        done = {"completed", "empty"} if self._accept_empty else {"completed"}
        not_done = Counter(a.state for a in self._latest.values() if a.state not in done)
        return Completeness(plan, shards, len(pairs),
                            plan_fingerprint(pairs, shards) == plan, dict(not_done),
                            tuple(sorted(self._shards[self._plan])))
