"""A batch's attempts inserted as rows in one statement (campaigns/db/row_inserts.py)."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from campaigns.db import row_inserts
from campaigns.models import Attempt, Unit

pytestmark = pytest.mark.django_db

FIELDS = (
    "unit_id",
    "version_id",
    "outcome",
    "error_message",
    "output_size",
    "started_at",
    "finished_at",
    "duration_ms",
    "metrics",
)


def _rows(campaign, count):
    units = list(Unit.objects.filter(campaign=campaign).order_by("pk"))
    start = dt.datetime(2026, 12, 1, 9, 30, 15, 123456, tzinfo=dt.UTC)
    return [
        (
            units[i % len(units)].pk,
            campaign.current_version_id,
            "failed" if i % 2 else "succeeded",
            f"message {i} — «quoted» 'text'",
            None if i % 3 == 0 else 2**40 + i,  # a NULL first, then big integers
            start + dt.timedelta(seconds=i),
            start + dt.timedelta(seconds=i, milliseconds=250),
            250,
            {"tokens": i, "truncated": bool(i % 2), "vector_hash": f"{i:016x}", "note": None},
        )
        for i in range(count)
    ]


def test_rows_go_in_whole_and_their_ids_come_back_in_row_order(make_campaign):
    campaign = make_campaign()
    rows = _rows(campaign, 7)
    with CaptureQueriesContext(connection) as queries:
        ids = row_inserts.insert_rows(Attempt, FIELDS, rows)
    # One JSON document on PostgreSQL; 4 + 2 + 1 rows on SQLite (statement_slices).
    assert len(queries.captured_queries) == (1 if connection.vendor == "postgresql" else 3)
    saved = {a.pk: a for a in Attempt.objects.filter(pk__in=ids)}
    # Columns not named take their fields' defaults.
    assert {(a.error_class, a.worker, a.batch_id) for a in saved.values()} == {("", "", None)}
    assert len(saved) == 7
    for pk, row in zip(ids, rows, strict=True):
        attempt = saved[pk]
        # The id names this row's own attempt: values read back equal the row's.
        assert (
            attempt.unit_id,
            attempt.version_id,
            attempt.outcome,
            attempt.error_message,
            attempt.output_size,
            attempt.started_at,
            attempt.finished_at,
            attempt.duration_ms,
            attempt.metrics,
        ) == row


def test_more_rows_than_one_statement_takes_go_in_chunks(make_campaign, monkeypatch):
    campaign = make_campaign()
    columns = len(Attempt._meta.concrete_fields) - 1  # all but the id
    monkeypatch.setattr(row_inserts, "MAX_PARAMS", columns * 4)  # 4 rows a statement
    monkeypatch.setattr(row_inserts, "JSON_ROWS", 4)  # the same on PostgreSQL
    rows = _rows(campaign, 10)
    with CaptureQueriesContext(connection) as queries:
        ids = row_inserts.insert_rows(Attempt, FIELDS, rows)
    assert len(queries.captured_queries) == 3
    assert len(set(ids)) == 10
    by_id = dict(Attempt.objects.filter(pk__in=ids).values_list("pk", "error_message"))
    assert [by_id[pk] for pk in ids] == [row[3] for row in rows]


def test_no_rows_no_statement():
    with CaptureQueriesContext(connection) as queries:
        assert row_inserts.insert_rows(Attempt, FIELDS, []) == []
    assert queries.captured_queries == []


def test_what_a_json_column_cannot_hold_is_refused_on_both_databases(make_campaign):
    """A datetime inside an attempt's metrics is an error, as Django's
    JSONField makes it, not text on one database and an error on the other."""
    campaign = make_campaign()
    row = list(_rows(campaign, 1)[0])
    row[-1] = {"at": dt.datetime(2026, 12, 4, tzinfo=dt.UTC)}
    with pytest.raises(TypeError):
        row_inserts.insert_rows(Attempt, FIELDS, [tuple(row)])
    assert not Attempt.objects.exists()


@pytest.mark.skipif(
    connection.vendor != "sqlite", reason="SQLite's compiled statements; PostgreSQL prepares one"
)
def test_batches_of_any_size_send_statements_of_a_few_texts_their_rows_in_order(make_campaign):
    """SQLite compiles each new statement text (its counter triggers with it):
    a text a row count cost each batch of a new size twice its rows' work."""
    campaign = make_campaign()
    texts = set()
    for count in range(1, 101):
        rows = _rows(campaign, count)
        with connection.execute_wrapper(_texts_into(texts)):
            ids = row_inserts.insert_rows(Attempt, FIELDS, rows)
        by_id = dict(Attempt.objects.filter(pk__in=ids).values_list("pk", "error_message"))
        assert [by_id[pk] for pk in ids] == [row[3] for row in rows]
    assert len(texts) <= 7  # 1, 2, 4, … 64 rows


def _texts_into(texts: set):
    """An execute wrapper that keeps each statement's text, its values apart."""

    def keep(execute, sql, params, many, context):
        texts.add(sql)
        return execute(sql, params, many, context)

    return keep
