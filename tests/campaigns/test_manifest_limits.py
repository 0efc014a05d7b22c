"""A manifest row's size is bounded as a CSV field is (docs/importing.md): a
JSONL line over the limit fails its row alone, with the limit named, and is
never held whole; a row's metadata over the limit fails that row, in either
format; the rest of the manifest imports."""

from __future__ import annotations

import tracemalloc

import pytest

from campaigns.intake import manifests
from campaigns.intake.manifests import FIELD_MAX, LINE_MAX, manifest_rows
from campaigns.models import UnitState
from campaigns.runs import setup

pytestmark = pytest.mark.django_db


@pytest.fixture
def texts(tmp_path):
    root = tmp_path / "texts"
    root.mkdir()
    for name in ("a.txt", "b.txt", "c.txt"):
        (root / name).write_text(f"The text of {name}.\n")
    return root


def _jsonl(path, *lines: str):
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_a_jsonl_line_over_the_limit_fails_alone_and_the_rest_imports(
    project, texts, output_root, monkeypatch
):
    monkeypatch.setattr(manifests, "LINE_MAX", 100)
    manifest = _jsonl(
        texts / "manifest.jsonl",
        '{"path": "a.txt"}',
        '{"path": "b.txt", "note": "' + "x" * 500 + '"}',
        '{"path": "c.txt", "note": "short"}',
    )
    campaign, _ = setup.campaign_create(
        name="long-line", processor="text-embedding", project=project, manifest=manifest
    )
    units = {u.uid: u for u in campaign.units.all()}
    assert units["a.txt"].state == units["c.txt"].state == UnitState.PENDING
    assert units["c.txt"].metadata == {"note": "short"}
    (failed,) = [u for u in units.values() if u.state == UnitState.FAILED]
    assert failed.error_class == "input_invalid"
    assert failed.error_message == (
        "line 2 is 529 characters long, over the 100 a manifest line may hold"
    )


def test_a_line_megabytes_over_the_default_is_refused_without_being_held_whole(tmp_path):
    # given: one line LINE_MAX plus 4 MB of metadata long, then a good line
    oversize = LINE_MAX + 4 * 2**20
    manifest = tmp_path / "manifest.jsonl"
    with open(manifest, "w") as fh:
        fh.write('{"path": "a.txt", "note": "')
        fh.write("x" * (oversize - len('{"path": "a.txt", "note": "') - 2))
        fh.write('"}\n{"path": "b.txt"}\n')
    # when
    tracemalloc.start()
    try:
        rows = list(manifest_rows(manifest))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # then: the row fails with the limit named, the next one reads; at most a
    # line's worth of the limit was held, far from the 4 MB over it
    first, second = rows
    assert first.error_message == (
        f"line 1 is {oversize:,} characters long, over the {LINE_MAX:,} a manifest line may hold"
    )
    assert (second.uid, second.error_class) == ("b.txt", "")
    assert peak < oversize / 4


def test_a_line_at_the_limit_is_read(tmp_path):
    manifest = tmp_path / "manifest.jsonl"
    head = '{"path": "a.txt", "note": "'
    _jsonl(manifest, head + "x" * (LINE_MAX - len(head) - 2) + '"}', '{"path": "b.txt"}')
    first, second = manifest_rows(manifest)
    assert first.error_message == "" and len(first.metadata["note"]) > FIELD_MAX
    assert second.uid == "b.txt"


@pytest.mark.parametrize("form", ["csv", "jsonl"])
def test_metadata_over_a_csv_fields_limit_fails_its_row_in_either_format(
    project, texts, output_root, form
):
    # given: a row whose two metadata columns each fit a CSV field, together
    # over what a row's metadata may hold
    half = "y" * (FIELD_MAX // 2 + 10)
    if form == "csv":
        manifest = texts / "manifest.csv"
        manifest.write_text(f"path,note,more\na.txt,,\nb.txt,{half},{half}\nc.txt,x,\n")
    else:
        manifest = _jsonl(
            texts / "manifest.jsonl",
            '{"path": "a.txt"}',
            f'{{"path": "b.txt", "note": "{half}", "more": "{half}"}}',
            '{"path": "c.txt", "note": "x"}',
        )
    campaign, _ = setup.campaign_create(
        name=f"meta-{form}", processor="text-embedding", project=project, manifest=manifest
    )
    units = {u.uid: u for u in campaign.units.all()}
    assert units["a.txt"].state == units["c.txt"].state == UnitState.PENDING
    b = units["b.txt"]
    assert (b.state, b.error_class, b.metadata) == (UnitState.FAILED, "input_invalid", {})
    line = 3 if form == "csv" else 2
    assert b.error_message.startswith(
        f"line {line}: its metadata is 131,"
    ) and b.error_message.endswith("characters as JSON, over the 131,072 a row's metadata may hold")


def test_a_csv_manifest_field_over_the_limit_is_refused_with_record_files_read(tmp_path):
    """Record files raise csv's process-wide field limit; a CSV manifest keeps its own."""
    import campaigns.intake.records  # noqa: F401 — raises csv.field_size_limit()
    from campaigns.intake.manifests import ManifestError

    manifest = tmp_path / "manifest.csv"
    manifest.write_text(f"path,note\na.txt,{'x' * (FIELD_MAX + 1)}\n")
    with pytest.raises(ManifestError, match="field larger than field limit"):
        list(manifest_rows(manifest))
