"""The statements every page view and batch sends, bound by the server and
prepared on PostgreSQL (campaigns/db/prepared.py): kept with their plans, and
those plans still reading the partial indexes they were written for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import NotSupportedError, connection
from django.test.utils import CaptureQueriesContext

from campaigns.db import page_queries, prepared
from campaigns.models import ErrorClass, Unit, UnitState

ROOT = Path(__file__).resolve().parents[2]
postgresql = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="PostgreSQL's prepared statements"
)


@pytest.fixture
def failed(make_campaign):
    campaign = make_campaign("prepared")
    Unit.objects.filter(campaign=campaign).update(
        state=UnitState.FAILED, error_class=ErrorClass.TIMEOUT, error_message="too slow"
    )
    return campaign


def _prepared(starting: str) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT name FROM pg_prepared_statements WHERE statement LIKE %s",
            [starting + "%"],
        )
        return [name for (name,) in cursor.fetchall()]


@postgresql
def test_a_page_statement_is_prepared_after_a_few_views_and_answers_the_same(
    owner, failed, settings
):
    first = page_queries.failed_unit_rows(campaign_id=failed.pk, limit=10)
    assert first and all(error == ErrorClass.TIMEOUT for _, error, _ in first)
    assert not _prepared("SELECT uid, error_class, error_message")
    with CaptureQueriesContext(connection) as queries:
        for _ in range(6):
            again = page_queries.failed_unit_rows(campaign_id=failed.pk, limit=10)
            assert again == first
        page = page_queries.campaign_page(user=owner, name=failed.name)
    # Prepared on the connection, and still in the queries log.
    assert len(_prepared("SELECT uid, error_class, error_message")) == 1
    assert len(queries.captured_queries) == 7
    assert page is not None and page.campaign.pk == failed.pk


@postgresql
def test_a_generic_plan_still_reads_the_failed_units_and_done_batches_indexes(failed):
    # A prepared statement may be run with a plan made without its values:
    # the partial indexes' conditions are in its text, not its parameters.
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cursor.execute("SET LOCAL enable_seqscan = off")
    for _ in range(6):
        page_queries.failed_unit_rows(campaign_id=failed.pk, limit=10)
        page_queries.newest_finished_batch(campaign_id=failed.pk)
    plans = {}
    for label, starting, args in (
        ("failed", "SELECT uid, error_class, error_message", f"{failed.pk}"),
        ("done", "SELECT finished_at FROM campaigns_batch", f"{failed.pk}"),
    ):
        (name,) = _prepared(starting)
        with connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN EXECUTE {name}({args})")
            plans[label] = "\n".join(row[0] for row in cursor.fetchall())
    assert "unit_campaign_error_id" in plans["failed"], plans["failed"]
    # Either index of the done batches (both partial on state = 'done').
    assert "batch_done_finished" in plans["done"] or "batch_done_recent" in plans["done"], plans[
        "done"
    ]


@postgresql
def test_without_preparing_the_statements_still_answer(owner, failed, settings):
    settings.DATABASE_PREPARE_AFTER = 0
    for _ in range(6):
        rows = page_queries.failed_unit_rows(campaign_id=failed.pk, limit=10)
    assert len(rows) == min(10, Unit.objects.filter(campaign=failed).count())
    assert not _prepared("SELECT uid, error_class, error_message")


@postgresql
def test_what_djangos_own_cursors_send_is_neither_counted_nor_prepared(failed):
    page_queries.failed_unit_rows(campaign_id=failed.pk, limit=10)
    for _ in range(10):
        list(Unit.objects.filter(campaign=failed).values_list("uid", flat=True))
    assert connection.connection.prepare_threshold is None
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements")
        assert cursor.fetchone()[0] == 0


@postgresql
def test_a_column_changed_under_a_prepared_statement_fails_one_request_only(
    transactional_db, make_campaign, owner
):
    # given: the first failures' statement prepared on this connection, then
    # another session (a migration) changes a column it reads
    import psycopg

    campaign = make_campaign("altered")
    Unit.objects.filter(campaign=campaign).update(state=UnitState.FAILED, error_class="timeout")
    for _ in range(6):
        page_queries.failed_unit_rows(campaign_id=campaign.pk, limit=10)
    assert _prepared("SELECT uid, error_class, error_message")
    params = connection.get_connection_params()
    with psycopg.connect(**params, autocommit=True) as other:
        other.execute("ALTER TABLE campaigns_unit ALTER COLUMN uid TYPE varchar(1001)")
    try:
        # when: the next request sends it, it fails once (PostgreSQL's words)
        with pytest.raises(NotSupportedError, match=prepared.CHANGED_RESULT):
            page_queries.failed_unit_rows(campaign_id=campaign.pk, limit=10)
        # then: the request after it opens a fresh connection and is answered
        rows = page_queries.failed_unit_rows(campaign_id=campaign.pk, limit=10)
        assert rows and all(error == "timeout" for _, error, _ in rows)
    finally:
        connection.close()
        with psycopg.connect(**params, autocommit=True) as other:
            other.execute("ALTER TABLE campaigns_unit ALTER COLUMN uid TYPE varchar(1000)")


@pytest.mark.parametrize(("value", "threshold"), [("", 5), ("3", 3), ("0", 0)])
def test_database_prepare_after_sets_when_postgresql_prepares(value, threshold):
    env = {
        **os.environ,
        "DATABASE_URL": "postgres://nobody@127.0.0.1:1/none",
        "DJANGO_SETTINGS_MODULE": "portal.settings",
        "DATABASE_PREPARE_AFTER": value,
    }
    if not value:
        del env["DATABASE_PREPARE_AFTER"]
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, django; django.setup(); from django.conf import settings; "
            "print(json.dumps([settings.DATABASE_PREPARE_AFTER, "
            "settings.DATABASES['default'].get('OPTIONS', {})]))",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    after, options = json.loads(out.stdout.strip().splitlines()[-1])
    assert after == threshold
    # The connection's own threshold stays Django's (none), and its cursors
    # keep binding in Python: any number of parameters.
    assert "prepare_threshold" not in options and "server_side_binding" not in options
