"""Where things go on disk: one pure function per kind of path."""

from __future__ import annotations

import hashlib
import re
import unicodedata
from pathlib import Path, PurePosixPath

# Letters and digits of any script stay readable; everything else becomes "_".
_UNSAFE = re.compile(r"[^\w.\-]+", re.UNICODE)
_MAX_NAME = 80


def normalise_uid(relative_path: str) -> str:
    """The stable id of a file found in a folder: NFC, forward slashes, no leading './'."""
    parts = [p for p in PurePosixPath(relative_path.replace("\\", "/")).parts if p not in ("", ".")]
    return unicodedata.normalize("NFC", "/".join(parts))


def safe_name(uid: str) -> str:
    """A file name for a unit id: readable, path-safe, and unique per id.

    The readable part may collide ("a/b" and "a_b"), the hash suffix does not;
    over-long ids keep a readable prefix only.
    """
    digest = hashlib.sha256(uid.encode("utf-8")).hexdigest()
    readable = _UNSAFE.sub("_", unicodedata.normalize("NFC", uid)).strip("._") or "unit"
    return f"{readable[:_MAX_NAME]}-{digest[:12]}"


def output_relpath(*, campaign: str, version_label: str, uid: str, suffix: str) -> PurePosixPath:
    """Output of one unit, relative to OUTPUT_ROOT.

    Sharded by the first byte of the id's hash so no folder holds millions of
    files; the version label keeps outputs of different versions apart.
    """
    name = safe_name(uid)
    shard = hashlib.sha256(uid.encode("utf-8")).hexdigest()[:2]
    return PurePosixPath(campaign) / version_label / shard / f"{name}{suffix}"


def resolve_input(root: Path, source_path: str) -> Path:
    """The absolute input path of a unit; refuses anything that leaves the corpus root."""
    root = root.resolve()
    candidate = (root / source_path).resolve()
    if candidate != root and root not in candidate.parents:
        raise ValueError(f"path {source_path!r} leaves the corpus folder {root}")
    return candidate
