"""Recorded response bodies with their read timing, for replay.

Two formats are read:

- the shared capture format: ``NAME.body`` (the body, chunked framing
  removed), ``NAME.headers.txt`` (status line and headers) and
  ``NAME.recv.tsv`` (per socket read: ms since the request, bytes read, body
  length after it);
- fanout's own ``NAME.capture.json``: one JSON object with
  ``"format": "fanout-capture/1"``, ``status``, ``headers`` (pairs), the body
  in ``body_base64`` and ``reads``: ``[ms since the request, body length after
  the read]`` pairs.  ``Capture.dump`` writes it.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from pathlib import Path

import attrs

from ..files import replace_whole

__all__ = ["PACKAGED_CAPTURES", "Capture", "find_captures"]

FORMAT = "fanout-capture/1"
PACKAGED_CAPTURES = Path(__file__).parent / "captures"


class CaptureError(ValueError):
    """A capture file is missing a part or has a malformed field."""


@attrs.frozen
class Capture:
    """One recorded response: status, headers, body and where the reads ended."""

    name: str
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    reads: tuple[tuple[float, int], ...] = ()  # (ms since the request, body length after)

    @property
    def content_type(self) -> str:
        return next((v for k, v in self.headers if k.lower() == "content-type"), "")

    def pieces(self) -> list[tuple[float, bytes]]:
        """The body as it was read: (ms since the request, bytes) per read."""
        out: list[tuple[float, bytes]] = []
        start = 0
        for at_ms, end in self.reads:
            end = min(end, len(self.body))
            if end > start:
                out.append((at_ms, self.body[start:end]))
                start = end
        if start < len(self.body):
            out.append((self.reads[-1][0] if self.reads else 0.0, self.body[start:]))
        return out

    def dump(self, path: Path) -> None:
        """Write this capture in fanout's own format (whole or not at all, never through
        a link: ``fanout.files.replace_whole``)."""
        replace_whole(path, json.dumps({
            "format": FORMAT,
            "name": self.name,
            "status": self.status,
            "headers": [list(h) for h in self.headers],
            "body_base64": base64.b64encode(self.body).decode(),
            "reads": [list(r) for r in self.reads],
        }, indent=1).encode())

    @classmethod
    def load(cls, path: Path) -> Capture:
        """Load ``NAME.capture.json``, or the shared format from ``NAME.body``."""
        if path.name.endswith(".capture.json"):
            return cls._load_json(path)
        if path.suffix == ".body":
            return cls._load_shared(path)
        raise CaptureError(f"{path}: not a capture (expected NAME.body or NAME.capture.json)")

    @classmethod
    def _load_json(cls, path: Path) -> Capture:
        try:
            data = json.loads(path.read_text())
            if data.get("format") != FORMAT:
                raise CaptureError(f"{path}: field 'format' is {data.get('format')!r}, "
                                   f"expected {FORMAT!r}")
            return cls(
                name=str(data.get("name") or path.name.removesuffix(".capture.json")),
                status=int(data["status"]),
                headers=tuple((str(k), str(v)) for k, v in data.get("headers", [])),
                body=base64.b64decode(data["body_base64"], validate=True),
                reads=tuple((float(t), int(n)) for t, n in data.get("reads", [])),
            )
        except CaptureError:
            raise
        except KeyError as exc:
            raise CaptureError(f"{path}: missing field {exc.args[0]!r}") from None
        except (ValueError, TypeError) as exc:
            raise CaptureError(f"{path}: {exc}") from None

    @classmethod
    def _load_shared(cls, path: Path) -> Capture:
        stem = path.name.removesuffix(".body")
        headers_path = path.with_name(f"{stem}.headers.txt")
        try:
            lines = headers_path.read_text().splitlines()
        except FileNotFoundError:
            raise CaptureError(f"{headers_path}: missing (every NAME.body needs one)") from None
        try:
            status = int(lines[0].split()[1])
        except (IndexError, ValueError):
            raise CaptureError(f"{headers_path}: first line is not a status line") from None
        headers = tuple(
            (name.strip(), value.strip())
            for name, sep, value in (line.partition(":") for line in lines[1:])
            if sep and name.lower() not in ("transfer-encoding", "content-length", "connection")
        )
        reads: list[tuple[float, int]] = []
        recv_path = path.with_name(f"{stem}.recv.tsv")
        if recv_path.exists():
            for number, row in enumerate(recv_path.read_text().splitlines()[1:], start=2):
                if not row.strip():
                    continue
                try:
                    at_ms, _, body_length = row.split("\t")
                    reads.append((float(at_ms), int(body_length)))
                except ValueError:
                    raise CaptureError(f"{recv_path}:{number}: expected 3 tab-separated "
                                       "numbers") from None
        return cls(stem, status, headers, path.read_bytes(), tuple(reads))


def find_captures(directories: Sequence[Path]) -> dict[str, Path]:
    """Every capture in ``directories`` by name (a later directory wins on a clash)."""
    found: dict[str, Path] = {}
    for directory in directories:
        for path in sorted(directory.glob("*.body")):
            found[path.name.removesuffix(".body")] = path
        for path in sorted(directory.glob("*.capture.json")):
            found[path.name.removesuffix(".capture.json")] = path
    return found
