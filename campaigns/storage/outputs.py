"""Writing outputs atomically and checking them before they count."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import hashlib
import io
import json
import math
import os
import secrets
import struct
import threading
import tokenize
import warnings
import zipfile
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
from numpy.lib import format as npy_format


@dataclass(frozen=True)
class WrittenFile:
    size: int
    sha256: str


def write_atomic(path: Path, data: bytes | Iterable[bytes]) -> WrittenFile:
    """Temp file in the target folder, fsync, os.replace, fsync of the folder.

    A reader (or verify after a crash) sees either no file or the whole file.
    `data` may be an iterable of chunks, so large files stream.
    """
    fd, tmp = _create_temp(path)
    digest, size = hashlib.sha256(), 0
    try:
        with os.fdopen(fd, "wb") as fh:
            for chunk in [data] if isinstance(data, bytes) else data:
                fh.write(chunk)
                digest.update(chunk)
                size += len(chunk)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_folder(path.parent)
    return WrittenFile(size=size, sha256=digest.hexdigest())


def check_read_back(path: Path, data: bytes) -> None:
    """The file at `path` holds exactly `data`, else OSError: the storage lost
    or changed what was written (an output write error, never a valid output)."""
    with open(path, "rb") as fh:
        back = fh.read(len(data) + 1)
    if back != data:
        raise OSError(
            f"{path.name} read back is not what was written ({len(back)} bytes of {len(data)}"
            + (", its bytes differ)" if len(back) == len(data) else ")")
        )


class HashingWriter:
    """A file being written, its size and sha256 taken as its bytes go by.

    It has no fileno(): Pillow's save then hands it the encoder's chunks
    instead of writing to the file descriptor behind it.
    """

    def __init__(self, fh: BinaryIO):
        self._fh, self._digest, self.size = fh, hashlib.sha256(), 0

    def write(self, data) -> int:
        self._fh.write(data)
        self._digest.update(data)
        self.size += len(data)
        return len(data)

    def flush(self) -> None:
        """The file is flushed and synced once whole, by the group."""

    def hexdigest(self) -> str:
        """The sha256 of what was written so far."""
        return self._digest.hexdigest()


class FileReader(io.BufferedReader):
    """A file read back for a check, whose reads ask no more than the bytes
    it has left. A parser reads a chunk of the length a damaged header
    declares (Pillow: up to 2 GiB for a PNG chunk), and read(n) allocates n
    bytes before finding the file shorter; read from memory instead, the
    file's bytes would be held whole beside what they decode to."""

    def __init__(self, raw: io.RawIOBase):
        super().__init__(raw, buffer_size=1 << 16)
        self.size = os.fstat(raw.fileno()).st_size

    def _left(self, size: int | None) -> int | None:
        if size is None or size < 0:
            return size
        return min(size, max(self.size - self.tell(), 0))

    def read(self, size: int | None = -1, /) -> bytes:
        return super().read(self._left(size))

    def read1(self, size: int = -1, /) -> bytes:
        left = self._left(size)
        return super().read1(-1 if left is None else left)


@dataclass(frozen=True)
class Streamed:
    """A file's bytes written as they are made, never held whole: `write(fh)`
    writes them into `fh`, a HashingWriter (an image's encoder writes its
    chunks so, where returning bytes would hold the whole encoded file beside
    the image)."""

    write: Callable[[HashingWriter], None]


#: A file's bytes, or what makes them when the file is written: a batch's
#: outputs are made one at a time as they are written, never all held at once.
Content = bytes | Streamed | Callable[[], bytes | Streamed]


def write_atomic_group(
    files: Iterable[tuple[Path, Content]],
    first: Callable[[list[WrittenFile | OSError]], tuple[Path, bytes]] | None = None,
) -> list[WrittenFile | OSError]:
    """`write_atomic` for a batch's outputs, with one flush to disk for all.

    `first`: a file made from the others' results (a claim's record of what
    it wrote), written and flushed with them and renamed before them; its
    result comes first in the answer.

    Each file goes to a temp file beside its target; then one `syncfs` of
    their filesystem puts every temp file's data on disk; only then is each
    renamed into place, and each folder fsynced once (or, past a few
    folders, the filesystem synced once more). A reader (or verify
    after a crash) still sees no file or the whole file, as with
    `write_atomic`, at one journal commit a batch instead of two a file
    (bench/RESULTS.md, "One flush a batch, a cheaper input check, DEBUG off
    (2026-11-30)"). Where libc has no
    syncfs (not Linux), each temp file is fsynced instead.

    One result per file, in order: its WrittenFile, or the OSError that
    stopped it (no partial file left); the others go on.
    """
    results: list[WrittenFile | OSError] = []
    pending: list[tuple[int, str, Path]] = []  # (index in results, temp, target)
    try:
        return _write_group(files, results, pending, first)
    except BaseException:
        # A time limit or an interrupt mid-group: no temp file stays behind
        # (the renamed ones are whole outputs, adopted on the next run).
        for _, tmp, _ in pending:
            Path(tmp).unlink(missing_ok=True)
        raise


def _write_group(files, results: list, pending: list, first=None) -> list[WrittenFile | OSError]:
    _write_temps(files, results, pending)
    if first is not None:
        made = len(results)
        _write_temps([first(list(results))], results, pending)
        # Its rename goes first, its result too.
        results.insert(0, results.pop())
        pending[:] = [(0, tmp, path) for i, tmp, path in pending if i == made] + [
            (i + 1, tmp, path) for i, tmp, path in pending if i != made
        ]
    return _replace_group(results, pending)


def _write_temps(files, results: list, pending: list) -> None:
    """Each file to a temp file beside its target; its bytes made (when a
    callable) just before, and let go of once written."""
    for path, content in files:
        tmp = None
        try:
            data = content() if callable(content) else content
            fd, tmp = _create_temp(path)
            with os.fdopen(fd, "wb") as fh:
                if isinstance(data, Streamed):
                    sink = HashingWriter(fh)
                    data.write(sink)
                    written = WrittenFile(size=sink.size, sha256=sink.hexdigest())
                else:
                    fh.write(data)
                    written = WrittenFile(size=len(data), sha256=hashlib.sha256(data).hexdigest())
                if _syncfs is None:
                    fh.flush()
                    os.fsync(fh.fileno())
        except BaseException as exc:
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)
            if not isinstance(exc, OSError):
                raise
            results.append(exc)
            continue
        finally:
            data = None  # let go of before the next file is made
        pending.append((len(results), tmp, path))
        results.append(written)


def _replace_group(results: list, pending: list) -> list[WrittenFile | OSError]:
    """One flush for every temp file, then each renamed into place."""
    folders = {path.parent for _, _, path in pending}
    if _syncfs is not None and pending:
        try:
            _sync_filesystems(folders)
        except OSError as exc:
            # Nothing renamed yet: no output of this batch counts.
            for index, tmp, _ in pending:
                Path(tmp).unlink(missing_ok=True)
                results[index] = exc
            return results
    for index, tmp, path in pending:
        try:
            os.replace(tmp, path)
        except OSError as exc:
            Path(tmp).unlink(missing_ok=True)
            results[index] = exc
    if _syncfs is not None and len(folders) > FSYNC_FOLDERS_UP_TO:
        # A batch spread over many shard folders: one more syncfs puts every
        # rename on disk, where an fsync a folder would cost a call each.
        try:
            _sync_filesystems(folders)
        except OSError as exc:
            for index, _, _ in pending:
                results[index] = exc
        return results
    for folder in folders:
        try:
            _fsync_folder(folder)
        except OSError as exc:
            for index, _, path in pending:
                if path.parent == folder:
                    results[index] = exc
    return results


#: Up to this many folders a group's renames are made durable by an fsync of
#: each folder, beyond it by one syncfs (bench/orchestration.py).
FSYNC_FOLDERS_UP_TO = 4


def _load_syncfs():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.syncfs
    except (OSError, AttributeError):
        return None


_syncfs = _load_syncfs()


def _sync_filesystems(folders: Iterable[Path]) -> None:
    """One syncfs per filesystem the folders are on."""
    done: set[int] = set()
    for folder in folders:
        fd = os.open(folder, os.O_RDONLY)
        try:
            device = os.fstat(fd).st_dev
            if device not in done:
                done.add(device)
                if _syncfs(fd) != 0:
                    errno = ctypes.get_errno()
                    raise OSError(errno, f"syncfs: {os.strerror(errno)}")
        finally:
            os.close(fd)


def _fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)


def _create_temp(path: Path) -> tuple[int, str]:
    """A new file beside `path` that no other writer has (O_EXCL, a random name);
    the folder is made when it is missing. Mode 0666 less the umask, as any
    file the user makes (0644 under 022): mkstemp's 0600 would keep
    `campaign verify`, a reviewer's download or a backup run as another user
    of the group from reading the outputs.

    Cheaper than mkstemp plus a mkdir each time: a worker writes thousands of
    small outputs a minute (bench/RESULTS.md, "The ceiling in every row, four
    small cuts (2026-11-30)").
    """
    tmp = f"{path.parent}/.{path.name}.{secrets.token_hex(6)}.tmp"
    try:
        return os.open(tmp, _TEMP_FLAGS, 0o666), tmp
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(tmp, _TEMP_FLAGS, 0o666), tmp


def vector_to_npy(vector: np.ndarray) -> bytes:
    """The bytes np.save writes for a float32 array; a vector's from its cached header."""
    array = np.asarray(vector, dtype="<f4")
    if array.ndim == 1:
        return _npy_header(len(array)) + array.tobytes()
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
    return buf.getvalue()


# What is wrong with an output that fails its check, for the review queue
# (values of campaigns.review.flags.FlagReason; this module stays free of Django).
NON_FINITE = "non_finite"
WRONG_OUTPUT = "wrong_output"
OUTPUT_INVALID = "output_invalid"


class InvalidOutput(Exception):
    """The file exists but is not a usable result.

    `reason` names the defect: NaN or Inf values, dimensions or format not as
    asked, or anything else (a plugin's check raises the default).
    """

    def __init__(self, message: str, reason: str = OUTPUT_INVALID):
        super().__init__(message)
        self.reason = reason


# numpy parses .npy headers with ast.literal_eval, and CPython 3.11 before
# 3.11.9 can fail that with "AST constructor recursion depth mismatch" when
# threads parse at once (gh-106905): the worker checks outputs in a thread pool.
_NPY_PARSE = threading.Lock()

# What numpy, zipfile and zlib raise on damaged bytes. After the file is open,
# an OSError is one too (zipfile seeks where a damaged directory points);
# TypeError, KeyError and IndexError are what they raise where a damaged
# structure holds a value of the wrong kind.
_DAMAGED = (
    ValueError,
    TypeError,
    KeyError,
    IndexError,
    SyntaxError,
    tokenize.TokenError,
    EOFError,
    OverflowError,
    struct.error,
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    zlib.error,
    NotImplementedError,
    RuntimeError,
    OSError,
)
#: The longest .npy header numpy reads (its max_header_size, with magic and length).
_NPY_HEADER_MAX = 10_000 + 16
#: Deflate's largest possible ratio: an archive member declaring more
#: uncompressed bytes than this times its compressed ones is lying.
_DEFLATE_MAX_RATIO = 1032


def load_npy_or_npz(source) -> np.ndarray | dict[str, np.ndarray]:
    """The array of an .npy, or the arrays of an .npz by name (`source`: a path
    or a binary file object).

    InvalidOutput when the bytes are not that: damaged, pickled, a member that
    is no .npy, an archive compressed otherwise than numpy writes, or a header
    declaring more data than the file holds, refused before anything of that
    size is allocated (memory stays within the file's size, an .npz's declared
    one). OSError only when the file cannot be opened.
    """
    fh = open(source, "rb") if isinstance(source, str | os.PathLike) else source  # noqa: SIM115
    try:
        head = fh.read(4)
        fh.seek(0)
        if head in (b"PK\x03\x04", b"PK\x05\x06"):
            return _read_npz(fh)
        return _read_npy(fh, _size_of(fh))
    except InvalidOutput:
        raise
    except _DAMAGED as exc:
        raise InvalidOutput(f"not a readable .npy/.npz file: {exc}") from exc
    finally:
        if fh is not source:
            fh.close()


def _size_of(fh) -> int:
    size = fh.seek(0, os.SEEK_END)
    fh.seek(0)
    return size


def load_npz(source) -> dict[str, np.ndarray]:
    """The arrays of an .npz by name (a classification's output), as
    load_npy_or_npz reads them; InvalidOutput for a bare .npy too."""
    arrays = load_npy_or_npz(source)
    if not isinstance(arrays, dict):
        raise InvalidOutput("an .npy array where an .npz archive of named arrays belongs")
    return arrays


def _read_npz(fh) -> dict[str, np.ndarray]:
    arrays = {}
    size = _size_of(fh)
    with zipfile.ZipFile(fh) as archive:
        for info in archive.infolist():
            if info.compress_size > size:
                raise InvalidOutput(
                    f"archive member {info.filename!r} declares {info.compress_size} bytes "
                    f"in a file of {size}"
                )
            if info.flag_bits & 0x1:
                raise InvalidOutput(f"archive member {info.filename!r} is encrypted")
            if info.compress_type == zipfile.ZIP_STORED:
                ceiling = info.compress_size
            elif info.compress_type == zipfile.ZIP_DEFLATED:
                ceiling = info.compress_size * _DEFLATE_MAX_RATIO
            else:
                raise InvalidOutput(f"archive member {info.filename!r}: unknown compression")
            if info.file_size > ceiling:
                raise InvalidOutput(
                    f"archive member {info.filename!r} declares {info.file_size} bytes "
                    f"from {info.compress_size}"
                )
            with archive.open(info) as member:
                arrays[info.filename.removesuffix(".npy")] = _read_npy(member, info.file_size)
    return arrays


def _read_npy(fh, size: int) -> np.ndarray:
    """One .npy from `fh`, at most `size` bytes long: its data is read only once
    the header's shape and dtype fit in what is there."""
    shape, fortran, dtype = read_npy_header(fh)
    if dtype.hasobject:
        raise InvalidOutput(f"array of Python objects ({dtype}), not data")
    if any(n < 0 for n in shape):
        raise InvalidOutput(f"array of shape {shape}")
    count = math.prod(shape)
    need = count * dtype.itemsize
    available = size - fh.tell()
    if need > available or (dtype.itemsize == 0 and count > available):
        raise InvalidOutput(
            f"header declares {shape} {dtype}, {need} bytes; the file holds {available}"
        )
    data = bytearray(need)
    if fh.readinto(data) != need:
        raise InvalidOutput(f"data cut short: {shape} {dtype} needs {need} bytes")
    if fortran:
        return np.frombuffer(data, dtype=dtype, count=count).reshape(shape[::-1]).transpose()
    return np.frombuffer(data, dtype=dtype, count=count).reshape(shape)


def read_npy_header(fh) -> tuple[tuple[int, ...], bool, np.dtype]:
    """(shape, fortran order, dtype) of the .npy at `fh`, which is left at its
    data; InvalidOutput when it has none numpy wrote."""
    try:
        with _NPY_PARSE, warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # a header from Python 2
            # A damaged header's text may hold what Python's parser warns of
            # ("invalid escape sequence"): the InvalidOutput below says it all.
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", SyntaxWarning)
            version = npy_format.read_magic(fh)
            if version == (1, 0):
                header = npy_format.read_array_header_1_0(fh)
            elif version == (2, 0):
                header = npy_format.read_array_header_2_0(fh)
            else:
                raise InvalidOutput(f"unsupported .npy version {version}")
    except InvalidOutput:
        raise
    except Exception as exc:
        # The header is a Python literal that numpy evaluates and then checks
        # in part: what a damaged one makes it raise is numpy's to choose (a
        # bytes key fails its sort with TypeError), and every such error
        # means the same thing here.
        raise InvalidOutput(f"not a .npy file: {exc}") from exc
    shape = header[0]
    # numpy takes True for an int; no array numpy writes has such a shape.
    if not all(type(n) is int for n in shape):
        raise InvalidOutput(f"not a .npy file: shape is not valid: {shape!r:.80}")
    return header


def validate_embedding_file(path: Path, *, dimension: int, normalized: bool) -> np.ndarray:
    """Load an embedding .npy and check shape, finiteness and (if asked) unit norm."""
    # No .npy of one vector is longer: its header is at most numpy's header
    # limit, so a larger file is refused without being read whole.
    longest = dimension * 4 + _NPY_HEADER_MAX
    try:
        with open(path, "rb") as fh:
            # read(n) allocates n bytes up front: no more than the file holds.
            data = fh.read(min(os.fstat(fh.fileno()).st_size, longest) + 1)
    except OSError as exc:
        raise InvalidOutput(f"not a readable .npy file: {exc}") from exc
    if len(data) > longest:
        raise InvalidOutput(f"over {longest} bytes, more than one vector", WRONG_OUTPUT)
    header = _npy_header(dimension)
    if data.startswith(header) and len(data) == len(header) + dimension * 4:
        # The exact header np.save writes: no parsing needed.
        vector = np.frombuffer(data, dtype="<f4", offset=len(header))
    else:
        loaded = load_npy_or_npz(io.BytesIO(data))
        if not isinstance(loaded, np.ndarray):
            raise InvalidOutput("an .npz archive, expected one .npy vector")
        vector = loaded
    if vector.shape != (dimension,):
        raise InvalidOutput(f"shape {vector.shape}, expected ({dimension},)", WRONG_OUTPUT)
    if vector.dtype != np.float32:
        raise InvalidOutput(f"dtype {vector.dtype}, expected float32", WRONG_OUTPUT)
    problem = check_vector_rows(vector[np.newaxis, :], dimension=dimension, normalized=normalized)
    if problem[0] is not None:
        raise problem[0]
    return vector


def check_vector_rows(
    vectors: np.ndarray, *, dimension: int, normalized: bool
) -> list[InvalidOutput | None]:
    """Each row's defect (dimension not as asked, NaN or Inf, a norm off 1
    where L2 was asked), or None: the one rule for embedding vectors, a file's
    (validate_embedding_file) or a shard's rows (campaigns/storage/vector_shards.py)."""
    if vectors.ndim != 2 or vectors.shape[1] != dimension:
        wrong = InvalidOutput(f"vectors {vectors.shape}, expected (n, {dimension})", WRONG_OUTPUT)
        return [wrong] * len(vectors)
    finite = np.isfinite(vectors).all(axis=1)
    # A damaged vector's huge values square past float32: its norm is inf,
    # which the check below names, so numpy's overflow warning says nothing more.
    with np.errstate(over="ignore"):
        norms = np.linalg.norm(np.where(np.isfinite(vectors), vectors, 0), axis=1)
    problems: list[InvalidOutput | None] = []
    for ok, norm in zip(finite.tolist(), norms.tolist(), strict=True):
        if not ok:
            problems.append(InvalidOutput("vector holds NaN or Inf", NON_FINITE))
        elif normalized and abs(norm - 1.0) > 1e-3:
            problems.append(InvalidOutput(f"norm {norm:.6f}, expected 1 after L2 normalisation"))
        else:
            problems.append(None)
    return problems


def check_npy_header(path: Path, *, expected_size: int | None, dimension: int) -> None:
    """The cheap check verify runs on every output: size and .npy header, no data read.

    Raises FileNotFoundError when the file is gone, InvalidOutput when it is
    there but not whole or not the expected array.
    """
    size = os.stat(path).st_size
    if expected_size is not None and size != expected_size:
        raise InvalidOutput(f"size {size} bytes, recorded {expected_size}")
    expected = _npy_header(dimension)
    with open(path, "rb") as fh:
        # Fast path: the exact header np.save writes for this array; parsing
        # it (ast.literal_eval) would be most of verify's time.
        if fh.read(len(expected)) == expected and size == len(expected) + dimension * 4:
            return
        fh.seek(0)
        shape, _fortran, dtype = read_npy_header(fh)
        header_end = fh.tell()
    if shape != (dimension,) or dtype != np.float32:
        raise InvalidOutput(f"array {shape} {dtype}, expected ({dimension},) float32", WRONG_OUTPUT)
    if size != header_end + dimension * 4:
        raise InvalidOutput(f"size {size} bytes, a whole vector needs {header_end + dimension * 4}")


@functools.cache
def _npy_header(dimension: int) -> bytes:
    buf = io.BytesIO()
    npy_format.write_array_header_1_0(
        buf, {"descr": "<f4", "fortran_order": False, "shape": (dimension,)}
    )
    return buf.getvalue()


def file_sha256(path: Path | str) -> str:
    """Streamed, so a large file is never read whole into memory."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def is_temp_file(name: str) -> bool:
    """Temp files write_atomic creates: '.<name>.<random>.tmp'."""
    return name.startswith(".") and name.endswith(".tmp")


def read_json_output(path: Path, longest: int, what: str) -> object:
    """A JSON output file parsed, read no further than `longest` bytes (an
    output of these parameters is never longer); InvalidOutput otherwise."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(longest + 1)
    except OSError as exc:
        raise InvalidOutput(f"unreadable: {exc}") from exc
    if len(data) > longest:
        raise InvalidOutput(f"over {longest} bytes, longer than any {what} of these parameters")
    try:
        return json.loads(data.decode("utf-8"))
    except ValueError as exc:
        raise InvalidOutput(f"not JSON: {exc}", WRONG_OUTPUT) from None


def check_json_output_head(path: Path, expected_size: int | None) -> None:
    """verify's quick check of a JSON output: its recorded size, and an object's first byte."""
    size = path.stat().st_size
    if expected_size is not None and size != expected_size:
        raise InvalidOutput(f"size {size} bytes, recorded {expected_size}")
    with open(path, "rb") as fh:
        if fh.read(1) != b"{":
            raise InvalidOutput("not a JSON object", WRONG_OUTPUT)
