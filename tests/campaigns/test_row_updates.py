"""Many units updated with their own values in one statement (campaigns/db/row_updates.py)."""

from __future__ import annotations

import datetime as dt
import math

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from campaigns.db import row_updates
from campaigns.models import Batch, Unit, UnitState
from campaigns.selectors import campaign_counts

pytestmark = pytest.mark.django_db


def test_each_unit_gets_its_own_values_and_the_shared_ones(make_campaign):
    campaign = make_campaign()
    first, second, third = Unit.objects.filter(campaign=campaign).order_by("pk")[:3]
    stamp = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)
    fields = ["state", "error_class", "output_size"]
    with CaptureQueriesContext(connection) as queries:
        row_updates.update_rows(
            Unit,
            fields,
            [
                # A NULL first: PostgreSQL must not type the column as text from it.
                (first.pk, UnitState.FAILED, "input_invalid", None),
                (second.pk, UnitState.SUCCEEDED, "", 1664),
                (third.pk, UnitState.SUCCEEDED, "", 2**40),
            ],
            also={"updated_at": stamp},
        )
    # One JSON document on PostgreSQL; 2 + 1 rows on SQLite (row_inserts.statement_slices).
    assert len(queries.captured_queries) == (1 if connection.vendor == "postgresql" else 2)
    got = {
        u.pk: (u.state, u.error_class, u.output_size, u.updated_at)
        for u in Unit.objects.filter(pk__in=[first.pk, second.pk, third.pk])
    }
    assert got == {
        first.pk: (UnitState.FAILED, "input_invalid", None, stamp),
        second.pk: (UnitState.SUCCEEDED, "", 1664, stamp),
        third.pk: (UnitState.SUCCEEDED, "", 2**40, stamp),
    }
    # The counters saw the change (triggers fire on this UPDATE like any other).
    counts = campaign_counts(campaign=campaign)
    assert (counts.succeeded, counts.failed) == (2, 1)


def test_more_rows_than_one_statement_takes_go_in_chunks(make_campaign, monkeypatch):
    campaign = make_campaign()
    units = list(Unit.objects.filter(campaign=campaign).order_by("pk"))
    monkeypatch.setattr(row_updates, "CHUNK_ROWS", 4)
    row_updates.update_rows(Unit, ["cost"], [(u.pk, 10 + i) for i, u in enumerate(units)])
    costs = Unit.objects.filter(campaign=campaign).order_by("pk").values_list("cost", flat=True)
    assert list(costs) == [10 + i for i in range(len(units))]


def test_values_that_are_hard_to_carry_arrive_exactly(make_campaign):
    """Text with quotes, backslashes, newlines and non-Latin letters, the
    largest integers, floats to the last bit (and the ones that are not
    numbers), microseconds and NULLs: on PostgreSQL the rows travel as one
    JSON document and each value is cast back to its column's type."""
    campaign = make_campaign()
    Batch.objects.bulk_create(
        Batch(campaign=campaign, version_id=campaign.current_version_id, size=1) for _ in range(5)
    )
    batches = list(Batch.objects.filter(campaign=campaign).order_by("pk"))
    when = dt.datetime(2026, 12, 4, 23, 59, 59, 999999, tzinfo=dt.UTC)
    texts = ['a "quoted" \\ back\\slash', "line\nbreak\ttab", "日本語 — ümlaut ✓", "", "{1,2}"]
    floats = [0.1 + 0.2, 1e-308, float("nan"), float("inf"), -float("inf")]
    rows = [
        (b.pk, texts[i], floats[i], 2**62 + i if i % 2 else None, when - dt.timedelta(days=i))
        for i, b in enumerate(batches)
    ]
    row_updates.update_rows(Batch, ["error", "compute_seconds", "real_tokens", "finished_at"], rows)
    got = {
        b.pk: (b.error, b.compute_seconds, b.real_tokens, b.finished_at)
        for b in Batch.objects.filter(pk__in=[b.pk for b in batches])
    }
    for pk, text, number, tokens, finished in rows:
        error, seconds, real_tokens, at = got[pk]
        assert (error, real_tokens, at) == (text, tokens, finished)
        if math.isnan(number):
            # SQLite has no NaN: it stores NULL.
            assert seconds is None if connection.vendor == "sqlite" else math.isnan(seconds)
        else:
            assert seconds == number


def test_a_value_is_made_as_its_field_makes_it(make_campaign):
    """A weight of 12.0 from a user's cost function lands in the integer
    column as 12, as the ORM would save it."""
    campaign = make_campaign()
    unit = Unit.objects.filter(campaign=campaign).order_by("pk").first()
    row_updates.update_rows(Unit, ["cost"], [(unit.pk, 12.0)])
    unit.refresh_from_db()
    assert unit.cost == 12 and isinstance(unit.cost, int)


@pytest.mark.skipif(
    connection.vendor != "sqlite", reason="SQLite's compiled statements; PostgreSQL prepares one"
)
def test_batches_of_any_size_update_in_statements_of_a_few_texts(make_campaign):
    campaign = make_campaign()
    units = list(Unit.objects.filter(campaign=campaign).order_by("pk"))
    texts = set()
    for count in range(1, len(units) + 1):
        with connection.execute_wrapper(_texts_into(texts)):
            row_updates.update_rows(
                Unit, ["cost"], [(u.pk, count * 100 + i) for i, u in enumerate(units[:count])]
            )
        costs = [
            u.cost for u in Unit.objects.filter(pk__in=[u.pk for u in units[:count]]).order_by("pk")
        ]
        assert costs == [count * 100 + i for i in range(count)]
    assert len(texts) <= max(1, len(units)).bit_length()


def _texts_into(texts: set):
    """An execute wrapper that keeps each statement's text, its values apart."""

    def keep(execute, sql, params, many, context):
        texts.add(sql)
        return execute(sql, params, many, context)

    return keep
