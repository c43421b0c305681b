"""``--budget USD``: what a run may spend, and a bound for what is in flight (sans-I/O).

A unit is sent only while ``spent + in flight + its bound <= limit``:
``spent`` is the known cost of this run's finished streams (answers and
judges; a stream whose cost stays unknown adds its bound instead, so unknown
is never free), ``in flight`` the bounds of the streams sent and not finished.

The bound of one stream (``bound``):

- input: the largest ``prompt_tokens`` seen for this prompt and model (in the
  results file or this run), else the characters of its messages / 2 (about
  twice what tokenizers make of English text: an over-estimate on purpose);
- output: the request's ``max_completion_tokens`` or ``max_tokens``, else the
  largest ``completion_tokens`` seen for the model, else
  ``DEFAULT_OUTPUT_TOKENS``;
- times the model's ``price``; a model without one is bounded by the largest
  cost its relay *reported* for one of its streams (in the file or this run),
  doubled; with neither, there is no bound and ``--budget`` refuses to start
  (``unbounded``): whether a relay will report costs cannot be known before
  it has.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, Final

import attrs

from .cost import Price, estimate

__all__ = ["DEFAULT_OUTPUT_TOKENS", "Budget"]

#: Output tokens assumed for a request that sets no max_tokens, of a model not seen yet.
DEFAULT_OUTPUT_TOKENS: Final = 4096
#: An unpriced model's bound: its largest reported cost for one stream, times this.
REPORTED_MARGIN: Final = 2.0


def _count(value: Any) -> int | None:
    return value if type(value) is int and value >= 0 else None


def _chars(messages: Iterable[Mapping[str, Any]]) -> int:
    return sum(len(json.dumps(message.get("content"), ensure_ascii=False, default=str))
               for message in messages)


@attrs.define
class Budget:
    """The budget of one run: ``limit`` USD, ``prices`` by model name."""

    limit: float
    prices: Mapping[str, Price | None]
    spent: float = 0.0
    unknown: int = 0  # finished streams whose cost stayed unknown (their bound was added)
    stopped: bool = False  # a stream did not fit with nothing running: it was not sent
    needed: float | None = None  # the smallest bound that did not fit
    _inflight: dict[str, float] = attrs.Factory(dict)
    _prompt_tokens: dict[tuple[str, str], int] = attrs.Factory(dict)
    _completion_tokens: dict[str, int] = attrs.Factory(dict)
    _reported: dict[str, float] = attrs.Factory(dict)  # model -> largest reported cost

    @property
    def in_flight(self) -> float:
        """The bounds of the streams sent and not finished."""
        return sum(self._inflight.values())

    @property
    def running(self) -> int:
        return len(self._inflight)

    def unbounded(self, models: Iterable[str]) -> list[str]:
        """The models no bound can be put on: no price, no reported cost seen."""
        return [m for m in models if self.prices.get(m) is None and m not in self._reported]

    def observe(self, prompt_id: str | int, model: str, record: Mapping[str, Any]) -> None:
        """Learn from a finished stream's record (an earlier run's, or this run's)."""
        usage = record.get("usage")
        if isinstance(usage, Mapping):
            prompt = _count(usage.get("prompt_tokens"))
            if prompt is not None:
                key = (str(prompt_id), model)
                self._prompt_tokens[key] = max(prompt, self._prompt_tokens.get(key, 0))
            completion = _count(usage.get("completion_tokens"))
            if completion is not None:
                self._completion_tokens[model] = max(completion,
                                                     self._completion_tokens.get(model, 0))
        cost = record.get("cost")
        if record.get("cost_source") == "reported" and isinstance(cost, int | float) \
                and not isinstance(cost, bool):
            self._reported[model] = max(float(cost), self._reported.get(model, 0.0))

    def bound(self, prompt_id: str | int, model: str, messages: Iterable[Mapping[str, Any]],
              params: Mapping[str, Any]) -> float | None:
        """What one stream of ``model`` may cost at most (``None``: unbounded)."""
        price = self.prices.get(model)
        if price is None:
            reported = self._reported.get(model)
            return None if reported is None else reported * REPORTED_MARGIN
        seen = self._prompt_tokens.get((str(prompt_id), model))
        tokens_in = seen if seen is not None else (_chars(messages) + 1) // 2
        tokens_out = next((n for n in (_count(params.get("max_completion_tokens")),
                                       _count(params.get("max_tokens"))) if n is not None),
                          None)
        if tokens_out is None:
            tokens_out = self._completion_tokens.get(model, DEFAULT_OUTPUT_TOKENS)
        return estimate(price, tokens_in, tokens_out)

    def fits(self, bound: float) -> bool:
        """Whether a stream of this bound may be sent now."""
        return self.spent + self.in_flight + bound <= self.limit

    def stop(self, bound: float) -> None:
        """A stream of this bound does not fit, and nothing runs that could make room:
        it is not sent."""
        self.stopped = True
        self.needed = bound if self.needed is None else min(self.needed, bound)

    def send(self, key: str, bound: float) -> None:
        """A stream of this bound is sent."""
        self._inflight[key] = bound

    def finished(self, key: str, cost: float | None) -> None:
        """A stream sent with ``send`` ended, costing ``cost`` (``None``: unknown, so its
        bound counts)."""
        bound = self._inflight.pop(key, 0.0)
        if cost is None:
            self.unknown += 1
            self.spent += bound
        else:
            self.spent += cost

    def describe(self, not_sent: int) -> str:
        """The one line a run that stopped says."""
        needed = f" (the smallest bound that did not fit: ${self.needed:.6f})" \
            if self.needed is not None else ""
        return (f"budget: stopped sending at ${self.spent:.6f} spent + ${self.in_flight:.6f} "
                f"bound in flight of ${self.limit:.6f}{needed}; {not_sent} unit"
                f"{'s' if not_sent != 1 else ''} not sent (a rerun with a new --budget "
                "continues)")
