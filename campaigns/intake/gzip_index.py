"""Random reads of a .gz file's uncompressed stream (a .jsonl.gz record file's
rows, campaigns/intake/record_reads.py).

gzip has no random access: a byte at offset X is had by decompressing from
the file's start. A `GzipIndex` keeps, as it decompresses, seek points (the
decompressor's state, copied, with the compressed and uncompressed offsets
it stands at) every `spacing` compressed bytes, and a few cursors where the
last reads stopped. A read starts from the nearest cursor or point at or
before its offset: rows read in file order cost one pass of the file, any
other order at most `spacing` compressed bytes each beyond the first pass to
them (bench/RESULTS.md, "Record import at scale").

Memory: a point is a copy of zlib's state (its 32 KiB window and some 7 KiB
of tables): POINTS_MAX of them per file at most, `spacing` grows with the
file to keep within that. The file is read with `os.pread` on the
descriptor the index was made from, so threads share it without sharing a
file offset, and it is the file that was checked when opened.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import threading
import zlib
from dataclasses import dataclass

#: Seek points kept for one file, at most (some 40 KiB each).
POINTS_MAX = 512
#: Compressed bytes between two points, at least.
SPACING_MIN = 64 << 10
#: Cursors kept for one file.
CURSORS = 4
#: Compressed bytes read at a time; the uncompressed bytes one step makes are
#: bounded too (OUT_MAX), so that a highly compressed stretch is never held.
_CHUNK = 16 << 10
_OUT_MAX = 1 << 20


class GzipError(Exception):
    """The file is not gzip data where it was read."""


@dataclass
class _Point:
    out: int  # uncompressed offset
    cin: int  # compressed offset
    state: object  # zlib decompressor at those offsets (a copy), None at the start


@dataclass
class _Cursor:
    out: int  # uncompressed offset of buf's first byte
    cin: int  # compressed offset of the next byte to feed
    state: object  # its zlib decompressor
    buf: bytes = b""
    pending: bytes = b""  # compressed input fed but not yet decompressed (over _OUT_MAX)
    ended: bool = False

    @property
    def end(self) -> int:
        return self.out + len(self.buf)


def _member():
    return zlib.decompressobj(zlib.MAX_WBITS | 16)


class GzipIndex:
    """Reads of one gzip file by uncompressed offset; thread-safe. It owns `fd`
    (closed by `close`)."""

    def __init__(self, fd: int, compressed_size: int):
        self.fd = fd
        self.spacing = max(SPACING_MIN, compressed_size // POINTS_MAX + 1)
        self.points = [_Point(0, 0, None)]
        self.outs = [0]  # the points' uncompressed offsets, for bisect
        self.cursors: list[_Cursor] = []
        self.lock = threading.Lock()
        self.decompressed = 0  # uncompressed bytes made, over all reads (for benchmarks)

    def close(self) -> None:
        # Closed once: a descriptor number closed twice may by then be another file's.
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __del__(self):
        with contextlib.suppress(OSError, AttributeError, TypeError):
            self.close()

    def read(self, offset: int, length: int) -> bytes:
        """`length` bytes at uncompressed `offset` (fewer at the stream's end);
        GzipError where the data is not gzip."""
        cursor = self._start(offset)
        try:
            while cursor.end < offset + length and not cursor.ended:
                self._step(cursor, keep_from=offset)
            data = cursor.buf[offset - cursor.out : offset - cursor.out + length]
        except zlib.error as exc:
            raise GzipError(f"not gzip data: {exc}") from None
        with self.lock:
            self.cursors.append(cursor)
            if len(self.cursors) > CURSORS:
                self.cursors.remove(min(self.cursors, key=lambda c: c.end))
        return data

    def _start(self, offset: int) -> _Cursor:
        """The cursor (taken out of the list) or a new one from the point
        nearest before `offset`."""
        with self.lock:
            point = self.points[bisect.bisect_right(self.outs, offset) - 1]
            usable = [c for c in self.cursors if c.out <= offset]
            best = max(usable, key=lambda c: c.end, default=None)
            if best is not None and (best.end >= point.out or best.end >= offset):
                self.cursors.remove(best)
                return best
        state = _member() if point.state is None else point.state.copy()  # type: ignore[attr-defined]
        return _Cursor(point.out, point.cin, state)

    def _step(self, cursor: _Cursor, keep_from: int) -> None:
        """Decompress some more; keep of it only what lies at or after `keep_from`."""
        made = []
        if cursor.pending:
            data, cursor.pending = cursor.pending, b""
        else:
            data = os.pread(self.fd, _CHUNK, cursor.cin)
            cursor.cin += len(data)
            if not data:
                cursor.ended = True
                return
        state = cursor.state
        while data:
            if state.eof:  # type: ignore[attr-defined]
                # The next member of a multi-member file, after any zeros
                # padding it (gzip's own reader skips them too, between
                # members as at the end: what the import read).
                data = data.lstrip(b"\x00")
                if not data:
                    break  # zeros to this chunk's end: the next one says what follows
                state = cursor.state = _member()
            out = state.decompress(data, _OUT_MAX)  # type: ignore[attr-defined]
            made.append(out)
            if state.unconsumed_tail:  # type: ignore[attr-defined]
                cursor.pending = state.unconsumed_tail  # type: ignore[attr-defined]
                break
            data = state.unused_data if state.eof else b""  # type: ignore[attr-defined]
        out = b"".join(made)
        self.decompressed += len(out)
        buf = cursor.buf + out if cursor.buf else out
        drop = min(max(keep_from - cursor.out, 0), len(buf))
        cursor.buf, cursor.out = buf[drop:], cursor.out + drop
        if not cursor.pending and not cursor.ended:
            self._mark(cursor)

    def _mark(self, cursor: _Cursor) -> None:
        """A point where the cursor stands, if it is `spacing` past the last one."""
        with self.lock:
            last = self.points[-1]
            if cursor.cin - last.cin < self.spacing or cursor.end <= last.out:
                return
            self.points.append(_Point(cursor.end, cursor.cin, cursor.state.copy()))  # type: ignore[attr-defined]
            self.outs.append(cursor.end)
