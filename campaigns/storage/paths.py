"""Where things go on disk: one pure function per kind of path."""

from __future__ import annotations

import hashlib
import os
import re
import unicodedata
from pathlib import Path, PurePosixPath

# Letters and digits of any script stay readable; everything else becomes "_".
_UNSAFE = re.compile(r"[^\w.\-]+", re.UNICODE)
_MAX_NAME = 80
#: The longest file name Linux file systems take, in bytes: 80 letters of a
#: script whose UTF-8 takes 3 or 4 bytes a letter would exceed it.
_NAME_MAX_BYTES = 255


def normalise_uid(relative_path: str) -> str:
    """The stable id of a file found in a folder: NFC, forward slashes, no leading './'."""
    parts = [p for p in PurePosixPath(relative_path.replace("\\", "/")).parts if p not in ("", ".")]
    return unicodedata.normalize("NFC", "/".join(parts))


# A unit's source path is text that every database column, page and CSV
# holds, and it must read back to the very name on disk. A file name is
# bytes: Python hands one that is not UTF-8 over with each bad byte as a lone
# surrogate (U+DC80–U+DCFF), which no column holds, and PostgreSQL refuses a
# NUL in any text. Such a name is stored escaped, and readers unescape:
#
#   \xNN     a byte that is not UTF-8 (NN from 80 to ff)
#   \x00     a NUL (no file name holds one: only a manifest's text can)
#   \udXXX   any other lone surrogate
#   \\       a backslash, in a part that needs any escape, or whose text
#            would otherwise read as holding one ('caf\xe9.txt' with a real
#            backslash is stored 'caf\\xe9.txt')
#
# Each part of a path ('/'-separated) that needs none is stored as it is,
# backslashes included ('a\b.txt'). Escaping is reversible — unescape_path
# gives the name back — and so injective: no two names share a stored path.
_ESCAPE = re.compile(r"\\(?:\\|x(?:00|[89a-f][0-9a-f])|ud[89a-f][0-9a-f]{2})")


def storable(text: str) -> bool:
    """Whether every database column takes this text: no NUL, no lone surrogate."""
    if "\x00" in text:
        return False
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def escape_path(path: str) -> str:
    """A file's relative path (or a manifest's) as stored text; see above."""
    if "\\" not in path and storable(path):
        return path
    return "/".join(map(_escape_part, path.split("/")))


def _escape_part(part: str) -> str:
    if storable(part) and not _ESCAPE.search(part):
        return part
    out = []
    for char in part:
        if char == "\\":
            out.append("\\\\")
        elif char == "\x00":
            out.append("\\x00")
        elif "\udc80" <= char <= "\udcff":
            out.append(f"\\x{ord(char) - 0xDC00:02x}")
        elif "\ud800" <= char <= "\udfff":
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    return "".join(out)


def unescape_path(text: str) -> str:
    """The name a stored path stands for: escape_path's inverse (a lone
    surrogate stands for the byte os functions give the file system)."""
    if "\\" not in text:
        return text
    return _ESCAPE.sub(_unescaped, text)


def _unescaped(match: re.Match) -> str:
    escape = match.group()
    if escape == "\\\\":
        return "\\"
    code = int(escape[2:], 16)
    if escape[1] == "x" and code:
        return chr(0xDC00 + code)
    return chr(code)


def input_relpath(source_path: str) -> str:
    """The input's path below the corpus root, as os functions take it; a NUL
    (which no file name holds) is refused with ValueError."""
    name = unescape_path(source_path)
    if "\x00" in name:
        raise ValueError(f"path {source_path!r} holds a NUL character, which no file name can")
    return name


def safe_name(uid: str) -> str:
    """A file name for a unit id: readable, path-safe, and unique per id.

    The readable part may collide ("a/b" and "a_b"), the hash suffix does not;
    over-long ids keep a readable prefix only.
    """
    return _shard_and_name(uid, "")[1]


def _shard_and_name(uid: str, suffix: str) -> tuple[str, str]:
    digest = hashlib.sha256(uid.encode("utf-8")).hexdigest()
    readable = _UNSAFE.sub("_", unicodedata.normalize("NFC", uid)).strip("._") or "unit"
    readable = readable[:_MAX_NAME]
    # Cut further only where the name would not fit the file system: every
    # name that fits stays as it always was.
    room = _NAME_MAX_BYTES - len(f"-{digest[:12]}{suffix}".encode())
    if len(readable.encode("utf-8")) > room:
        readable = readable.encode("utf-8")[:room].decode("utf-8", "ignore")
    return digest[:2], f"{readable}-{digest[:12]}"


def output_name(uid: str, suffix: str) -> str:
    """'<shard>/<name><suffix>': the part of a unit's output path that does not
    depend on campaign or version (verify compares many of these)."""
    shard, name = _shard_and_name(uid, suffix)
    return f"{shard}/{name}{suffix}"


def output_relpath(*, campaign: str, version_label: str, uid: str, suffix: str) -> PurePosixPath:
    """Output of one unit, relative to OUTPUT_ROOT.

    Sharded by the first byte of the id's hash so no folder holds millions of
    files; the version label keeps outputs of different versions apart.
    """
    return PurePosixPath(campaign, version_label, output_name(uid, suffix))


class InputLocator:
    """resolve_input's lexical twin for the import's trusted rows: no syscall
    per unit.

    Symlinks are not followed here; that is acceptable because those rows'
    files are not opened at import, and the worker and verify open them
    through intake.inputs.open_input, which checks the real path.
    """

    def __init__(self, root: Path):
        self.root = os.path.realpath(root)
        self._prefix = self.root.rstrip(os.sep) + os.sep

    def __call__(self, source_path: str) -> str:
        candidate = os.path.normpath(os.path.join(self.root, input_relpath(source_path)))
        if not candidate.startswith(self._prefix):
            raise ValueError(f"path {source_path!r} leaves the corpus folder {self.root}")
        return candidate


def resolve_input(root: Path, source_path: str) -> Path:
    """The absolute input path of a unit; refuses anything that leaves the corpus
    root, or loops through symlinks, with ValueError."""
    relative = input_relpath(source_path)
    try:
        root = root.resolve()
        candidate = (root / relative).resolve()
    except RuntimeError as exc:  # pathlib's word for ELOOP
        raise ValueError(f"path {source_path!r} loops through symlinks: {exc}") from None
    if candidate != root and root not in candidate.parents:
        raise ValueError(f"path {source_path!r} leaves the corpus folder {root}")
    return candidate


SHARDS_FOLDER = "shards"


def shard_relpath(
    *,
    campaign: str,
    version_label: str,
    batch_id: int,
    token: str,
    suffix: str = ".npz",
    part: int = 0,
) -> PurePosixPath:
    """A batch's shard, relative to OUTPUT_ROOT: its vectors (.npz,
    campaigns/storage/vector_shards.py) or JSON rows (.jsonl, row_shards.py).

    Named by the batch and the claim's lease token, so a worker that lost its
    lease never overwrites the file another worker's results point into; a
    thousand batches a folder.
    """
    folder = shard_folder(campaign=campaign, version_label=version_label, batch_id=batch_id)
    more = f"-{part}" if part else ""  # a JSON row shard's further parts
    return folder / f"{shard_prefix(batch_id)}{token[:12]}{more}{suffix}"


def shard_folder(*, campaign: str, version_label: str, batch_id: int) -> PurePosixPath:
    """Where a batch's shards go, relative to OUTPUT_ROOT."""
    return PurePosixPath(campaign, version_label, SHARDS_FOLDER, f"{batch_id // 1000:04d}")


def shard_prefix(batch_id: int) -> str:
    """The start of every shard name (and lease record name) a batch's claims write: 'b<id>-'."""
    return f"b{batch_id}-"


#: Folders of a version's output folder that hold no unit's output: what a
#: batch's claims wrote (campaigns/storage/lease_records.py) and what verify
#: set aside as damaged. Dot-names never collide with a shard folder.
LEASES_FOLDER = ".leases"
DAMAGED_FOLDER = ".damaged"


def lease_folder(*, campaign: str, version_label: str) -> PurePosixPath:
    """Where the lease records of a version's batches go, relative to OUTPUT_ROOT."""
    return PurePosixPath(campaign, version_label, LEASES_FOLDER)


def lease_record_relpath(
    *, campaign: str, version_label: str, batch_id: int, token: str
) -> PurePosixPath:
    """One claim's lease record: named like its batch's shards, by batch and token."""
    folder = lease_folder(campaign=campaign, version_label=version_label)
    return folder / f"{shard_prefix(batch_id)}{token[:12]}.json"


def damaged_relpath(rel: str) -> str | None:
    """Where verify sets a damaged output aside: the same path with DAMAGED_FOLDER
    after the version folder ('c/v1/ab/x.png' -> 'c/v1/.damaged/ab/x.png');
    None for a path outside the '<campaign>/<version>/…' layout."""
    parts = rel.split("/")
    if len(parts) < 3 or any(p in ("", ".", "..") for p in parts):
        return None
    return "/".join([*parts[:2], DAMAGED_FOLDER, *parts[2:]])
