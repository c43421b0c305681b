"""The ASGI app: every route in one table, each endpoint a plain function.

=========================  ======  ==============================================
``/``                      GET     the comparison page (``static/index.html``)
``/static/{name}``         GET     the page's script and style
``/healthz``               GET     ``{"status": "ok"}``; the one route without a key
``/v1/models``             GET     the configured models, then those the endpoint's
                                   ``GET /models`` lists (``listing``), OpenAI-shaped
``/v1/status``             GET     this replica: fan-outs and streams running, totals
                                   since start, limits, its key set's fingerprint
``/v1/fanout``             POST    one request, many models: SSE records or one JSON
``/v1/fanout/{id}/cancel`` POST    cancel a running fan-out (its streams end
                                   ``cancelled``, each still with its result); 421
                                   naming the owner if another replica runs it
``/v1/chat/completions``   POST    one model, passed through as an OpenAI stream
=========================  ======  ==============================================

An endpoint checks its input (``ApiError`` otherwise: an OpenAI-shaped error)
and returns a response value; the streaming ones carry a job that the
response runs.  ``create_app(service)`` wraps the table in the key check and,
when the config lists origins, CORS; every response names the replica
(``X-Fanout-Replica``).
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .._exceptions import ConfigError
from ..config import Config
from .body import parse_chat, parse_fanout, read_json
from .chat import ChatJob
from .errors import ApiError, error_response, json_response
from .keys import RequireKey
from .relay import STOP_REASON, FanoutJob
from .replica import OWNER_HEADER, REPLICA_HEADER, ReplicaHeader, id_replica
from .service import Service
from .sse import CollectedResponse, EventStreamResponse

__all__ = ["ROUTES", "create_app"]

#: The page may run only its own script and style, talk only to this service, and be
#: framed by nobody: model text that slipped into markup could still not run.
PAGE_HEADERS = {
    "content-security-policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "connect-src 'self'; img-src 'self' data:; base-uri 'none'; "
                               "form-action 'none'; frame-ancestors 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
    "cache-control": "no-cache",
}
ASSET_TYPES = {"app.js": "text/javascript", "app.css": "text/css"}


def _static(name: str) -> bytes:
    return resources.files("fanout.serve").joinpath("static", name).read_bytes()


def _service(request: Request) -> Service:
    service: Service = request.app.state.service
    return service


async def page(request: Request) -> Response:
    return Response(_static("index.html"), media_type="text/html", headers=PAGE_HEADERS)


async def asset(request: Request) -> Response:
    name = request.path_params["name"]
    if name not in ASSET_TYPES:
        raise ApiError(404, f"no such file: /static/{name}", code="not_found")
    return Response(_static(name), media_type=ASSET_TYPES[name], headers=PAGE_HEADERS)


async def healthz(request: Request) -> Response:
    if _service(request).closing:
        return json_response({"status": "shutting down"}, 503)
    return json_response({"status": "ok"})


async def models(request: Request) -> Response:
    service = _service(request)
    config = service.config
    listing = await service.endpoint_models.get()
    data: list[dict[str, Any]] = [
        {"id": model.name, "object": "model", "owned_by": "fanout", "upstream_id": model.id,
         "api": model.api, "default": model.name in config.compare, "source": "config"}
        for model in config.models]
    taken = {model.name for model in config.models} | {model.id for model in config.models}
    for model_id, owner in listing.models:
        # An id the config already names is its entry; one POST /v1/fanout would refuse
        # (a space, a control character) is not offered.
        if model_id in taken or not _runnable(config, model_id):
            continue
        data.append({"id": model_id, "object": "model", "owned_by": owner or "endpoint",
                     "upstream_id": model_id, "api": config.api, "default": False,
                     "source": "endpoint"})
    return json_response({"object": "list", "data": data, "endpoint_list": {
        "asked": listing.asked, "models": len(listing.models), "error": listing.error}})


def _runnable(config: Config, model_id: str) -> bool:
    try:
        config.model(model_id)
    except ConfigError:
        return False
    return True


async def status(request: Request) -> Response:
    return json_response(_service(request).status())


async def fanout(request: Request) -> Response:
    service = _service(request)
    body = await read_json(request, service.limits.max_body_bytes)
    ask = parse_fanout(body, service.config, service.limits)
    job = FanoutJob(service, ask, service.admit("fanout", len(ask.streams)))
    if ask.stream:
        return EventStreamResponse(job, keepalive=service.limits.keepalive,
                                   headers={"x-fanout-id": job.running.id})
    return CollectedResponse(job, job.document)


async def cancel(request: Request) -> Response:
    service = _service(request)
    fanout_id = request.path_params["id"]
    owner = id_replica(fanout_id)
    if owner is not None and owner != service.replica:
        raise ApiError(421, f"this fan-out runs on replica {owner}, not on this one "
                       f"({service.replica}): send its cancel to {owner} (a load balancer "
                       "routes it by the replica the id names: examples/haproxy.cfg)",
                       param="id", code="misdirected_request", headers={OWNER_HEADER: owner})
    running = service.fanouts.get(fanout_id)
    if running is None or running.kind != "fanout":
        raise ApiError(404, "no fan-out with this id is running (it ended, or never was)",
                       param="id", code="not_found")
    cancelled = running.cancel(STOP_REASON.replace("{id}", fanout_id))
    return json_response({"object": "fanout.cancel", "id": fanout_id, "cancelled": cancelled})


async def chat_completions(request: Request) -> Response:
    service = _service(request)
    body = await read_json(request, service.limits.max_body_bytes)
    ask = parse_chat(body, service.config, service.limits)
    job = ChatJob(service, ask, service.admit("chat", 1))
    if ask.stream:
        return EventStreamResponse(job, keepalive=service.limits.keepalive)
    return CollectedResponse(job, job.document)


ROUTES = [
    Route("/", page, methods=["GET"]),
    Route("/static/{name}", asset, methods=["GET"]),
    Route("/healthz", healthz, methods=["GET"]),
    Route("/v1/models", models, methods=["GET"]),
    Route("/v1/status", status, methods=["GET"]),
    Route("/v1/fanout", fanout, methods=["POST"]),
    Route("/v1/fanout/{id}/cancel", cancel, methods=["POST"]),
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
]


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    rejected = _service(request).rejected
    if exc.status == 413:
        rejected["too_large"] += 1
    elif exc.status == 400:
        rejected["bad_request"] += 1
    elif exc.status == 421:
        rejected["misdirected"] += 1
    return error_response(exc)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    message = {404: f"no route for {request.method} {request.url.path}",
               405: f"{request.method} is not allowed on {request.url.path}"}.get(
                   exc.status_code, str(exc.detail))
    return error_response(ApiError(exc.status_code, message, headers=exc.headers))


async def _internal(request: Request, exc: Exception) -> Response:
    # The traceback goes to the error log; the client learns only that it happened.
    # (Sent outside every middleware: the replica's header is set here.)
    return error_response(ApiError(500, "internal error in fanout serve", type="server_error",
                                   headers={REPLICA_HEADER: _service(request).replica}))


def create_app(service: Service) -> Starlette:
    """The ASGI app serving ``service``: ``ROUTES``, the key check, CORS if configured,
    the replica's name on every response."""
    middleware = [Middleware(ReplicaHeader, name=lambda: service.replica)]
    origins = service.limits.cors_origins
    if origins:
        middleware.append(Middleware(CORSMiddleware, allow_origins=list(origins),
                                     allow_methods=["GET", "POST"],
                                     allow_headers=["authorization", "content-type"],
                                     expose_headers=["x-fanout-id", REPLICA_HEADER,
                                                     OWNER_HEADER, "retry-after"],
                                     max_age=600))
    middleware.append(Middleware(RequireKey, keys=service.keys, rejected=service.rejected))
    handlers: dict[Any, Any] = {ApiError: _api_error, HTTPException: _http_error,
                                Exception: _internal}
    app = Starlette(routes=ROUTES, middleware=middleware, exception_handlers=handlers)
    app.state.service = service
    return app
