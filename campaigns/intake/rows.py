"""One row of an import, and the rows of a folder (docs/importing.md).

A folder import turns every file under the corpus root into a row; what it
cannot import still becomes a row, failed with a readable reason, and what it
does not descend into (a linked or unreadable sub-folder) is reported as
skipped. Nothing in a folder stops the rest of it.
"""

from __future__ import annotations

import os
import stat
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from django.db.models import CharField

from campaigns.models import ErrorClass, Unit
from campaigns.storage.outputs import file_sha256
from campaigns.storage.paths import escape_path, normalise_uid


def _max_length(name: str) -> int:
    field = Unit._meta.get_field(name)
    assert isinstance(field, CharField) and field.max_length is not None, name
    return field.max_length


UID_MAX = _max_length("uid")
PATH_MAX = _max_length("source_path")
CATEGORY_MAX = _max_length("category")

#: What a folder import says of a sub-folder it does not read: one line each.
Skip = Callable[[str], object]


class NotARegularFile(OSError):
    """A FIFO, socket or device where an input file was expected; its
    argument says which ("a FIFO (named pipe)")."""


_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def special_kind(mode: int) -> str:
    """What a file that is neither a folder nor a regular file is, in words."""
    return next((name for test, name in _KINDS if test(mode)), "a special file")


def file_identity(path: Path) -> tuple[int, int, str]:
    """Size, mtime (ns) and sha256 of an input file.

    Only a regular file is opened: a FIFO would block the hash until some
    writer came, a device would never end.
    """
    st = path.stat()
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(str(path))
    if not stat.S_ISREG(st.st_mode):
        raise NotARegularFile(special_kind(st.st_mode))
    return st.st_size, st.st_mtime_ns, file_sha256(path)


@dataclass(slots=True)
class Row:
    line: int
    uid: str
    source_path: str
    category: str = ""
    metadata: dict | None = None
    # Given by the manifest (a trusted row); otherwise measured on import.
    size: int | None = None
    sha256: str = ""
    error_class: str = ""
    error_message: str = ""

    def fail(self, message: str, error_class: str = ErrorClass.INPUT_INVALID) -> Row:
        self.error_class, self.error_message = error_class, message
        return self


def top_folder(path: str) -> str:
    """The first folder of a path relative to the input root: a folder
    import's category. "" for a file at the top level, or a path that leaves
    the root (the worker refuses it anyway). Cut to the category column's size."""
    first, sep, _rest = normalise_uid(path).partition("/")
    if not sep or first == ".." or path.startswith(("/", "\\")):
        return ""
    return first[:CATEGORY_MAX]


def _linked_folder(root: Path, path: str, rel: str) -> str:
    """Why the linked sub-folder at `path` is not read, in one line."""
    try:
        target = os.path.realpath(path)
    except (OSError, ValueError):
        target = ""
    real_root = os.path.realpath(root)
    if target == real_root or target.startswith(real_root.rstrip(os.sep) + os.sep):
        inside = escape_path(os.path.relpath(target, real_root))
        return (
            f"{rel}/ skipped: a symbolic link to the folder {inside}/ of this corpus, "
            "whose files are imported under their own paths"
        )
    return (
        f"{rel}/ skipped: a symbolic link to {escape_path(target)}, outside the corpus folder; "
        "files outside it are never imported"
    )


def walk_folder(
    root: Path, *, folder_categories: bool = True, skipped: Skip | None = None
) -> Iterator[Row]:
    """A row for each file under `root`, in sorted order; `skipped` hears of each
    sub-folder not read (a symbolic link to a folder, a folder that cannot be listed)."""
    say: Skip = skipped or (lambda line: None)

    def unreadable(exc: OSError) -> None:
        rel = escape_path(os.path.relpath(exc.filename, root)) if exc.filename else "?"
        say(f"{rel}/ skipped: cannot read the folder: {exc.strerror or exc}")

    number = 0
    for dirpath, dirnames, filenames in os.walk(root, onerror=unreadable):
        # Hidden files and folders (.git, .DS_Store) are not part of a corpus.
        kept = []
        for d in sorted(dirnames):
            if d.startswith("."):
                continue
            path = os.path.join(dirpath, d)
            if os.path.islink(path):
                say(_linked_folder(root, path, escape_path(os.path.relpath(path, root))))
                continue
            kept.append(d)
        dirnames[:] = kept
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            number += 1
            rel = os.path.relpath(os.path.join(dirpath, name), root)
            # The name on disk, escaped only where no column could hold it or it
            # would read as an escape (storage/paths.py), and read back through
            # the same escape: a backslash is part of a name here, never a
            # separator, and a name that is not UTF-8 is an input like any other.
            source = escape_path(rel)
            uid = unicodedata.normalize("NFC", source)
            if len(uid) > UID_MAX or len(source) > PATH_MAX:
                yield Row(number, f"file-{number}", source[:PATH_MAX]).fail(
                    f"path longer than {UID_MAX} characters, too long for an id: {uid[:80]}…"
                )
                continue
            folder, sep, _rest = uid.partition("/")
            category = folder[:CATEGORY_MAX] if sep and folder_categories else ""
            yield Row(number, uid, source, category)
