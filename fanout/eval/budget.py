"""``--budget USD``: what a run may spend, a bound that holds for what is in flight,
and the streams that would pass it (sans-I/O).

A stream is sent only while ``spent + in flight + its bound <= limit``:
``spent`` is the known cost of this run's finished streams (answers and
judges; a stream whose cost stays unknown adds its bound, or what it was seen
to stream if that is more, so unknown is never free), ``in flight`` the bounds
of the streams sent and not finished.

The bound of one stream (``bound``, a ``Reservation``), times the model's
``price``:

- input: the largest ``prompt_tokens`` seen for this prompt and model (in the
  results file or this run), else one token a byte of its messages and tools
  (UTF-8, as JSON) plus ``MESSAGE_OVERHEAD`` a message: a tokenizer makes at
  most one token of every byte (byte-level BPE and SentencePiece alike), about
  four times what English takes;
- output: the request's ``max_completion_tokens`` or ``max_tokens`` (times its
  ``n``), which the server enforces; else the model's ``max_output_tokens``
  (``[[models]]``: what the user says it never writes more than); an Anthropic
  request without one is sent ``fanout.bodies.DEFAULT_MAX_TOKENS``.  A model
  with neither, or without a price, has no bound: ``--budget`` refuses to
  start (``why_unbounded``).  No "largest answer seen so far": that is no
  bound.

While a stream runs (``streamed``), its running cost is its input bound (or
the ``prompt_tokens`` its usage reported, once it has) plus its output so far
times the output price.  The output so far is the ``completion_tokens`` of a
usage sent while it runs, else an estimate from what it streamed: one token
a content delta, or one every ``BYTES_PER_TOKEN`` bytes (UTF-8) of text,
reasoning, refusal and tool-call arguments if that is more (about what
tokenizers make of English); held at its output bound while no more deltas
than that arrived (a server that enforces ``max_tokens``, or a model that
keeps to its ``max_output_tokens``, writes no more, whatever the bytes
suggest; one delta past it shows it does not, and the bytes after it count).
A stream whose running cost, after one more delta like its largest, would
pass what is left for it (``limit - spent - what is held for the others``)
is cancelled (``cancelled``: its partial output kept, its reason naming the
budget).

A relay may still bill more than it streamed (a usage that says more tokens
than ``max_tokens`` allows, a cost of its own): ``exceeded`` says by how much
the run's spending passed the limit, and the run's last line says so.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, Final

import attrs

from ..bodies import DEFAULT_MAX_TOKENS
from ..core.events import (
    Event,
    ReasoningDelta,
    RefusalDelta,
    TextDelta,
    ToolCallDelta,
    UsageReported,
)
from .cost import Price, estimate

__all__ = ["BYTES_PER_TOKEN", "MESSAGE_OVERHEAD", "Budget", "Reservation", "output_bound",
           "why_unbounded"]

#: Tokens a chat template adds around one message (role markers, separators), at most.
MESSAGE_OVERHEAD: Final = 16
#: A running stream's output tokens, estimated from its bytes when no usage came yet.
BYTES_PER_TOKEN: Final = 4
#: USD: sums of floats that should be equal may differ by this much (a stream whose bound
#: is exactly what is left fits).
_ROUNDING: Final = 1e-9


def _count(value: Any) -> int | None:
    return value if type(value) is int and value >= 0 else None


def _bytes(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, default=str).encode("utf-8",
                                                                         "surrogatepass"))


def input_bound(messages: Iterable[Mapping[str, Any]],
                tools: Iterable[Mapping[str, Any]] | None = None) -> int:
    """At most how many tokens a tokenizer makes of these messages and tools: one a
    byte, plus ``MESSAGE_OVERHEAD`` a message (and one more for the reply's start)."""
    listed = list(messages)
    return (sum(_bytes(message.get("content")) for message in listed)
            + (_bytes(list(tools)) if tools else 0)
            + MESSAGE_OVERHEAD * (len(listed) + 1))


def output_bound(params: Mapping[str, Any], *, api: str = "chat",
                 max_output_tokens: int | None = None) -> tuple[int, bool] | None:
    """At most how many output tokens a request of ``params`` costs, and whether the
    server enforces that bound (the request's own ``max_tokens``) or the user claims it
    (``max_output_tokens``); ``None``: nothing bounds it."""
    choices = _count(params.get("n")) or 1
    asked = next((n for n in (_count(params.get("max_completion_tokens")),
                              _count(params.get("max_tokens"))) if n is not None), None)
    if asked is None and api == "anthropic":
        asked = DEFAULT_MAX_TOKENS  # what fanout sends: the API requires one
    if asked is not None:
        return asked * choices, True
    if max_output_tokens is not None:
        return max_output_tokens * choices, False
    return None


def why_unbounded(name: str, price: Price | None, params: Mapping[str, Any], *,
                  api: str = "chat", max_output_tokens: int | None = None) -> str | None:
    """Why a stream of model ``name`` cannot be bounded (one line, naming the keys that
    would bound it), or ``None``."""
    if price is None:
        return (f"no price for {name!r}, so what it spends cannot be bounded; give it "
                "price = { input = ..., output = ... } in its [[models]] entry")
    if output_bound(params, api=api, max_output_tokens=max_output_tokens) is None:
        return (f"nothing bounds the output of {name!r} (no max_tokens in its params, no "
                "max_output_tokens in its [[models]] entry), so what it spends cannot be "
                "bounded; set params = { max_tokens = N } (sent, enforced by the server) or "
                "max_output_tokens = N (not sent: what it never writes more than)")
    return None


@attrs.frozen
class Reservation:
    """What one stream may cost at most (``cost``, USD), from its token bounds."""

    cost: float
    input_tokens: int
    output_tokens: int
    price: Price
    enforced: bool = True  # the output bound is the request's own max_tokens


@attrs.define
class _Running:
    reservation: Reservation
    held: float  # what the budget holds for it: its bound, or its running cost once more
    bytes: int = 0
    deltas: int = 0
    bytes_at_bound: int = 0  # its bytes when its deltas reached its output bound
    largest: int = 1  # tokens of its largest delta so far (estimated)
    prompt_tokens: int | None = None  # reported while it ran
    completion_tokens: int | None = None
    cancelled: bool = False

    def output_tokens(self, more: int = 0) -> int:
        """Its output tokens so far (``more``: after one more delta of that many)."""
        if self.completion_tokens is not None:
            return self.completion_tokens + more
        bound = self.reservation.output_tokens
        if self.deltas <= bound:
            # No more deltas than its bound: a server that enforces it (or a model that
            # keeps to it) writes no more, whatever the bytes suggest.
            return min(max(self.deltas + (more > 0), -(-self.bytes // BYTES_PER_TOKEN) + more),
                       bound)
        # Past it: the bound, and what came after it, from its bytes.
        past = -(-(self.bytes - self.bytes_at_bound) // BYTES_PER_TOKEN)
        return max(self.deltas + (more > 0), bound + past + more)

    def cost(self, more: int = 0) -> float:
        """Its running cost (``more``: after one more delta of that many tokens)."""
        reservation = self.reservation
        prompt = reservation.input_tokens if self.prompt_tokens is None else self.prompt_tokens
        return estimate(reservation.price, prompt, self.output_tokens(more))


@attrs.define
class Budget:
    """The budget of one run: ``limit`` USD, ``prices`` and ``max_output`` (the
    ``max_output_tokens`` of each model, ``None`` for none) by model name."""

    limit: float
    prices: Mapping[str, Price | None]
    max_output: Mapping[str, int | None] = attrs.Factory(dict)
    spent: float = 0.0
    unknown: int = 0  # finished streams whose cost stayed unknown (their bound was added)
    stopped: bool = False  # a stream did not fit with nothing running, or was cancelled
    needed: float | None = None  # the smallest bound that did not fit
    cancelled: int = 0  # streams cancelled because they would have passed the budget
    over_bound: int = 0  # finished streams that cost more than their bound
    _inflight: dict[str, _Running] = attrs.Factory(dict)
    _held: float = 0.0  # the sum of the running streams' ``held``
    _prompt_tokens: dict[tuple[str, str], int] = attrs.Factory(dict)

    @property
    def in_flight(self) -> float:
        """What is held for the streams sent and not finished: each one's bound, or what
        it has streamed if that is more."""
        return self._held if self._inflight else 0.0

    @property
    def running(self) -> int:
        return len(self._inflight)

    @property
    def exceeded(self) -> float:
        """By how much this run's spending passed the limit (0.0: it did not)."""
        over = self.spent - self.limit
        return over if over > _ROUNDING else 0.0

    def observe(self, prompt_id: str | int, model: str, record: Mapping[str, Any]) -> None:
        """Learn from a finished stream's record (an earlier run's, or this run's): the
        prompt tokens of this prompt and model."""
        usage = record.get("usage")
        if isinstance(usage, Mapping):
            prompt = _count(usage.get("prompt_tokens"))
            if prompt is not None:
                key = (str(prompt_id), model)
                self._prompt_tokens[key] = max(prompt, self._prompt_tokens.get(key, 0))

    def bound(self, prompt_id: str | int, model: str, messages: Iterable[Mapping[str, Any]],
              params: Mapping[str, Any], *, api: str = "chat",
              tools: Iterable[Mapping[str, Any]] | None = None) -> Reservation | None:
        """What one stream of ``model`` may cost at most (``None``: unbounded)."""
        price = self.prices.get(model)
        output = output_bound(params, api=api, max_output_tokens=self.max_output.get(model))
        if price is None or output is None:
            return None
        seen = self._prompt_tokens.get((str(prompt_id), model))
        tokens_in = seen if seen is not None else input_bound(messages, tools)
        tokens_out, enforced = output
        return Reservation(estimate(price, tokens_in, tokens_out), tokens_in, tokens_out,
                           price, enforced)

    def fits(self, reservation: Reservation) -> bool:
        """Whether a stream of this bound may be sent now."""
        return self.spent + self.in_flight + reservation.cost <= self.limit + _ROUNDING

    def stop(self, reservation: Reservation) -> None:
        """A stream of this bound does not fit, and nothing runs that could make room:
        it is not sent."""
        self.stopped = True
        cost = reservation.cost
        self.needed = cost if self.needed is None else min(self.needed, cost)

    def send(self, key: str, reservation: Reservation) -> None:
        """A stream of this bound is sent (its bound is reserved)."""
        self._inflight[key] = _Running(reservation, reservation.cost)
        self._held += reservation.cost

    def release(self, key: str) -> None:
        """A stream reserved with ``send`` was not sent after all: its bound is free."""
        running = self._inflight.pop(key, None)
        if running is not None:
            self._held -= running.held

    def _hold(self, running: _Running) -> None:
        held = max(running.reservation.cost, running.cost())
        self._held += held - running.held
        running.held = held

    def streamed(self, event: Event) -> bool:
        """Count an event of a running stream; ``True`` when it is a content event and
        the stream's running cost now passes what is left for it: cancel it (once)."""
        running = self._inflight.get(event.stream)
        if running is None:
            return False
        if isinstance(event, UsageReported):
            # A usage while it runs (Anthropic's input at the start, some relays' on every
            # chunk): more exact than the estimate.  Not a reason to cancel by itself: at
            # the end of a stream it is already paid for.
            usage = event.usage
            if usage.prompt_tokens is not None and usage.prompt_tokens >= 0:
                running.prompt_tokens = usage.prompt_tokens
            if usage.completion_tokens is not None and usage.completion_tokens >= 0:
                running.completion_tokens = usage.completion_tokens
            self._hold(running)
            return False
        if isinstance(event, TextDelta | ReasoningDelta | RefusalDelta):
            size = len(event.text.encode("utf-8", "surrogatepass"))
        elif isinstance(event, ToolCallDelta):
            size = len(event.arguments.encode("utf-8", "surrogatepass")) + len(
                (event.name or "").encode("utf-8", "surrogatepass"))
        else:
            return False
        running.bytes += size
        running.deltas += 1
        if running.deltas == running.reservation.output_tokens:
            running.bytes_at_bound = running.bytes
        running.largest = max(running.largest, -(-size // BYTES_PER_TOKEN))
        self._hold(running)
        # "Would pass": after one more delta like its largest, since the next ones may
        # already be on their way when the cancellation lands.
        if running.cancelled or \
                running.cost(running.largest) <= self.left_for(event.stream) + _ROUNDING:
            return False
        running.cancelled = True
        self.cancelled += 1
        self.stopped = True
        return True

    def left_for(self, key: str) -> float:
        """What the budget leaves a running stream: the limit, less what is spent and the
        other streams' bounds."""
        own = self._inflight[key].held if key in self._inflight else 0.0
        return self.limit - self.spent - (self.in_flight - own)

    def reason(self, key: str) -> str:
        """The reason a stream cancelled by ``streamed`` ends with."""
        running = self._inflight.get(key)
        cost = running.cost() if running is not None else 0.0
        return (f"cancelled: its running cost (about ${cost:.6f}) would pass what the budget "
                f"(--budget {self.limit:g}) had left for it (${self.left_for(key):.6f})")

    def finished(self, key: str, cost: float | None) -> None:
        """A stream sent with ``send`` ended, costing ``cost`` (``None``: unknown, so its
        bound counts, or what it was seen to stream if that is more)."""
        running = self._inflight.pop(key, None)
        if running is None:
            if cost is not None:
                self.spent += cost
            return
        self._held -= running.held
        bound = running.reservation.cost
        if cost is None:
            self.unknown += 1
            self.spent += max(bound, running.cost())
            return
        self.spent += cost
        if cost > bound + _ROUNDING:
            self.over_bound += 1

    def _exceeded(self) -> str:
        if not self.exceeded:
            return ""
        why = (f" ({self.over_bound} stream{'s' if self.over_bound != 1 else ''} cost more "
               "than their bound: the relay billed more tokens than were asked for)"
               if self.over_bound else "")
        return f"; budget exceeded by ${self.exceeded:.6f}{why}"

    def spent_line(self) -> str:
        """The one line a run that was not stopped says: what it spent, and by how much it
        passed the budget if it did."""
        unknown = f" ({self.unknown} of unknown cost counted at their bounds)" \
            if self.unknown else ""
        return (f"budget: this run spent ${self.spent:.6f} of ${self.limit:.6f}{unknown}"
                f"{self._exceeded()}")

    def describe(self, not_sent: int) -> str:
        """The one line a run that stopped says."""
        needed = f" (the smallest bound that did not fit: ${self.needed:.6f})" \
            if self.needed is not None else ""
        cancelled = (f"; {self.cancelled} stream{'s' if self.cancelled != 1 else ''} "
                     "cancelled before passing it") if self.cancelled else ""
        return (f"budget: stopped sending at ${self.spent:.6f} spent + ${self.in_flight:.6f} "
                f"bound in flight of ${self.limit:.6f}{needed}; {not_sent} unit"
                f"{'s' if not_sent != 1 else ''} not sent{cancelled} (a rerun with a new "
                f"--budget continues){self._exceeded()}")
