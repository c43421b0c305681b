"""Every model of the embedded upstream, by id, and the plan for a request.

The scripted and fault models (``models.py``) come first; the judge models
(``judge.py``), the real servers' shapes of the event dialects (``relays.py``)
and the connection's own faults (``connections.py``) stream through the
helpers of ``models.py``, so they sit beside it and are gathered here: this
module imports them all, none of them imports it.
"""

from __future__ import annotations

from .connections import CONNECTION_MODELS
from .judge import JUDGE_MODELS
from .models import SCRIPTED_MODELS, Context, ModelSpec, _error, plan_replay
from .plans import ChatRequest, Plan
from .relays import RELAY_MODELS

__all__ = ["MODELS", "plan_chat"]

#: Model id -> its spec: what ``fanout mock --list`` lists, in that order.
MODELS: dict[str, ModelSpec] = {**SCRIPTED_MODELS, **JUDGE_MODELS, **RELAY_MODELS,
                                **CONNECTION_MODELS}


#: Scripted models whose :ARG is a word, not a number.
_WORD_ARGS = frozenset({"fault/error-event", "fault/echo-key"})


def argument_problem(request: ChatRequest) -> str | None:
    """One line saying why a scripted model's ``:ARG`` is malformed (``fault/stall:abc``),
    or ``None``: a number where a number is meant, never a silent default."""
    if request.name not in SCRIPTED_MODELS or request.name in _WORD_ARGS or not request.args:
        return None
    arg = request.args[0]
    try:
        if arg:
            float(arg)
    except ValueError:
        return f"{request.name}: {arg[:40]!r} is not a number (fanout mock --list)"
    return None


def plan_chat(request: ChatRequest, context: Context) -> Plan:
    """The plan for a request of any route (``request.api``), or a 404 for an unknown
    model, or one this route does not serve."""
    spec = MODELS.get(request.name)
    if spec is not None:
        if request.api not in spec.apis:
            return _error(request, 404, f"The model '{request.model}' is served on "
                          f"{spec.routes} only (fanout mock --list).",
                          "invalid_request_error", param="model", code="model_not_found")
        problem = argument_problem(request)
        if problem is not None:
            return _error(request, 400, problem, "invalid_request_error", param="model")
        return spec.plan(request, context)
    if request.name.startswith("replay/"):
        plan = plan_replay(request, context, request.name.removeprefix("replay/"))
        if plan is not None:
            return plan
    return _error(request, 404, f"The model '{request.model}' does not exist. "
                  "GET /v1/models lists the models of this upstream.",
                  "invalid_request_error", param="model", code="model_not_found")
