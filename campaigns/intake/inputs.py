"""Reading a unit's input and classifying what is wrong with it."""

from __future__ import annotations

import os
import unicodedata
from pathlib import Path

from campaigns.models import ErrorClass
from campaigns.storage.paths import resolve_input


class InputError(Exception):
    def __init__(self, error_class: str, message: str):
        super().__init__(message)
        self.error_class = error_class
        self.message = message


def read_bytes(root: Path, source_path: str, real_root: str | None = None) -> bytes:
    """A unit's input, read only if its real path is inside the corpus root
    (no `..` or symlink out of it); anything else is a classified InputError.

    `real_root`, from `corpus_real_path(root)`, saves finding the root's real
    path again for each of many inputs read at once (a batch's).
    """
    if _PROC_FD:
        try:
            return _read_checked_by_fd(root, source_path, real_root)
        except (OSError, ValueError):
            # Missing, unreadable, a NUL in the path: classified the slow way.
            return _read_resolved(root, source_path)
    return _read_resolved(root, source_path)


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


def _read_checked_by_fd(root: Path, source_path: str, real_root: str | None) -> bytes:
    if real_root is None:
        root_fd, real_root = _real_path(str(root), os.O_DIRECTORY)
        os.close(root_fd)
    fd, real = _real_path(os.path.join(root, source_path))
    with os.fdopen(fd, "rb") as fh:
        if real != real_root and not real.startswith(real_root.rstrip("/") + "/"):
            raise InputError(
                ErrorClass.INPUT_INVALID,
                f"path {source_path!r} leaves the corpus folder {real_root}",
            )
        return fh.read()


def _read_resolved(root: Path, source_path: str) -> bytes:
    try:
        path = resolve_input(root, source_path)
    except ValueError as exc:
        raise InputError(ErrorClass.INPUT_INVALID, str(exc)) from None
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise InputError(ErrorClass.INPUT_MISSING, f"input file not found: {source_path}") from None
    except IsADirectoryError:
        raise InputError(ErrorClass.INPUT_INVALID, f"input is a folder: {source_path}") from None
    except OSError as exc:
        raise InputError(
            ErrorClass.INPUT_UNREADABLE, f"cannot read input: {exc.strerror or exc}"
        ) from None


def decode_text(data: bytes) -> str:
    """UTF-8 text with something to embed, or a classified, readable refusal."""
    if not data:
        raise InputError(ErrorClass.INPUT_INVALID, "empty file")
    if b"\x00" in data[:8192]:
        raise InputError(ErrorClass.INPUT_INVALID, "binary file (contains NUL bytes), not text")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = data[exc.start : exc.start + 1].hex()
        raise InputError(
            ErrorClass.INPUT_INVALID,
            f"not valid UTF-8: byte 0x{bad} at offset {exc.start} (re-encode the file as UTF-8)",
        ) from None
    text = text.removeprefix("\ufeff")
    if not text.strip():
        raise InputError(ErrorClass.INPUT_INVALID, "whitespace only, nothing to embed")
    if not any(map(_is_content, text)):  # stops at the first visible character
        raise InputError(
            ErrorClass.INPUT_INVALID,
            f"control or zero-width characters only ({_invisible_named(text)}), nothing to embed",
        )
    return text


# Control (Cc) and format (Cf: zero-width space and joiners, direction marks,
# BOM) characters: tokenizers drop them, so a text of nothing else embeds as
# an empty input would, a vector that says nothing about the file.
_INVISIBLE = frozenset({"Cc", "Cf"})


def _is_content(char: str) -> bool:
    return not char.isspace() and unicodedata.category(char) not in _INVISIBLE


def _invisible_named(text: str, shown: int = 3) -> str:
    """The first few distinct invisible characters, as U+XXXX."""
    named: dict[str, None] = {}
    for char in text:
        if not char.isspace():
            named.setdefault(f"U+{ord(char):04X}")
            if len(named) == shown:
                break
    return ", ".join(named)
