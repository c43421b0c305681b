"""``open_shared_limits``: the shared limit a spec names (apart from ``base``, which the
implementations import)."""

from __future__ import annotations

import urllib.parse

from .base import DEFAULT_LEASE, RAY_SCHEME, SharedLimits, shown_spec, spec_problem, split_spec

__all__ = ["open_shared_limits"]


def open_shared_limits(spec: str) -> SharedLimits:
    """The shared limit ``spec`` names (see ``spec_problem``; ``ValueError`` if it names
    none, ``ImportError`` when its client library is not installed).  Nothing is
    connected yet: ``check()`` does."""
    problem = spec_problem(spec)
    if problem is not None or spec == "off":
        raise ValueError(f"{shown_spec(spec)}: {problem or 'names no shared limit'}")
    parts, query = split_spec(spec)
    lease = float(query.pop("lease", [str(DEFAULT_LEASE)])[-1])
    if parts.scheme == RAY_SCHEME:
        from .ray import RayLimits

        return RayLimits(name=(parts.netloc + parts.path).strip("/") or None, lease=lease)
    from .redis import RedisLimits

    rest = urllib.parse.urlencode(query, doseq=True)
    return RedisLimits(urllib.parse.urlunsplit(parts._replace(query=rest)), lease=lease,
                       shown=shown_spec(spec))
