"""Reading a unit's input and classifying what is wrong with it."""

from __future__ import annotations

from pathlib import Path

from .models import ErrorClass
from .paths import resolve_input


class InputError(Exception):
    def __init__(self, error_class: str, message: str):
        super().__init__(message)
        self.error_class = error_class
        self.message = message


def read_bytes(root: Path, source_path: str) -> bytes:
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
    return text
