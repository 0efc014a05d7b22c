"""Fuzzed manifest readers: a manifest is refused whole with ManifestError, or
each of its rows becomes a unit (a failed one with its reason), never a traceback.

docs/importing.md: a CSV without a `path` column or a file that is not UTF-8
is refused as a whole (ManifestError); anything wrong with one row fails that
row only, so the rest of the import goes on. Every row that comes out fits the
database: text that encodes to UTF-8 without NUL within the columns' sizes,
and metadata that is JSON PostgreSQL's jsonb takes (no NaN).
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from campaigns.intake.importing import _staged_rows, import_manifest
from campaigns.intake.manifests import ManifestError, manifest_rows
from campaigns.intake.rows import Row
from campaigns.models import ErrorClass
from campaigns.runs import setup
from campaigns.storage.paths import storable
from tests.fuzzing import damaged

_COLUMN_NAMES = ["id", "path", "category", "size", "sha256", "note", "", "path ", "__error__"]
_SHA = "ab" * 32
#: Text as manifests carry it, surrogates included (JSON's "\ud800" escapes).
texts = st.one_of(
    st.text(max_size=20),
    st.text(st.characters(categories=["Cs", "Cc", "Lo", "Zs"]), max_size=8),
    st.sampled_from(["a.txt", "../up.txt", "/abs.txt", _SHA, "12", "-1", " 3 ", "\x00"]),
)
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    texts,
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=6,
)
records = st.dictionaries(st.sampled_from(_COLUMN_NAMES) | texts, json_values, max_size=6)
#: Lines that are JSON only in part, or JSON Python reads differently.
odd_lines = st.sampled_from(
    [
        "[" * 100_000,
        '{"path": ' + "[" * 5000 + "]" * 5000 + "}",
        '{"path": "a.txt", "size": ' + "9" * 5000 + ', "sha256": "' + _SHA + '"}',
        '{"path": "a.txt", "size": 1e400, "sha256": "' + _SHA + '"}',
        '{"path": "a.txt", "note": NaN}',
        '{"path": "a.txt", "note": [1e400]}',
        '{"path": "a.txt", "note": -Infinity}',
        '{"path": "\\ud800.txt"}',
        '{"id": "\\udcff", "path": "a.txt"}',
        '{"path": "a.txt", "note": "\\ud800"}',
        '"just a string"',
        "\ufeff" + '{"path": "a.txt"}',
    ]
)


def _jsonl(lines: list[str]) -> bytes:
    return "\n".join(lines).encode("utf-8", "surrogatepass")


jsonl_manifests = st.one_of(
    st.lists(records.map(json.dumps) | odd_lines, max_size=6).map(_jsonl),
    st.binary(max_size=200),
)


def _csv(header: list[str], rows: list[list[str]]) -> bytes:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(header)
    writer.writerows(rows)
    return buf.getvalue().encode("utf-8", "surrogatepass")


#: Cells as people and programs write them, one far over csv's field size limit.
cells = texts | st.sampled_from(["x" * 200_000, '"', "a\nb", "\r"])
csv_manifests = st.one_of(
    st.builds(
        _csv,
        st.lists(st.sampled_from(_COLUMN_NAMES), min_size=1, max_size=5),
        st.lists(st.lists(cells, max_size=6), max_size=5),
    ),
    st.binary(max_size=200),
)
GOOD_CSV = _csv(["id", "path", "size", "sha256"], [["u1", "a.txt", "3", _SHA], ["u2", "b", "", ""]])


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("manifests")
    (root / "corpus").mkdir()
    (root / "corpus" / "a.txt").write_text("abc")
    return root


def _check_rows(folder: Path, manifest: Path) -> None:
    """The property: ManifestError for the whole, or rows the database takes."""
    try:
        rows = list(manifest_rows(manifest))
    except ManifestError:
        return
    campaign = SimpleNamespace(input_root=str(folder / "corpus"), holdout_share=0.1)
    for staged in _staged_rows(campaign, rows):
        line, uid, source_path, size, sha256, _mtime, category, metadata, *_, state, error, msg = (
            staged
        )
        for text in (uid, source_path, category, metadata, msg):
            assert "\x00" not in text
            text.encode("utf-8")  # no lone surrogate: the database's driver encodes it
        assert 0 < len(uid) <= 1000 and len(source_path) <= 2000 and len(category) <= 200
        json.loads(metadata, parse_constant=_refuse)  # strict JSON, as jsonb wants it
        assert (state == "failed") == bool(error) and error in ("", *ErrorClass.values)
        if error:
            assert msg
        else:
            assert size is None or 0 <= size < 2**63
            assert sha256 == "" or len(sha256) == 64


def _refuse(constant: str):
    raise AssertionError(f"metadata holds {constant}, which is not JSON")


@given(data=jsonl_manifests)
# A NUL in the path of a row failed for its id (given, or the path itself):
# stored as it was, PostgreSQL refused the whole import.
@example(data=_jsonl([json.dumps({"path": "a\x00.txt"})]))
@example(data=_jsonl([json.dumps({"id": "x\x00", "path": "\x00"})]))
@example(data=_jsonl([json.dumps({"id": "i" * 1001, "path": "\udce9\x00"})]))
def test_a_jsonl_manifest_is_refused_whole_or_read_row_by_row(folder, data):
    manifest = folder / "m.jsonl"
    manifest.write_bytes(data)
    _check_rows(folder, manifest)


@given(data=csv_manifests | damaged(GOOD_CSV))
@example(data=b"id,path\nx\x00,a\x00.txt\n")
def test_a_csv_manifest_is_refused_whole_or_read_row_by_row(folder, data):
    manifest = folder / "m.csv"
    manifest.write_bytes(data)
    _check_rows(folder, manifest)


@given(
    uid=texts.filter(bool),
    source_path=texts,
    category=texts,
    failed=st.booleans(),
)
@example(uid="x\x00", source_path="a\x00.txt", category="", failed=True)
def test_no_row_reaches_the_database_with_text_a_column_refuses(
    folder, uid, source_path, category, failed
):
    """Whatever a reader hands on, the staged row's text is storable: the
    importer's last guard escapes it and fails the row."""
    row = Row(1, uid, source_path, category)
    if failed:
        row.fail("line 1: " + source_path)
    campaign = SimpleNamespace(input_root=str(folder / "corpus"), holdout_share=0.1)
    [staged] = _staged_rows(campaign, [row])
    for text in (staged[1], staged[2], staged[6], staged[11]):
        assert "\x00" not in text
        text.encode("utf-8")
    if not (storable(uid) and storable(source_path) and storable(category)):
        assert staged[9] == "failed"


#: Text every column holds: no NUL, no lone surrogate.
storable_texts = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"))


@given(
    extra=st.dictionaries(
        storable_texts | st.sampled_from(["__error__", "error", "__line__"]),
        st.none() | st.booleans() | st.integers(-(2**62), 2**62) | storable_texts,
        max_size=4,
    )
)
@example(extra={"__error__": "line 1 is not JSON"})  # once the importer's own mark of a bad line
@example(extra={"path-on-windows": "C:\\u0000\\x"})  # the text of a NUL's escape, no NUL
def test_columns_without_a_meaning_are_the_rows_metadata_whatever_their_names(folder, extra):
    extra = {key: value for key, value in extra.items() if key not in _MEANINGFUL}
    manifest = folder / "m.jsonl"
    manifest.write_text(json.dumps({"id": "x", "path": "a.txt", **extra}) + "\n")
    campaign = SimpleNamespace(input_root=str(folder / "corpus"), holdout_share=0.1)
    [staged] = _staged_rows(campaign, manifest_rows(manifest))
    uid, source_path, metadata, state = staged[1], staged[2], staged[7], staged[9]
    assert (uid, source_path, state) == ("x", "a.txt", "pending"), staged[-1]
    assert json.loads(metadata) == extra


_MEANINGFUL = {"id", "path", "category", "size", "sha256"}


@pytest.fixture
def campaign(project, folder):
    campaign, _ = setup.campaign_create(
        name="fuzzed", processor="text-embedding", project=project, input_folder=folder / "corpus"
    )
    return campaign


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.lists(records.map(json.dumps) | odd_lines, min_size=1, max_size=5).map(_jsonl))
def test_an_import_of_any_manifest_takes_every_row_or_refuses_it_whole(campaign, folder, data):
    """Through the database: every line is a unit (new, failed, already there)
    or a duplicate of an earlier line."""
    manifest = folder / "m.jsonl"
    manifest.write_bytes(data)
    try:
        report = import_manifest(campaign, manifest)
    except ManifestError:
        return
    lines = [line for line in data.split(b"\n") if line.strip()]
    assert report.created + report.existing + report.duplicates == len(lines)
