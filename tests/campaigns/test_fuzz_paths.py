"""Fuzzed path normaliser: ids become safe, writable names; inputs never leave the corpus.

Any id gives an output path of plain parts under '<campaign>/<version>/', short
enough for the filesystem; any source path resolves inside the corpus folder
or is refused with ValueError, whatever symlinks (out of it, in a loop) it
passes through.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path, PurePosixPath

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from campaigns.intake.inputs import InputError, read_bytes
from campaigns.intake.rows import walk_folder
from campaigns.models import ErrorClass
from campaigns.storage.paths import (
    DAMAGED_FOLDER,
    InputLocator,
    damaged_relpath,
    escape_path,
    normalise_uid,
    output_relpath,
    resolve_input,
    safe_name,
    storable,
    unescape_path,
)
from campaigns.storage.vector_shards import member_path, split_member

#: Ids as people and file systems make them: any text, with path-like pieces
#: and letters whose UTF-8 takes three or four bytes.
_PIECES = st.sampled_from(["..", ".", "/", "\\", "#7", "~", "日本語", "𠀀𠀁", "é", " ", "\x00"])
uids = st.one_of(
    st.lists(st.one_of(st.text(max_size=40), _PIECES), max_size=30).map("".join),
    st.text(alphabet="日本語𠀀𠀁éx/._", max_size=120),
)
#: The longest file name Linux file systems take, in bytes.
NAME_MAX = 255
#: Every suffix a processor writes (campaigns/specs/builtin.py).
SUFFIXES = [".npy", ".npz", ".png", ".jpg", ".webp"]


@given(uid=uids)
def test_a_normalised_id_is_stable_and_has_no_empty_or_dot_parts(uid):
    # An absolute path keeps its leading '/' doubled ('/a' is '//a', as
    # PurePosixPath's parts join): ids already imported that way stay as they are.
    assume(not uid.replace("\\", "/").startswith("/"))
    once = normalise_uid(uid)
    assert normalise_uid(once) == once
    assert "\\" not in once
    assert all(part not in ("", ".") for part in once.split("/")) or once == ""


@given(uid=uids, suffix=st.sampled_from(SUFFIXES), label=st.sampled_from(["v1", "v12"]))
@example(uid="日本語" * 30, suffix=".webp", label="v1")  # 3 bytes a letter
@example(uid="𠀀" * 90, suffix=".npy", label="v1")  # 4 bytes a letter
def test_every_id_gets_a_plain_output_path_the_filesystem_takes(uid, suffix, label):
    rel = output_relpath(campaign="c", version_label=label, uid=uid, suffix=suffix)
    assert not rel.is_absolute()
    assert rel.parts[:2] == ("c", label)
    assert all(part not in ("", ".", "..") for part in rel.parts)
    name = rel.name
    assert not name.startswith(".") and "\x00" not in name and "\\" not in name
    assert len(name.encode("utf-8")) <= NAME_MAX, (len(name.encode()), name)
    assert split_member(str(rel)) == (str(rel), None)  # never read as a shard row


@given(a=uids, b=uids)
def test_two_ids_never_share_an_output_name(a, b):
    assume(a != b)
    assert safe_name(a) != safe_name(b)


@given(rel=st.text(min_size=1, max_size=60), row=st.integers(0, 10**6))
def test_a_shard_member_path_names_its_row(rel, row):
    assert split_member(member_path(rel, row)) == (rel, row)


@given(rel=st.lists(st.sampled_from(["c", "v1", "ab", "x.png", "..", ".", ""]), max_size=6))
def test_a_damaged_output_is_set_aside_inside_its_version_folder(rel):
    path = "/".join(rel)
    moved = damaged_relpath(path)
    if moved is not None:
        parts = moved.split("/")
        assert parts[:2] == rel[:2] and parts[2] == DAMAGED_FOLDER
        assert ".." not in parts


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A corpus folder with a file, a folder, and symlinks out of it and in a loop."""
    base = tmp_path_factory.mktemp("paths")
    root = base / "corpus"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "a.txt").write_text("a")
    (base / "secret.txt").write_text("outside")
    (root / "out").symlink_to(base)
    (root / "secret").symlink_to(base / "secret.txt")
    (root / "loop").symlink_to(root / "loop")
    (root / "ping").symlink_to(root / "pong")
    (root / "pong").symlink_to(root / "ping")
    (root / "inside").symlink_to(root / "sub")
    return root


_SEGMENTS = st.sampled_from(
    ["..", ".", "", "sub", "a.txt", "out", "secret", "loop", "ping", "inside", "x" * 300, "nul\x00"]
)
source_paths = st.one_of(
    st.lists(_SEGMENTS, max_size=8).map("/".join),
    st.lists(_SEGMENTS, min_size=1, max_size=4).map(lambda p: "/" + "/".join(p)),
    st.text(max_size=40),
)


@given(source=source_paths)
def test_an_input_path_resolves_inside_the_corpus_or_is_refused(corpus, source):
    real_root = corpus.resolve()
    try:
        path = resolve_input(corpus, source)
    except ValueError:
        return
    assert path == real_root or real_root in path.parents


@given(source=source_paths)
def test_verifys_lexical_locator_stays_inside_the_corpus_or_refuses(corpus, source):
    locate = InputLocator(corpus)
    try:
        path = locate(source)
    except ValueError:
        return
    assert PurePosixPath(path).is_relative_to(os.path.realpath(corpus))


@given(source=source_paths)
def test_reading_any_input_path_gives_its_bytes_or_a_classified_input_error(corpus, source):
    try:
        data = read_bytes(corpus, source)
    except InputError as exc:
        assert exc.error_class in ErrorClass.values and exc.message
        return
    assert data == b"a"  # the one file inside; never the one a symlink leads out to


#: Pieces of names that look like, or are, what the stored-path escape writes:
#: backslashes, `x` and hex digits, bytes that are not UTF-8 (as Python's
#: lone surrogates), NUL, and letters of several widths.
_NAME_PIECES = st.sampled_from(
    [
        "\\",
        "\\\\",
        "x",
        "e9",
        "00",
        "ud",
        "d800",
        "\udce9",
        "\udcff",
        "\ud800",
        "\x00",
        "a",
        "é",
        "𠀀",
        "/",
        ".",
        " ",
    ]
)
names = st.one_of(
    st.lists(_NAME_PIECES, max_size=12).map("".join),
    st.text(max_size=30),
    st.binary(max_size=30).map(os.fsdecode),
)


@given(name=names)
@example(name="bad\udce9name.txt")  # a byte that is not UTF-8 …
@example(name="bad\\xe9name.txt")  # … and the text its escape once was, with a real backslash
@example(name="a\\b/c\udce9")  # a part that needs no escape beside one that does
def test_a_stored_path_is_text_every_column_holds_and_gives_the_name_back(name):
    stored = escape_path(name)
    assert storable(stored)
    assert unescape_path(stored) == name
    if "\\" not in name and storable(name):
        assert stored == name  # an ordinary name is stored as it is


@given(a=names, b=names)
@example(a="bad\udce9name.txt", b="bad\\xe9name.txt")
def test_two_names_never_share_a_stored_path(a, b):
    assume(a != b)
    assert escape_path(a) != escape_path(b)


#: A file name as the file system holds it: any bytes but '/' and NUL.
file_names = st.one_of(
    st.binary(min_size=1, max_size=40),
    st.lists(
        st.sampled_from([b"\\", b"x", b"e9", b"\xe9", b"\xc3", b"\xa9", b"a", b"u"]),
        min_size=1,
        max_size=10,
    ).map(b"".join),
).filter(lambda n: b"/" not in n and b"\x00" not in n and not n.startswith(b"."))


@given(names=st.lists(file_names, min_size=1, max_size=4, unique=True))
@example(names=[b"bad\xe9name.txt", b"bad\\xe9name.txt"])
@example(names=[b"two\\\\x", b"two\\x"])
def test_every_file_of_a_folder_is_read_back_as_its_own_bytes(names):
    """Whatever its name, a file of a folder import is read through its stored
    path as the very file it was; no two files share an id unless their names
    differ only by Unicode normalisation (NFC)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for number, name in enumerate(names):
            with open(os.path.join(os.fsencode(root), name), "wb") as fh:
                fh.write(b"file %d" % number)
        rows = list(walk_folder(root))
        assert len(rows) == len(names)
        for row in rows:
            assert not row.error_class, row.error_message
            assert storable(row.uid) and storable(row.source_path)
            number = names.index(os.fsencode(unescape_path(row.source_path)))
            assert read_bytes(root, row.source_path) == b"file %d" % number
        assert len({row.source_path for row in rows}) == len(names)
