"""The real captured streams shipped in fanout/upstream/captures (from shared/captures)."""

from __future__ import annotations

from fanout.upstream.capture import PACKAGED_CAPTURES, Capture, find_captures

CAPTURES = PACKAGED_CAPTURES


def load(name: str) -> Capture:
    return Capture.load(CAPTURES / f"{name}.body")


def names() -> list[str]:
    return sorted(find_captures([CAPTURES]))


def reads(capture: Capture) -> list[bytes]:
    """The body cut where the real socket reads ended."""
    return [piece for _, piece in capture.pieces()]
