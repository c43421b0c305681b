"""Refusals as values: ``ApiError`` (raised by an endpoint) and the JSON responses.

Every JSON body the service sends goes through ``fanout.records.dumps``, the one
writer that escapes controls, bidi controls, separators and lone surrogates.
Errors are OpenAI-shaped, so any OpenAI client reads them::

    {"error": {"message": "models[2]: no model named 'gtp-4o' (did you mean 'gpt-4o'?)",
               "type": "invalid_request_error", "param": "models[2]", "code": "model_not_found"}}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, final

from starlette.responses import Response

from ..records import dumps

__all__ = ["ApiError", "describe", "error_response", "json_response"]


@final
class ApiError(Exception):
    """A request the service refuses: an HTTP status and an OpenAI-shaped error.

    ``message`` starts with the field it is about (``models[2]: ...``) when
    there is one, and ``param`` names that field.  ``headers`` go on the
    response (``Retry-After`` on a 429, ``WWW-Authenticate`` on a 401).
    """

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        """The response body: ``{"error": {message, type, param, code}}``."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def json_response(content: Any, status: int = 200,
                  headers: Mapping[str, str] | None = None) -> Response:
    """``content`` as a JSON response, written by ``dumps``."""
    return Response(dumps(content).encode(), status_code=status, headers=dict(headers or {}),
                    media_type="application/json")


def error_response(error: ApiError) -> Response:
    """The response that refuses a request with ``error``."""
    return json_response(error.body(), error.status, error.headers)


def describe(value: Any) -> str:
    """How a message names a client's value: short, never a long string in full."""
    if isinstance(value, str):
        return repr(value) if len(value) <= 60 else f"a string of {len(value)} characters"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        text = repr(value)
        return text if len(text) <= 40 else "a very long number"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    return type(value).__name__
