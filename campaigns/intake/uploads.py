"""Manifest uploads of the setup page: refused while they arrive when over the
cap, and stored from Preview to "Create and start", not for ever."""

from __future__ import annotations

import contextlib
import os
import re
import time
import uuid
from pathlib import Path

from django.conf import settings
from django.core.files.uploadedfile import UploadedFile
from django.core.files.uploadhandler import FileUploadHandler, SkipFile
from django.http import HttpRequest

# A stored manifest's name, which is also the token the form carries from
# Preview to "Create and start": nothing else in the folder is read or deleted.
MANIFEST_TOKEN = re.compile(r"[0-9a-f]{32}\.(csv|jsonl|ndjson)")
# A stored manifest serves only the steps from Preview to "Create and start":
# the import reads it once, and the campaign's manifest.csv is written from its
# units. One unused for a day belongs to a setup nobody went on with.
MANIFEST_KEEP_SECONDS = 24 * 3600


class CappedUploadHandler(FileUploadHandler):
    """Refuses a file once more than max_bytes of it have arrived, before the
    handlers after it (memory, then a temporary file) keep any more of it.

    SkipFile rather than StopUpload: the rest of the body is still read (and the
    rest of the file discarded), so the fields after the file — the processor,
    its parameters — reach the form, which comes back as the user filled it.
    """

    def __init__(self, request: HttpRequest | None = None, *, max_bytes: int):
        super().__init__(request)
        self.max_bytes = max_bytes
        self.refused: set[str] = set()

    def receive_data_chunk(self, raw_data: bytes, start: int) -> bytes:
        if start + len(raw_data) > self.max_bytes:
            self.refused.add(self.field_name)
            raise SkipFile
        return raw_data

    def file_complete(self, file_size: int) -> None:
        return None  # the handlers after this one make the file


def _folder() -> Path:
    return Path(settings.VAR_DIR) / "manifests"


def manifest_store(*, upload: UploadedFile) -> Path:
    """The upload written under VAR_DIR/manifests; those unused for a day go."""
    folder = _folder()
    folder.mkdir(parents=True, exist_ok=True)
    _remove_stale(folder)
    path = folder / f"{uuid.uuid4().hex}{Path(upload.name).suffix.lower()}"
    with path.open("wb") as fh:
        for chunk in upload.chunks():
            fh.write(chunk)
    return path


def manifest_for_token(token: str) -> Path | None:
    """The manifest stored with a preview, None when the token names none (gone, or tampered)."""
    if not MANIFEST_TOKEN.fullmatch(token):
        return None
    path = _folder() / token
    try:
        # Used again: a setup previewed over days keeps its manifest.
        os.utime(path)
    except FileNotFoundError:
        return None
    return path


def _remove_stale(folder: Path) -> None:
    cutoff = time.time() - MANIFEST_KEEP_SECONDS
    for path in folder.iterdir():
        if not MANIFEST_TOKEN.fullmatch(path.name):
            continue
        with contextlib.suppress(FileNotFoundError):  # another request removed it first
            if path.stat().st_mtime < cutoff:
                path.unlink()
