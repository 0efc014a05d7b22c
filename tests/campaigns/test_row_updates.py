"""Many units updated with their own values in one statement (campaigns/db/row_updates.py)."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from campaigns.db import row_updates
from campaigns.models import Unit, UnitState
from campaigns.selectors import campaign_counts

pytestmark = pytest.mark.django_db


def test_each_unit_gets_its_own_values_and_the_shared_ones_in_one_statement(make_campaign):
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
    assert len(queries.captured_queries) == 1
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
