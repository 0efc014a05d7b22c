"""A record unit is its own row's text and no other's: a retry finds the row
by its id, a re-import keeps the first copy of a repeated id, and a CSV
record ends where the csv module says it does (campaigns/intake/records.py,
record_reads.py, runs/control.py; docs/importing.md "Records")."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from campaigns.intake import importing
from campaigns.intake.inputs import read_bytes
from campaigns.models import ErrorClass, Unit, UnitState
from campaigns.runs import control, setup
from tests.campaigns.test_records import create, sha, units

pytestmark = pytest.mark.django_db

ROWS = [{"id": k, "text": f"text of {k}"} for k in "abcd"]


def text_of(campaign, uid: str) -> str:
    unit = Unit.objects.get(campaign=campaign, uid=uid)
    return read_bytes(Path(campaign.input_root), unit.source_path).decode()


def test_a_removed_row_s_unit_stays_failed_through_retries(project, tmp_path):
    path = tmp_path / "c.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), path, row_group_size=2)
    campaign, _ = create(project, path)
    pq.write_table(pa.Table.from_pylist(ROWS[1:]), path, row_group_size=2)  # 'a' removed
    report = setup.campaign_import(campaign=campaign)
    assert report.removed == 1
    for error_class in (ErrorClass.INPUT_MISSING, ErrorClass.INPUT_CHANGED):
        Unit.objects.filter(campaign=campaign, uid="a").update(
            state=UnitState.FAILED, error_class=error_class
        )
        control.campaign_resume(campaign=campaign, retry_failed=True)
        a = Unit.objects.get(campaign=campaign, uid="a")
        assert a.state == UnitState.FAILED, error_class
        assert a.sha256 == sha("text of a")


def test_a_retry_after_a_rewrite_without_an_import_takes_no_other_row(project, tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    campaign, _ = create(project, path)
    # The same length a row: every old place now holds the row before it.
    rows = [{"id": "z", "text": "text of z"}, *ROWS]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    Unit.objects.filter(campaign=campaign).update(
        state=UnitState.FAILED, error_class=ErrorClass.INPUT_CHANGED
    )
    control.campaign_resume(campaign=campaign, retry_failed=True)
    made = units(campaign)
    for uid, unit in made.items():
        assert unit.state == UnitState.FAILED and unit.sha256 == sha(f"text of {uid}"), uid
        assert "run `campaign import recs`" in unit.error_message
        assert "then `resume --retry-failed`" in unit.error_message
    # The import finds each row again; the retry then runs each on its own text.
    setup.campaign_import(campaign=campaign)
    control.campaign_resume(campaign=campaign, retry_failed=True)
    for uid in "abcd":
        unit = Unit.objects.get(campaign=campaign, uid=uid)
        assert unit.state != UnitState.FAILED and text_of(campaign, uid) == f"text of {uid}"


def test_a_reimport_keeps_the_first_copy_of_an_id_chunks_apart(project, tmp_path, monkeypatch):
    monkeypatch.setattr(importing, "CHUNK_ROWS_DEFAULT", 2)
    monkeypatch.setitem(importing.CHUNK_ROWS, "postgresql", 2)
    rows = [
        {"id": "a", "text": "first a"},
        {"id": "b", "text": "b"},
        {"id": "c", "text": "c"},
        {"id": "a", "text": "second a"},
    ]
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    campaign, report = create(project, path)
    assert report.duplicates == 1 and text_of(campaign, "a") == "first a"
    report = setup.campaign_import(campaign=campaign)
    assert (report.duplicates, report.changed, report.created) == (1, 0, 0)
    assert any(p.startswith("a: duplicate id in this import") for p in report.problems)
    a = Unit.objects.get(campaign=campaign, uid="a")
    assert a.state == UnitState.PENDING and a.sha256 == sha("first a")
    assert text_of(campaign, "a") == "first a"


def test_a_stray_quote_in_an_unquoted_csv_field_is_that_field_s_text(project, tmp_path):
    path = tmp_path / "c.csv"
    path.write_text('id,text\n1,a 5" screen\n2,second row\n3,"quoted, ok"\n4,fourth\n')
    campaign, report = create(project, path)
    assert (report.created, report.failed) == (4, 0)
    assert [text_of(campaign, uid) for uid in "1234"] == [
        'a 5" screen',
        "second row",
        "quoted, ok",
        "fourth",
    ]


def test_doubled_quotes_past_the_sniffed_sample_are_one_quote(project, tmp_path):
    lines = ["id,text"] + [f'{i},"plain, row {i}"' for i in range(3000)]
    path = tmp_path / "c.csv"
    path.write_text("\n".join([*lines, 'x,"He said ""hi"" there"']) + "\n")
    campaign, report = create(project, path)
    assert report.failed == 0
    assert text_of(campaign, "x") == 'He said "hi" there'


def test_a_csv_text_over_csv_s_default_field_limit_is_read(project, tmp_path):
    long = "word " * 30_000  # 150,000 characters
    path = tmp_path / "c.csv"
    path.write_text(f'id,text\nshort,hello\nlong,"{long}"\n')
    campaign, report = create(project, path)
    assert report.failed == 0
    assert text_of(campaign, "long") == long


def test_a_bad_row_s_reason_names_its_place_once(project, tmp_path):
    path = tmp_path / "c.csv"
    path.write_text("id,text\n1,fine\n2,too,many\n")
    _, report = create(project, path)
    assert report.problems == ["c.csv:3: 3 fields where the header has 2"]
