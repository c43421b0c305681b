"""The one boundary where secrets are taken out of what a server sends.

Every string a server supplies reaches fanout through a ``StreamParser``: the
body's event data (before JSON parsing, so error payloads, ids, model names,
skipped-frame excerpts and content all pass it), error bodies, response
headers, and the messages of errors the I/O layer records.  The parser runs
each through one ``Redactor``; nothing downstream has to remember to.

A server can spell the key with JSON escapes (``\\u0073k-...``): after
parsing, a chunk whose raw text had a ``\\u00`` escape is walked and every
string in it redacted too.  Secrets shorter than ``MIN_SECRET`` characters
are not redacted: replacing two letters everywhere would destroy the text
and protect nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final, final

__all__ = ["MASK", "MIN_SECRET", "Redactor"]

MASK: Final = "***"
MIN_SECRET: Final = 4


@final
class Redactor:
    """Replaces each secret by ``***`` in strings, and in strings nested in JSON values."""

    __slots__ = ("_secrets", "encoded")

    def __init__(self, secrets: Iterable[str | None] = ()) -> None:
        kept = {s for s in secrets if s and len(s) >= MIN_SECRET}
        # Longest first: a secret that contains another is replaced whole.
        self._secrets = tuple(sorted(kept, key=len, reverse=True))
        #: The secrets as UTF-8: a payload not yet decoded holds a secret exactly
        #: when its bytes hold these (UTF-8 never matches inside a character).
        self.encoded = tuple(secret.encode("utf-8", "surrogatepass") for secret in self._secrets)

    def __bool__(self) -> bool:
        return bool(self._secrets)

    def __repr__(self) -> str:
        return f"Redactor({len(self._secrets)} secrets)"  # never the secrets

    def text(self, value: str) -> str:
        """``value`` with every secret replaced."""
        for secret in self._secrets:
            if secret in value:
                value = value.replace(secret, MASK)
        return value

    def optional(self, value: str | None) -> str | None:
        return None if value is None else self.text(value)

    def value(self, value: Any) -> Any:
        """A JSON value (dicts, lists, strings, ...) with every string redacted."""
        if not self._secrets:
            return value
        return self._walk(value)

    def _walk(self, value: Any) -> Any:
        if type(value) is str:
            return self.text(value)
        if type(value) is dict:
            return {self.text(k) if type(k) is str else k: self._walk(v)
                    for k, v in value.items()}
        if type(value) is list:
            return [self._walk(v) for v in value]
        return value

    def headers(self, headers: Mapping[str, str]) -> dict[str, str]:
        """Header names and values with every secret replaced."""
        return {self.text(k): self.text(v) for k, v in headers.items()}
