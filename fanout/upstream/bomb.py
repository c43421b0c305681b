"""A gzip bomb for ``fault/gzip-bomb``: a few MB on the wire, GiB of SSE once inflated.

Built from one deflate segment: a MiB of identical SSE events compressed once
and ended with a full flush, so it refers to nothing before it and can be
repeated as often as wanted inside a single deflate stream.  The server keeps
only that segment (under 2 KiB) and one CRC per size in memory; the body is
assembled as it is sent.  One gzip member, so every decoder inflates all of it.
"""

from __future__ import annotations

import functools
import struct
import zlib
from collections.abc import Iterator

__all__ = ["EVENT", "MIB", "gzip_bomb", "gzip_bomb_size"]

MIB = 1024 * 1024
_EVENT_SIZE = 4096  # a power of two: a whole number of events in every MiB


def _event(padding: int) -> bytes:
    return (b'data: {"id":"chatcmpl-gzip-bomb","object":"chat.completion.chunk","created":0,'
            b'"model":"fault/gzip-bomb","choices":[{"index":0,"delta":{"content":"'
            + b"x" * padding + b'"},"finish_reason":null}]}\n\n')


EVENT = _event(_EVENT_SIZE - len(_event(0)))  # one valid-looking content chunk, 4 KiB
_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\x03"  # gzip, deflate, no mtime, max, Unix
_END = b"\x03\x00"  # an empty final block (fixed Huffman codes)


@functools.cache
def _segment() -> bytes:
    """A MiB of ``EVENT`` as raw deflate, ending in a full flush (byte-aligned, no history)."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS, 9)
    return compressor.compress(EVENT * (MIB // len(EVENT))) + compressor.flush(zlib.Z_FULL_FLUSH)


@functools.lru_cache(maxsize=8)
def _crc(mib: int) -> int:
    block = EVENT * (MIB // len(EVENT))
    crc = 0
    for _ in range(mib):
        crc = zlib.crc32(block, crc)
    return crc


def gzip_bomb_size(mib: int) -> int:
    """Bytes on the wire for ``mib`` MiB inflated."""
    return len(_HEADER) + mib * len(_segment()) + len(_END) + 8


def gzip_bomb(mib: int, write: int = 64 * 1024) -> Iterator[bytes]:
    """The gzip body that inflates to ``mib`` MiB of ``EVENT``s, in pieces of about ``write``."""
    segment = _segment()
    trailer = struct.pack("<II", _crc(mib), (mib * MIB) & 0xFFFFFFFF)
    per_piece = max(1, write // len(segment))
    yield _HEADER
    left = mib
    while left:
        count = min(per_piece, left)
        yield segment * count
        left -= count
    yield _END + trailer
