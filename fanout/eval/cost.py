"""What a stream cost, in USD: the relay's own figure, or a price times the token counts.

Sans-I/O: plain arithmetic over a ``usage`` mapping (a results record's
``usage``: ``prompt_tokens``, ``completion_tokens``, and whatever else the
relay sent, such as ``cost`` or ``prompt_tokens_details.cached_tokens``).

Rules (``cost_of``):

- the relay's ``usage.cost``, when it is a number >= 0, wins: ``"reported"``
  (OpenRouter and LiteLLM send one);
- else, with a ``Price``: ``(prompt_tokens - cached) x input + cached x
  cached_input + completion_tokens x output``, per million tokens, where
  ``cached`` is ``prompt_tokens_details.cached_tokens`` when it is sent and the
  price has a ``cached_input`` (otherwise every prompt token is at ``input``):
  ``"price"``;
- anything else, a missing usage, a missing or non-integer count, no price:
  unknown, ``(None, None)``.  Unknown is never 0.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, Final, Literal

import attrs

from ..core.result import Usage

__all__ = ["COST_DIGITS", "COST_SOURCES", "PER", "Price", "cost_of", "estimate", "format_cost",
           "round_cost", "total", "usage_record"]

#: Prices are per this many tokens.
PER: Final = 1_000_000
#: What a record's ``cost_source`` may say (``None``: the cost is unknown).
COST_SOURCES: Final = ("price", "reported")

CostSource = Literal["price", "reported"]


def _rate(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is None and attribute.name == "cached_input":
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or \
            not math.isfinite(value) or value < 0:
        raise ValueError(f"{attribute.name} must be a number >= 0 (USD per million tokens), "
                         f"not {value!r}")


@attrs.frozen
class Price:
    """USD per million tokens: ``input`` (prompt), ``output`` (completion, reasoning
    included) and optionally ``cached_input`` (prompt tokens the relay served from
    its cache)."""

    input: float = attrs.field(validator=_rate)
    output: float = attrs.field(validator=_rate)
    cached_input: float | None = attrs.field(default=None, validator=_rate)


def usage_record(usage: Usage | None) -> dict[str, Any] | None:
    """A stream's usage as a record keeps it: the three counts (``None`` when not an
    integer), then every other field the relay sent, as sent (``cost``,
    ``prompt_tokens_details``, ...)."""
    if usage is None:
        return None
    counts = {"prompt_tokens": usage.prompt_tokens,
              "completion_tokens": usage.completion_tokens,
              "total_tokens": usage.total_tokens}
    return {**counts, **{key: value for key, value in usage.raw.items() if key not in counts}}


def _count(value: Any) -> int | None:
    return value if type(value) is int and value >= 0 else None


def _reported(usage: Mapping[str, Any]) -> float | None:
    cost = usage.get("cost")
    if isinstance(cost, bool) or not isinstance(cost, int | float):
        return None
    return float(cost) if math.isfinite(cost) and cost >= 0 else None


def cost_of(usage: Mapping[str, Any] | None, price: Price | None
            ) -> tuple[float | None, CostSource | None]:
    """The cost of one stream and where it comes from (see the module docstring)."""
    if not isinstance(usage, Mapping):
        return None, None
    reported = _reported(usage)
    if reported is not None:
        return reported, "reported"
    if price is None:
        return None, None
    prompt = _count(usage.get("prompt_tokens"))
    completion = _count(usage.get("completion_tokens"))
    if prompt is None or completion is None:
        return None, None
    cached = 0
    details = usage.get("prompt_tokens_details")
    if price.cached_input is not None and isinstance(details, Mapping):
        cached = min(_count(details.get("cached_tokens")) or 0, prompt)
    return estimate(price, prompt - cached, completion, cached), "price"


def estimate(price: Price, input_tokens: float, output_tokens: float,
             cached_tokens: float = 0) -> float:
    """``price`` times these counts (a bound, for counts not known yet)."""
    cached_rate = price.input if price.cached_input is None else price.cached_input
    return (input_tokens * price.input + cached_tokens * cached_rate
            + output_tokens * price.output) / PER


def total(costs: Iterable[float | None]) -> tuple[float, int]:
    """The sum of the known costs, and how many were unknown (never counted as 0)."""
    known, unknown = 0.0, 0
    for cost in costs:
        if cost is None:
            unknown += 1
        else:
            known += cost
    return known, unknown


#: Costs are rounded once, to this many decimals (a billionth of a dollar), before any
#: view shows or writes them: ``round_cost``.
COST_DIGITS: Final = 9


def round_cost(value: float | None) -> float | None:
    """``value`` rounded to ``COST_DIGITS`` decimals: the one rounding every view uses."""
    return None if value is None else round(value, COST_DIGITS)


def format_cost(total: float | None, unknown: int = 0) -> str:
    """``$0.01234``: ``round_cost(total)`` to four significant digits, ``+`` when some
    costs are unknown, ``-`` when all are.  The text in every view (terminal, HTML)."""
    total = round_cost(total)
    if total is None:
        return "-"
    if total == 0:
        text = "$0"
    elif total >= 100:
        text = f"${total:,.0f}"
    else:
        text = f"${total:.4g}" if total >= 0.0001 else f"${total:.2g}"
        if "e" in text:
            text = f"${total:.6f}".rstrip("0")
    return text + ("+" if unknown else "")
