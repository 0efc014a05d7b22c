"""No CSV the portal writes holds a cell a spreadsheet would run as a formula
(OWASP, "CSV Injection"): such text cells start with a single quote."""

from __future__ import annotations

import csv
import io

import pytest
from django.urls import reverse

from campaigns.exports.csv_stream import spreadsheet_safe, stream_csv
from campaigns.exports.inventory import export
from campaigns.runs import setup

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
HOSTILE_IDS = ['=HYPERLINK("http://x","y")', "+1+2", "-2+3", "@SUM(A1)", "'kept"]


@pytest.mark.parametrize(
    ("cell", "written"),
    [
        ("=1+2", "'=1+2"),
        ("+cmd", "'+cmd"),
        ("-2", "'-2"),
        ("@SUM(A1)", "'@SUM(A1)"),
        ("\tx", "'\tx"),
        ("\rx", "'\rx"),
        ("'quoted", "''quoted"),  # one quote off gives every value back
        ("plain=1", "plain=1"),
        ("", ""),
        (-1.5, -1.5),  # numbers are no user text
        (-3, -3),
        (None, None),
    ],
)
def test_a_cell_that_starts_a_formula_is_written_behind_a_quote(cell, written):
    assert spreadsheet_safe(cell) == written
    (row,) = list(csv.reader(io.StringIO("".join(stream_csv(["x"], [[cell]])))))[1:]
    assert row == ["" if written is None else str(written)]


def _cells(text: str) -> list[str]:
    return [cell for row in list(csv.reader(io.StringIO(text)))[1:] for cell in row]


@pytest.fixture
def hostile(project, tmp_path, output_root, run_here):
    """A manifest campaign whose ids, paths and categories start formulas, run."""
    root = tmp_path / "texts"
    root.mkdir()
    lines = ["id,path,category"]
    for i, uid in enumerate(HOSTILE_IDS):
        (root / f"=file{i}.txt").write_text(f"Sentence number {i} about harbours.\n")
        quoted = uid.replace('"', '""')
        lines.append(f'"{quoted}",=file{i}.txt,@cat')
    lines.append("@gone,-missing.txt,+cat")  # fails: its reason goes to errors.csv
    (tmp_path / "manifest.csv").write_text("\n".join(lines) + "\n")
    campaign, _ = setup.campaign_create(
        name="hostile",
        processor="text-embedding",
        project=project,
        manifest=tmp_path / "manifest.csv",
        input_root=root,
    )
    assert set(campaign.units.values_list("uid", flat=True)) == {*HOSTILE_IDS, "@gone"}
    run_here(campaign)
    return campaign


@pytest.mark.django_db
def test_exported_csv_files_hold_no_cell_that_starts_a_formula(hostile, tmp_path):
    written = export(hostile, tmp_path / "dossier")
    tables = {p.name: p.read_text() for p in written if p.suffix == ".csv"}
    assert {"manifest.csv", "results.csv", "errors.csv"} <= set(tables)
    assert any(name.startswith("vectors-") for name in tables)
    for name, text in tables.items():
        bad = [c for c in _cells(text) if c.startswith(FORMULA_STARTS)]
        assert bad == [], name
    manifest = list(csv.DictReader(io.StringIO(tables["manifest.csv"])))
    assert {row["id"] for row in manifest} == {"'" + uid for uid in [*HOSTILE_IDS, "@gone"]}
    assert {row["source_path"] for row in manifest} >= {"'=file0.txt", "'-missing.txt"}
    assert {row["category"] for row in manifest} == {"'@cat", "'+cat"}
    (error,) = csv.DictReader(io.StringIO(tables["errors.csv"]))
    assert error["id"] == "'@gone"
    vectors = next(t for n, t in tables.items() if n.startswith("vectors-"))
    ids = {row["id"] for row in csv.DictReader(io.StringIO(vectors))}
    assert ids == {"'" + uid for uid in HOSTILE_IDS}


@pytest.mark.django_db
def test_downloaded_csv_files_hold_no_cell_that_starts_a_formula(hostile, client, owner):
    client.force_login(owner)
    for name in ("manifest.csv", "results.csv", "errors.csv", "review_decisions.csv"):
        response = client.get(reverse("campaign_export", args=[hostile.name, name]))
        assert response.status_code == 200
        text = b"".join(response.streaming_content).decode()
        assert [c for c in _cells(text) if c.startswith(FORMULA_STARTS)] == [], name
        if name == "manifest.csv":
            assert "'=HYPERLINK" in text


@pytest.mark.django_db
def test_the_order_dossier_csv_files_hold_no_cell_that_starts_a_formula(hostile, make_order):
    import zipfile

    from portal.dossier import dossier_bytes

    order = make_order()
    order.campaign = hostile
    order.save()
    zf = zipfile.ZipFile(io.BytesIO(dossier_bytes(order=order)))
    names = [n for n in zf.namelist() if n.endswith(".csv")]
    assert names == ["campaign/manifest.csv", "campaign/batches.csv", "campaign/errors.csv"]
    for name in names:
        cells = _cells(zf.read(name).decode())
        assert [c for c in cells if c.startswith(FORMULA_STARTS)] == [], name
    manifest = list(csv.DictReader(io.StringIO(zf.read("campaign/manifest.csv").decode())))
    assert {row["id"] for row in manifest} == {"'" + uid for uid in [*HOSTILE_IDS, "@gone"]}
