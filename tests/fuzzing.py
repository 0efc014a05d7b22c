"""Hypothesis strategies for the fuzzed readers and validators (tests/campaigns/test_fuzz_*.py).

Two kinds of input: arbitrary bytes, and a valid file damaged the ways disks,
writers and people damage files (bytes flipped, cut short, inserted, a header
that declares a huge array over a few bytes of data). The properties are
the same everywhere: only the documented error classes come out, each example
finishes within the profile's deadline (tests/conftest.py), and memory stays
bounded (`bounded`: Python's, numpy's and Pillow's alike).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import io
import tracemalloc
import zipfile
from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import strategies as st
from numpy.lib import format as npy_format

#: What one check of one small file may allocate, and grow the process's
#: resident memory by: well above any valid example here, far below an array
#: a damaged header declares or an image a damaged header claims.
MEMORY_BOUND = 64 * 2**20


def bounded(
    check: Callable[[], Any], allowed: tuple[type[BaseException], ...]
) -> BaseException | None:
    """Run `check`; return the allowed exception it raised (or None), after
    asserting that its memory stayed under MEMORY_BOUND. Any other exception
    propagates, so hypothesis shrinks and reports it.

    Memory, two ways: tracemalloc's peak (Python's and numpy's allocations,
    counted when made, even those never touched) and the peak resident memory
    the process grew by (`ResidentPeak`: every allocator's, Pillow's pixel
    buffers and any C library's, which tracemalloc does not see).
    """
    resident = ResidentPeak()
    tracemalloc.start()
    try:
        check()
        raised = None
    except allowed as exc:
        raised = exc
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        grown = resident.grown()
    assert peak < MEMORY_BOUND, f"traced peak {peak / 2**20:.0f} MiB"
    assert grown < MEMORY_BOUND, f"resident memory grew by {grown / 2**20:.0f} MiB"
    return raised


class ResidentPeak:
    """How far the process's resident memory rose above its level now, at its
    peak: Linux's high-water mark (VmHWM) set back to the current RSS by
    writing 5 to /proc/self/clear_refs, then read. Where it cannot be set
    back, the rise above the process's earlier peak (a check that only
    reaches an earlier test's peak again is not seen there)."""

    def __init__(self) -> None:
        # Memory freed earlier but kept by malloc would be used again without
        # growing: given back first, so the rise is what the check uses.
        if _malloc_trim is not None:
            _malloc_trim(0)
        before = _status()
        self.base = before.get("VmRSS", 0)
        try:
            with open("/proc/self/clear_refs", "w") as fh:
                fh.write("5")
        except OSError:
            self.base = max(self.base, before.get("VmHWM", 0))

    def grown(self) -> int:
        return max(0, _status().get("VmHWM", 0) - self.base)


def _load_malloc_trim():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None  # not glibc


_malloc_trim = _load_malloc_trim()


def _status() -> dict[str, int]:
    """/proc/self/status's memory lines in bytes ({} where there is none)."""
    try:
        with open("/proc/self/status") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return {}
    found = {}
    for line in lines:
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0]) * 1024
    return found


@st.composite
def damaged(draw, good: bytes) -> bytes:
    """`good` with one to four edits: bytes flipped, cut short, bytes inserted or removed."""
    data = bytearray(good)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "truncate", "insert", "delete"]))
        at = draw(st.integers(0, max(0, len(data) - 1)))
        if kind == "flip" and data:
            data[at] ^= draw(st.integers(1, 255))
        elif kind == "truncate":
            del data[at:]
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif data:
            del data[at : at + draw(st.integers(1, 16))]
    return bytes(data)


def npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


#: Shapes a damaged header may declare: empty, negative, huge (10^9 float32
#: is 4 GB, which malloc grants without touching it), beyond int64.
declared_shapes = st.one_of(
    st.tuples(st.integers(-2, 2**70)),
    st.tuples(st.integers(-2, 10**6), st.integers(-2, 10**6)),
    st.sampled_from([(10**9,), (10**12,), (2**40, 2**40), (), (0,), (1, 0), (10**5, 10**5)]),
)
declared_descrs = st.one_of(
    st.sampled_from(["<f4", "<f8", "|u1", "<U40", "<i8", ">f4", "|V8", "|O", "S3"]),
    # dtype strings numpy does not know, or reads as something odd
    st.text(st.sampled_from("<>|=fiuUVSOMmbcg0123456789[]"), max_size=6),
    # structured and sub-array descriptions, well-formed or not
    st.sampled_from(
        [
            [("a", "<f4")],
            [("a", "<f4", (10**9,))],
            [("a", "<f4"), ("a", "<f4")],
            [("", "|O")],
            [(b"a", "<f4")],
            [("a",)],
            [],
            ("<f4", (2,)),
            ("<f4", (2**62,)),
        ]
    ),
)


@st.composite
def npy_declaring(draw) -> bytes:
    """A .npy whose header declares any shape and dtype over a few bytes of data."""
    header = {
        "descr": draw(declared_descrs),
        "fortran_order": draw(st.booleans()),
        "shape": draw(declared_shapes),
    }
    buf = io.BytesIO()
    buf.write(npy_format.magic(1, 0))
    text = repr(header).encode("latin1")
    text += b" " * ((64 - (10 + len(text) + 1) % 64) % 64) + b"\n"
    buf.write(len(text).to_bytes(2, "little"))
    buf.write(text)
    buf.write(draw(st.binary(max_size=64)))
    return buf.getvalue()


#: What a header's text is made of, to edit it into texts numpy may half-read.
_HEADER_PIECES = [
    *(bytes([c]) for c in b"{}()[]',:<>|= 0123456789fuibUOV"),
    b"'descr'",
    b"'shape'",
    b"'fortran_order'",
    b"True",
    b"None",
    b"b'",
    b"1e400",
    b"-1",
    b"\\x00",
]


@st.composite
def npy_header_edited(draw, good: bytes) -> bytes:
    """A version 1.0 `good` .npy with its header's text edited: bytes flipped,
    replaced by header-like pieces, inserted or removed; its length field kept
    (now wrong) or made to match; magic and data as they were."""
    end = 10 + int.from_bytes(good[8:10], "little")
    header = bytearray(good[10:end])
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(header) - 1))
        kind = draw(st.sampled_from(["flip", "replace", "insert", "delete"]))
        if kind == "flip":
            header[at] ^= draw(st.integers(1, 255))
        elif kind == "replace":
            header[at : at + draw(st.integers(1, 8))] = draw(st.sampled_from(_HEADER_PIECES))
        elif kind == "insert":
            header[at:at] = draw(
                st.sampled_from(_HEADER_PIECES) | st.binary(min_size=1, max_size=8)
            )
        elif len(header) > 1:
            del header[at : at + draw(st.integers(1, 8))]
    length = len(header) if draw(st.booleans()) else end - 10
    return good[:8] + length.to_bytes(2, "little") + bytes(header) + good[end:]


def zip_of(members: dict[str, bytes], *, compression: int = zipfile.ZIP_STORED) -> bytes:
    """An .npz-shaped zip of these members (names given whole, '.npy' included)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=compression) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buf.getvalue()
