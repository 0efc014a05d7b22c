"""Reading a unit's input and classifying what is wrong with it.

Every reader of a unit's input (planning's costs, the setup page's check, the
previews, the profiler, the worker) goes through `read_bytes`, under the
`ReadLimits` of its processor and parameters: a text is read only as far as
the model can use, the rest of the file counted (and hashed where the worker
checks its input) but never held; an input over `max_input_bytes` is refused
before it is read. Verify opens inputs through `input_fd`, by the rules
`read_bytes` reads them (a regular file whose real path is in the corpus), and
hashes them with `sha256_of`, never past the size they had when opened.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from campaigns.intake.rows import special_kind
from campaigns.models import ErrorClass
from campaigns.storage.paths import input_relpath, resolve_input


class InputError(Exception):
    def __init__(self, error_class: str, message: str):
        super().__init__(message)
        self.error_class = error_class
        self.message = message


@dataclass(frozen=True)
class ReadLimits:
    """How much of an input is read.

    `keep`: bytes held in memory at most (None: the whole file); the rest is
    counted, not loaded. `max_bytes`: a larger input fails `input_invalid`
    with its size, before it is read (a processor's `max_input_bytes`; None:
    no limit). `digest`: the whole file's sha256 is taken while reading, the
    part not kept streamed through it (the worker compares it with the
    import's); without it a cut read stops at `keep`.
    """

    keep: int | None = None
    max_bytes: int | None = None
    digest: bool = False


WHOLE = ReadLimits()
_CHUNK = 1 << 20


class InputBytes(bytes):
    """An input's bytes as read: all of them, or its first `ReadLimits.keep`.

    `size`: the whole file's size; `cut`: whether bytes were left unread (or
    only counted). `sha256`: the whole file's digest (None for a cut read
    made without `digest`).
    """

    size: int
    _sha256: str | None
    # Where read_bytes read it: (root, source_path, real_root, limits).
    _where: tuple[Path, str, str | None, ReadLimits] | None = None

    @property
    def cut(self) -> bool:
        return self.size > len(self)

    @property
    def name(self) -> str:
        """Its source path as the unit names it ("" for bytes read_bytes did not read)."""
        return self._where[1] if self._where is not None else ""

    @property
    def source(self) -> InputSource | None:
        """What reads these bytes again later, in place of holding them (None
        for bytes read_bytes did not read, or a cut read without its digest)."""
        if self._where is None or self.sha256 is None:
            return None
        return InputSource(*self._where, sha256=self.sha256)

    @property
    def sha256(self) -> str | None:
        if self._sha256 is None and not self.cut:
            self._sha256 = hashlib.sha256(self).hexdigest()
        return self._sha256


@dataclass(frozen=True)
class InputSource:
    """An input's place and the sha256 of the bytes first read from it: a
    processor keeps this instead of a large input's bytes between its
    reading and its output (gpuworker/processors/image_transform.py)."""

    root: Path
    source_path: str
    real_root: str | None
    limits: ReadLimits
    sha256: str

    def read(self) -> InputBytes:
        """The input read again through `read_bytes` (the same checks of its
        place and size); InputError input_changed when its bytes are not
        those first read any more."""
        data = read_bytes(self.root, self.source_path, self.real_root, self.limits)
        if data.sha256 != self.sha256:
            raise InputError(
                ErrorClass.INPUT_CHANGED,
                "input changed while its batch ran (sha256 differs from the bytes first read); "
                "resume --retry-failed processes the new content",
            )
        return data


def _input_bytes(data: bytes, size: int, sha256: str | None = None) -> InputBytes:
    made = InputBytes(data)
    made.size, made._sha256 = max(size, len(data)), sha256
    return made


def read_bytes(
    root: Path,
    source_path: str,
    real_root: str | None = None,
    limits: ReadLimits = WHOLE,
) -> InputBytes:
    """A unit's input, opened as `open_input` opens it and read only as far as
    `limits` say; anything else is a classified InputError.

    `real_root`, from `corpus_real_path(root)`, saves finding the root's real
    path again for each of many inputs read at once (a batch's). A record
    unit's source path names a row of a record file (intake/records.py): its
    text is read from there. The answer's `source` reads it again, the same way.
    """
    data = _read(root, source_path, real_root, limits)
    data._where = (root, source_path, real_root, limits)
    return data


def _read(root: Path, source_path: str, real_root: str | None, limits: ReadLimits) -> InputBytes:
    if "#" in source_path:
        from campaigns.intake import record_reads, records

        located = records.parse_locator(source_path)
        if located is not None:
            return record_reads.read_record(root, located, limits)
    with open_input(root, source_path, real_root) as fh:
        try:
            return _read_limited(fh, limits)
        except OSError as exc:  # an I/O error in the middle of the file
            raise InputError(
                ErrorClass.INPUT_UNREADABLE, f"cannot read input: {exc.strerror or exc}"
            ) from None


def open_input(root: Path, source_path: str, real_root: str | None = None) -> BinaryIO:
    """`input_fd`'s file, as a binary file object the caller closes."""
    return os.fdopen(input_fd(root, source_path, real_root), "rb")


def input_fd(root: Path, source_path: str, real_root: str | None = None) -> int:
    """A unit's input opened for reading, by the rules every reader of inputs
    keeps (the worker's, verify's): only if its real path is inside the corpus
    root (no `..` or symlink out of it) and it is a regular file. It is opened
    without blocking, so a FIFO, a device or a socket in an input's place is
    refused, never waited on or read forever; anything wrong is a classified
    InputError. The caller closes the descriptor; `os.fstat` of it gives the
    size and mtime of the very file opened."""
    if _PROC_FD:
        try:
            return _open_checked_by_fd(root, source_path, real_root)
        except (OSError, ValueError):
            # Missing, unreadable, a NUL in the path: classified the slow way.
            pass
    return _open_resolved(root, source_path)


def sha256_of(fd: int, size: int) -> str:
    """The sha256 of an open input, reading at most `size` + 1 bytes (its size
    when opened): a file that grows meanwhile hashes as changed, and is not
    read to an end that may never come."""
    digest = hashlib.sha256()
    left = size + 1
    while left > 0 and (chunk := os.read(fd, min(_CHUNK, left))):
        digest.update(chunk)
        left -= len(chunk)
    return digest.hexdigest()


def read_path(path: Path, limits: ReadLimits = WHOLE) -> InputBytes:
    """A file already resolved (a spec's `cost(path, params)`), read as
    `read_bytes` reads an input; OSError as open() raises it."""
    with open(path, "rb") as fh:
        return _read_limited(fh, limits)


def _read_limited(fh: BinaryIO, limits: ReadLimits) -> InputBytes:
    size = os.fstat(fh.fileno()).st_size
    _refuse_over(size, limits)
    if limits.keep is None:
        # read(n) allocates n bytes up front, so it asks for what fstat says
        # the file holds; one byte past the cap at most, so a file that grows
        # (or a size fstat does not know) cannot make the read unbounded.
        cap = size if limits.max_bytes is None else min(size, limits.max_bytes)
        whole = fh.read(cap + 1)
        if len(whole) > cap:
            rest = None if limits.max_bytes is None else limits.max_bytes + 1 - len(whole)
            whole += fh.read() if rest is None else fh.read(max(rest, 0))
        _refuse_over(len(whole), limits)
        return _input_bytes(whole, len(whole))
    data = fh.read(limits.keep)
    if len(data) < limits.keep or not (more := fh.read(1)):
        return _input_bytes(data, len(data))  # the whole file
    if not limits.digest:
        return _input_bytes(data, max(size, len(data) + 1))
    digest = hashlib.sha256(data)
    digest.update(more)
    total = len(data) + 1
    while chunk := fh.read(_CHUNK):
        digest.update(chunk)
        total += len(chunk)
        _refuse_over(total, limits)
    return _input_bytes(data, total, digest.hexdigest())


def _refuse_over(size: int, limits: ReadLimits) -> None:
    if limits.max_bytes is not None and size > limits.max_bytes:
        raise InputError(
            ErrorClass.INPUT_INVALID,
            f"input of {size:,} bytes, over max_input_bytes {limits.max_bytes:,}",
        )


# Linux names each open file's real path under /proc/self/fd: one readlink of
# the opened file checks where it is, where Path.resolve() stats every folder
# of the path (a large share of a worker's time outside the model: bench/RESULTS.md,
# "One flush a batch, a cheaper input check, DEBUG off (2026-11-30)"), and it
# checks the very file that is read.
_PROC_FD = os.path.isdir("/proc/self/fd")


def _real_path(path: str, flags: int = 0) -> tuple[int, str]:
    # Opened before its place is checked: O_NONBLOCK so that a FIFO (say, a
    # symlink out of the corpus to one) cannot hang the worker on open, and
    # O_NOCTTY so that no terminal becomes ours. Regular files read as usual.
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY | flags)
    try:
        return fd, os.readlink(f"/proc/self/fd/{fd}")
    except BaseException:
        os.close(fd)
        raise


def corpus_real_path(root: Path) -> str | None:
    """The corpus folder's real path, for read_bytes; None where it cannot be had
    (read_bytes then classifies each input's problem itself)."""
    if not _PROC_FD:
        return None
    try:
        root_fd, real_root = _real_path(str(root), os.O_DIRECTORY)
    except (OSError, ValueError):
        return None
    os.close(root_fd)
    return real_root


def _open_checked_by_fd(root: Path, source_path: str, real_root: str | None) -> int:
    if real_root is None:
        root_fd, real_root = _real_path(str(root), os.O_DIRECTORY)
        os.close(root_fd)
    fd, real = _real_path(os.path.join(root, input_relpath(source_path)))
    try:
        if real != real_root and not real.startswith(real_root.rstrip("/") + "/"):
            raise InputError(
                ErrorClass.INPUT_INVALID,
                f"path {source_path!r} leaves the corpus folder {real_root}",
            )
        _refuse_other_than_file(os.fstat(fd).st_mode, source_path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_resolved(root: Path, source_path: str) -> int:
    try:
        path = resolve_input(root, source_path)
    except ValueError as exc:
        raise InputError(ErrorClass.INPUT_INVALID, str(exc)) from None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    except FileNotFoundError:
        raise InputError(ErrorClass.INPUT_MISSING, f"input file not found: {source_path}") from None
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a socket: what it is says more than "no such device"
            with contextlib.suppress(OSError):
                _refuse_other_than_file(os.stat(path).st_mode, source_path)
        raise InputError(
            ErrorClass.INPUT_UNREADABLE, f"cannot read input: {exc.strerror or exc}"
        ) from None
    try:
        _refuse_other_than_file(os.fstat(fd).st_mode, source_path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _refuse_other_than_file(mode: int, source_path: str) -> None:
    """InputError where an input's place holds a folder or a special file:
    the import's words for them (campaigns/intake/importing.py)."""
    if stat.S_ISREG(mode):
        return
    if stat.S_ISDIR(mode):
        raise InputError(ErrorClass.INPUT_INVALID, f"input is a folder, not a file: {source_path}")
    # Opened without blocking, a FIFO would read as empty: say what it is.
    raise InputError(
        ErrorClass.INPUT_INVALID,
        f"input is not a regular file but {special_kind(mode)}: {source_path}",
    )


def decode_text(data: bytes) -> str:
    """UTF-8 text with something to embed, or a classified, readable refusal.

    Of a cut read (`InputBytes.cut`), the text its bytes hold: a character
    split by the cut is dropped, and the text ends at its last whitespace, so
    that no word is cut either (a tokenizer then gives the first tokens of
    the whole text).
    """
    if not data:
        raise InputError(ErrorClass.INPUT_INVALID, "empty file")
    if b"\x00" in data[:8192]:
        raise InputError(ErrorClass.INPUT_INVALID, "binary file (contains NUL bytes), not text")
    cut = bool(getattr(data, "cut", False))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if cut and exc.start >= len(data) - 3 and exc.reason == "unexpected end of data":
            text = data[: exc.start].decode("utf-8")
        else:
            bad = data[exc.start : exc.start + 1].hex()
            raise InputError(
                ErrorClass.INPUT_INVALID,
                f"not valid UTF-8: byte 0x{bad} at offset {exc.start} "
                "(re-encode the file as UTF-8)",
            ) from None
    text = text.removeprefix("\ufeff")
    if not text.strip():
        if cut:
            raise InputError(
                ErrorClass.INPUT_INVALID,
                f"its first {len(data):,} bytes are whitespace only, nothing to embed",
            )
        raise InputError(ErrorClass.INPUT_INVALID, "whitespace only, nothing to embed")
    if not any(map(_is_content, text)):  # stops at the first visible character
        raise InputError(
            ErrorClass.INPUT_INVALID,
            f"control or zero-width characters only ({chars_named(text)}), nothing to embed",
        )
    if cut:
        # rsplit drops the last whitespace run and what follows it, in C.
        head = text.rsplit(None, 1)[0]
        if len(head) > len(text) // 2:
            text = head
    return text


# Control (Cc) and format (Cf: zero-width space and joiners, direction marks,
# BOM) characters: tokenizers drop them, so a text of nothing else embeds as
# an empty input would, a vector that says nothing about the file.
_INVISIBLE = frozenset({"Cc", "Cf"})


def _is_content(char: str) -> bool:
    return not char.isspace() and unicodedata.category(char) not in _INVISIBLE


def chars_named(text: str, shown: int = 3) -> str:
    """The first few distinct characters other than whitespace, as U+XXXX:
    what a text of invisible characters (or of characters its tokenizer
    drops) holds."""
    named: dict[str, None] = {}
    for char in text:
        if not char.isspace():
            named.setdefault(f"U+{ord(char):04X}")
            if len(named) == shown:
                break
    return ", ".join(named)
