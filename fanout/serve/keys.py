"""Service keys: the client tokens of ``[serve] keys_env``, and the middleware that asks
for one on every route but ``/healthz``.

A token comes as ``Authorization: Bearer <token>`` (API clients), or as HTTP
Basic with the token as the password or the user name (a browser: the page's
401 asks for it, and the browser then sends it with the page's own requests).
Tokens are compared in constant time, each of them; a token sent is never
echoed, logged or counted by value.  ``ServiceKeys.fingerprint`` names the key
set (never a key) so that replicas holding different keys can be told apart.

The middleware gets the keys and the refusal counter it needs, not the
service: ``service`` imports this module, never the other way round.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
from collections import Counter
from collections.abc import Mapping
from typing import final

import attrs
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from .._exceptions import ConfigError
from .errors import ApiError, error_response

__all__ = ["OPEN_PATHS", "RequireKey", "ServiceKeys"]

#: The routes anyone may call: a load balancer's health check carries no key.
OPEN_PATHS = frozenset({"/healthz"})
#: The page's paths: their 401 asks the browser for a password (the key).
PAGE_PATHS = ("/", "/static/")


def _tokens(value: frozenset[str] | tuple[str, ...] | list[str]) -> frozenset[str]:
    return frozenset(value)


@final
@attrs.frozen
class ServiceKeys:
    """The tokens a client may present; empty: the service needs none."""

    tokens: frozenset[str] = attrs.field(factory=frozenset, converter=_tokens, repr=False)

    @classmethod
    def from_env(cls, name: str | None, environ: Mapping[str, str] | None = None,
                 source: str = "<config>") -> ServiceKeys:
        """The tokens in the variable ``name`` (comma-separated); none if ``name`` is None.

        A variable that is named but unset or empty is a ``ConfigError``: a
        service told to need keys must not start without them.
        """
        if name is None:
            return cls()
        env = os.environ if environ is None else environ
        tokens = frozenset(t.strip() for t in env.get(name, "").split(",") if t.strip())
        if not tokens:
            raise ConfigError(f"{source}: [serve] keys_env: the variable {name} is not set "
                              "(or holds no key)")
        return cls(tokens)

    def __bool__(self) -> bool:
        return bool(self.tokens)

    @property
    def fingerprint(self) -> str | None:
        """12 hex digits naming the key set; ``None`` without keys.

        The first 12 hex digits of the SHA-256 of the sorted SHA-256 hex digests of
        the keys, one a line: the same on every replica holding the same keys (in
        any order), different when one key differs; it gives away no key.
        """
        if not self.tokens:
            return None
        digests = sorted(hashlib.sha256(token.encode()).hexdigest() for token in self.tokens)
        return hashlib.sha256("\n".join(digests).encode()).hexdigest()[:12]

    def allows(self, authorization: str) -> bool:
        """Whether an ``Authorization`` header value carries one of the tokens."""
        scheme, _, credentials = authorization.strip().partition(" ")
        credentials = credentials.strip()
        candidates: list[str] = []
        if scheme.lower() == "bearer":
            candidates.append(credentials)
        elif scheme.lower() == "basic":
            try:
                decoded = base64.b64decode(credentials, validate=True).decode("utf-8")
            except (binascii.Error, UnicodeDecodeError):
                return False
            user, _, password = decoded.partition(":")
            candidates.extend(c for c in (password, user) if c)
        found = False
        for candidate in candidates:
            given = candidate.encode()
            for token in self.tokens:  # every one of them: no early exit to time
                found |= hmac.compare_digest(given, token.encode())
        return found


class RequireKey:
    """ASGI middleware: with keys set, a request without a valid one gets a 401
    (counted in ``rejected["unauthorized"]``)."""

    def __init__(self, app: ASGIApp, keys: ServiceKeys, rejected: Counter[str]) -> None:
        self.app = app
        self.keys = keys
        self.rejected = rejected

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        keys = self.keys
        if scope["type"] != "http" or not keys or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        header = Headers(scope=scope).get("authorization")
        if header is not None and keys.allows(header):
            await self.app(scope, receive, send)
            return
        self.rejected["unauthorized"] += 1
        path: str = scope["path"]
        page = path == PAGE_PATHS[0] or path.startswith(PAGE_PATHS[1])
        challenge = ('Basic realm="fanout serve", charset="UTF-8"' if page
                     else 'Bearer realm="fanout serve"')
        message = ("the service key is not valid" if header is not None else
                   "a service key is needed: send Authorization: Bearer <key>")
        response = error_response(ApiError(401, message, code="invalid_api_key",
                                           headers={"WWW-Authenticate": challenge}))
        await response(scope, receive, send)
