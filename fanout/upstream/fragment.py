"""How the upstream cuts the body into writes: the client's read boundaries.

Modes (``X-Fanout-Fragment`` header, ``@mode`` model suffix, or server-wide):

- ``whole`` (also ``auto``, the default): what is due is written together
  (up to 64 KiB), as a server's socket buffer would: at cadence 0 a whole
  response in one write, at a cadence one write per event while the server
  keeps up, several events a write when it falls behind;
- ``event``: one write per event;
- ``random:SEED``: every event cut at 1-3 random points, reproducibly;
- ``byte``: one byte per write;
- ``evil``: line ends sent as CRLF, every CRLF split between its CR and LF
  and every multibyte character split after its first byte.
"""

from __future__ import annotations

import random
from itertools import pairwise

__all__ = ["MODES", "Fragmenter", "split_evil"]

MODES = ("auto", "whole", "event", "random", "byte", "evil")
COALESCE_LIMIT = 64 * 1024


class Fragmenter:
    """Cuts one response's ``Send`` steps into writes."""

    def __init__(self, mode: str) -> None:
        name, _, seed = mode.partition(":")
        if name not in MODES:
            raise ValueError(f"unknown fragment mode {mode!r}; one of: {', '.join(MODES)}")
        if name == "auto":
            name = "whole"
        self.mode = name
        self.coalesce = name == "whole"
        self._rng = random.Random(seed or "0") if name == "random" else None

    def split(self, data: bytes) -> list[bytes]:
        """The writes for one ``Send`` (``whole`` is coalesced by the server instead)."""
        if self.mode in ("whole", "event") or not data:
            return [data]
        if self.mode == "byte":
            return [data[i : i + 1] for i in range(len(data))]
        if self.mode == "evil":
            return split_evil(data)
        assert self._rng is not None
        cuts = sorted({self._rng.randint(1, max(1, len(data) - 1))
                       for _ in range(self._rng.randint(1, 3))})
        points = [0, *cuts, len(data)]
        return [data[a:b] for a, b in pairwise(points) if b > a]


def split_evil(data: bytes) -> list[bytes]:
    """LF line ends become CRLF; cut between each CR and LF and inside each multibyte character."""
    data = data.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")
    cuts = []
    for i, byte in enumerate(data):
        if byte == 0x0A and i and data[i - 1] == 0x0D:
            cuts.append(i)
        elif byte >= 0xC0 and i + 1 < len(data):  # a multibyte lead byte: cut after it
            cuts.append(i + 1)
    points = [0, *cuts, len(data)]
    return [data[a:b] for a, b in pairwise(points) if b > a]
