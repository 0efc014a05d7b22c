"""The files a version's outputs depend on besides the code: a model, its
labels file, fine-tuned weights.

Their sha256 goes into the parameter version (`software["files"]`), so the
same path holding another model makes another version, and a worker checks
them before it loads the version's model (once a process: a model loaded stays
the one that was checked), so a model replaced under a campaign fails its
batches with the reason instead of mixing two models' outputs under one label.
A processor names the parameters that hold such paths in
`ProcessorSpec.model_params`.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

from django.core.exceptions import ValidationError

from campaigns.specs.builtin import resolve_model_path


class ModelFilesChanged(Exception):
    """A file a version recorded is gone or holds something else now."""


def digests(model_params: tuple[str, ...], params: dict) -> dict[str, dict[str, str]]:
    """{parameter: {"path", "sha256"}} of each file or folder these parameters
    name; a path that is not there is refused before a version is made."""
    found = {}
    for name in model_params:
        value = params.get(name)
        if not value:
            continue  # an optional file left out (weights)
        path = resolve_model_path(str(value))
        try:
            found[name] = {"path": str(path), "sha256": digest(path)}
        except OSError as exc:
            raise ValidationError(
                f"{name}: cannot read {path} ({exc.strerror or exc}); the portal and every "
                "worker must see it at this path"
            ) from None
    return found


def check(recorded: dict[str, dict[str, str]]) -> None:
    """Raise ModelFilesChanged, saying what to do, unless the files a version
    recorded are still what it recorded."""
    for name, record in recorded.items():
        path = Path(record["path"])
        try:
            now = digest(path)
        except OSError as exc:
            problem = f"{name} {path} cannot be read ({exc.strerror or exc})"
        else:
            if now == record["sha256"]:
                continue
            problem = (
                f"{name} {path} changed since this parameter version was made "
                f"(sha256 {record['sha256'][:12]}…, now {now[:12]}…)"
            )
        raise ModelFilesChanged(
            f"{problem}: save the parameters again to make a new version, then run the "
            "failed units again (Resume with their class ticked, or campaign resume --retry-failed)"
        )


def digest(path: Path) -> str:
    """sha256 of a file, or of a folder's files (names and contents); read
    again only when a file's size or modification time changed."""
    return _digest(str(path), _stamp(path))


def _stamp(path: Path) -> tuple:
    if not path.is_dir():
        stat = path.stat()  # raises for a missing path
        return (stat.st_size, stat.st_mtime_ns)
    return tuple((rel, *stat) for rel, stat in _files(path))


def _files(folder: Path) -> list[tuple[str, tuple[int, int]]]:
    """(relative name, (size, mtime)) of every file under the folder, hidden
    ones (caches, a checkpoint's temp files) left out, in name order."""
    found = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in filenames:
            if name.startswith("."):
                continue
            full = Path(dirpath) / name
            stat = full.stat()
            found.append((str(full.relative_to(folder)), (stat.st_size, stat.st_mtime_ns)))
    return sorted(found)


@functools.lru_cache(maxsize=64)
def _digest(path: str, stamp: tuple) -> str:
    folder = Path(path)
    if not folder.is_dir():
        return _file_sha256(folder)
    listing = hashlib.sha256()
    for rel, *_ in stamp:  # a folder's stamp lists its files
        listing.update(f"{rel}\0{_file_sha256(folder / rel)}\n".encode())
    return listing.hexdigest()


def _file_sha256(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()
