"""Loading the real captured streams of tests/captures/ (copied from shared/captures)."""

from __future__ import annotations

import itertools
from pathlib import Path

import attrs

CAPTURES = Path(__file__).parent / "captures"


@attrs.frozen
class Capture:
    name: str
    status: int
    content_type: str
    body: bytes
    body_lengths: tuple[int, ...]  # the body's length after each recorded socket read

    @property
    def reads(self) -> list[bytes]:
        """The body cut where the real socket reads ended."""
        points = [0, *(n for n in self.body_lengths if 0 < n <= len(self.body)), len(self.body)]
        return [self.body[a:b] for a, b in itertools.pairwise(points) if b > a]


def load(name: str) -> Capture:
    headers = (CAPTURES / f"{name}.headers.txt").read_text().splitlines()
    status = int(headers[0].split()[1])
    content_type = next(
        (h.split(":", 1)[1].strip() for h in headers if h.lower().startswith("content-type:")), ""
    )
    rows = (CAPTURES / f"{name}.recv.tsv").read_text().splitlines()[1:]
    lengths = tuple(int(row.split("\t")[2]) for row in rows if row.strip())
    return Capture(name, status, content_type, (CAPTURES / f"{name}.body").read_bytes(), lengths)


def names() -> list[str]:
    return sorted(p.name.removesuffix(".body") for p in CAPTURES.glob("*.body"))
