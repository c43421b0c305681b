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


def plan_chat(request: ChatRequest, context: Context) -> Plan:
    """The plan for a request of any route (``request.api``), or a 404 for an unknown
    model, or one this route does not serve."""
    spec = MODELS.get(request.name)
    if spec is not None:
        if request.api not in spec.apis:
            return _error(request, 404, f"The model '{request.model}' is served on "
                          f"{spec.routes} only (fanout mock --list).",
                          "invalid_request_error", param="model", code="model_not_found")
        return spec.plan(request, context)
    if request.name.startswith("replay/"):
        plan = plan_replay(request, context, request.name.removeprefix("replay/"))
        if plan is not None:
            return plan
    return _error(request, 404, f"The model '{request.model}' does not exist. "
                  "GET /v1/models lists the models of this upstream.",
                  "invalid_request_error", param="model", code="model_not_found")
