"""Unit counts kept by database triggers equal a fresh GROUP BY after every kind of change.

Runs on SQLite (row triggers, one row per key) and PostgreSQL (statement
triggers appending deltas, folded by compaction); CI runs the suite on both.
"""

from __future__ import annotations

import importlib
import threading
from unittest import mock

import pytest
from django.db import connection, connections, transaction
from django.db.models import Count, Sum
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from campaigns import selectors
from campaigns.models import Batch, Campaign, Project, Unit, UnitCount, UnitState
from campaigns.review import queue as review
from campaigns.runs import control, start
from gpuworker.runner.batch import run_batch

HTMX_COUNTS = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "counts"}
postgresql_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="PostgreSQL's statement triggers and row locks"
)


def _fresh() -> dict[tuple[int, str, str], int]:
    """What the counters must say: a GROUP BY over every unit."""
    rows = (
        Unit.objects.values_list("campaign_id", "state", "error_class")
        .annotate(n=Count("pk"))
        .order_by()
    )
    return {(cid, state, error): n for cid, state, error, n in rows}


def _counted() -> dict[tuple[int, str, str], int]:
    rows = (
        UnitCount.objects.values_list("campaign_id", "state", "error_class")
        .annotate(n=Sum("n"))
        .order_by()
    )
    return {(cid, state, error): n for cid, state, error, n in rows if n}


def _assert_counters_match() -> None:
    fresh = _fresh()
    assert _counted() == fresh
    for campaign in Campaign.objects.all():
        counts = selectors.campaign_counts(campaign=campaign)
        mine = {(s, e): n for (cid, s, e), n in fresh.items() if cid == campaign.pk}
        for state in UnitState.values:
            assert getattr(counts, state) == sum(n for (s, _), n in mine.items() if s == state)
        assert counts.by_error == {e: n for (s, e), n in mine.items() if s == UnitState.FAILED}


def _queue(campaign: Campaign, capture) -> None:
    with mock.patch.object(start.celery_app, "send_task"), capture(execute=True):
        start.campaign_run(campaign=campaign)


def _run_queued(campaign: Campaign) -> None:
    queued = Batch.objects.filter(campaign=campaign, state=Batch.State.QUEUED).order_by("pk")
    for pk in queued.values_list("pk", flat=True):
        run_batch(pk)


def test_counts_follow_units_from_import_to_deletion(
    make_campaign, output_root, owner, django_capture_on_commit_callbacks
):
    # import
    texts = make_campaign("texts")
    other = make_campaign("other")
    Campaign.objects.filter(pk=texts.pk).update(checkpoint_after=0)
    texts.refresh_from_db()
    _assert_counters_match()
    assert selectors.campaign_counts(campaign=texts).pending == 39

    # run: pending -> queued
    _queue(texts, django_capture_on_commit_callbacks)
    _assert_counters_match()
    assert selectors.campaign_counts(campaign=texts).queued == 39

    # worker: queued -> running -> succeeded or failed, one UPDATE per unit
    _run_queued(texts)
    _assert_counters_match()
    counts = selectors.campaign_counts(campaign=texts)
    assert (counts.succeeded, counts.failed) == (35, 4)

    # retry: failed -> pending -> queued, and they fail again
    with (
        mock.patch.object(start.celery_app, "send_task"),
        django_capture_on_commit_callbacks(execute=True),
    ):
        control.campaign_resume(campaign=texts, retry_failed=True)
    _assert_counters_match()
    assert selectors.campaign_counts(campaign=texts).failed < 4
    _run_queued(texts)
    _assert_counters_match()

    # review: flagged -> needs_review; rejected -> failed (rejected_by_review);
    # requeued -> pending
    rejected, requeued = Unit.objects.filter(campaign=texts, state=UnitState.SUCCEEDED)[:2]
    for unit, decision in ((rejected, "rejected"), (requeued, "requeued")):
        item = review.unit_flag(unit=unit, user=owner, note="looks wrong")
        _assert_counters_match()
        review.review_decide(item=item, decision=decision, user=owner, note="wrong language")
        _assert_counters_match()
    assert selectors.campaign_counts(campaign=texts).by_error["rejected_by_review"] == 1

    # a raw INSERT ... SELECT, as a COPY-staged importer does, and a raw bulk update
    _copy_units(source=other, target=make_campaign("copied"))
    Unit.objects.filter(campaign__name="copied", uid__startswith="news/").update(
        state=UnitState.FAILED, error_class="input_invalid"
    )
    _assert_counters_match()

    # units deleted one by one, then whole campaigns (Django cascades units first)
    Unit.objects.filter(campaign=texts, uid__startswith="recipes/").delete()
    _assert_counters_match()
    texts.delete()
    Campaign.objects.get(name="copied").delete()
    _assert_counters_match()
    assert set(UnitCount.objects.values_list("campaign_id", flat=True)) == {other.pk}
    assert selectors.campaign_counts(campaign=other).pending == 39


def _copy_units(*, source: Campaign, target: Campaign) -> None:
    """INSERT INTO campaigns_unit ... SELECT: no ORM, no per-row Python."""
    Unit.objects.filter(campaign=target).delete()
    quote = connection.ops.quote_name
    columns = [f.column for f in Unit._meta.concrete_fields if not f.primary_key]
    selected = [
        "%s" if c == "campaign_id" else ("uid || '-copy'" if c == "uid" else quote(c))
        for c in columns
    ]
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO campaigns_unit ({', '.join(map(quote, columns))}) "
            f"SELECT {', '.join(selected)} FROM campaigns_unit WHERE campaign_id = %s",
            [target.pk, source.pk],
        )


def test_an_update_that_changes_no_state_writes_no_count(make_campaign):
    campaign = make_campaign("texts")
    rows = UnitCount.objects.count()
    Unit.objects.filter(campaign=campaign).update(cost=7, category="x")
    assert UnitCount.objects.count() == rows
    _assert_counters_match()


def test_the_migration_backfill_counts_existing_units(make_campaign):
    make_campaign("texts")
    Unit.objects.filter(uid__startswith="news/").update(state=UnitState.SUCCEEDED)
    migration = importlib.import_module("campaigns.migrations.0009_unit_counters")
    UnitCount.objects.all().delete()
    with connection.cursor() as cursor:
        cursor.execute(migration.UNIT_COUNTS.backfill)
    _assert_counters_match()


def test_a_reader_folds_many_deltas_into_one_row_per_key(make_campaign, monkeypatch):
    campaign = make_campaign("texts")
    for unit in Unit.objects.filter(campaign=campaign)[:20]:
        Unit.objects.filter(pk=unit.pk).update(state=UnitState.SUCCEEDED)
    monkeypatch.setattr(selectors, "COMPACT_AFTER_ROWS", 0)
    before = selectors.campaign_counts(campaign=campaign)
    keys = UnitCount.objects.filter(campaign=campaign).values("state", "error_class").distinct()
    assert UnitCount.objects.filter(campaign=campaign).count() == keys.count()
    assert selectors.campaign_counts(campaign=campaign) == before
    assert (before.pending, before.succeeded) == (19, 20)
    _assert_counters_match()


def test_polling_the_counts_never_counts_units(client, owner, make_campaign):
    campaign = make_campaign("texts")
    Unit.objects.filter(campaign=campaign).update(state=UnitState.QUEUED)
    client.force_login(owner)
    url = reverse("campaign_detail", args=[campaign.name])
    for path, extra in ((url, HTMX_COUNTS), (url, {}), (reverse("campaign_list"), {})):
        with CaptureQueriesContext(connection) as queries:
            assert client.get(path, **extra).status_code == 200
        over_units = [
            q["sql"]
            for q in queries.captured_queries
            if '"campaigns_unit"' in q["sql"] and ("GROUP BY" in q["sql"] or "COUNT(" in q["sql"])
        ]
        assert over_units == [], path


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_two_workers_updating_one_campaign_in_opposite_orders_never_wait_on_each_other():
    """With a counter row per state updated in place, A would hold 'pending' and
    B 'succeeded', then each wait for the other's: a deadlock. Appended deltas
    take no lock another writer wants."""
    project = Project.objects.create(name="p")
    campaign = Campaign.objects.create(project=project, name="c", processor="x", input_root="/")
    states = [UnitState.PENDING, UnitState.SUCCEEDED, UnitState.RUNNING, UnitState.FAILED]
    units = Unit.objects.bulk_create(
        Unit(campaign=campaign, uid=f"u{i}", source_path=f"u{i}", state=s)
        for i, s in enumerate(states)
    )
    moves = {
        "a": [(units[0].pk, UnitState.FAILED), (units[2].pk, UnitState.SUCCEEDED)],
        "b": [(units[1].pk, UnitState.RUNNING), (units[3].pk, UnitState.PENDING)],
    }
    both_moved_once = threading.Barrier(2, timeout=20)
    errors: list[BaseException] = []

    def worker(name: str) -> None:
        try:
            with transaction.atomic():
                with connections["default"].cursor() as cursor:
                    cursor.execute("SET LOCAL lock_timeout = '5s'")
                for step, (pk, state) in enumerate(moves[name]):
                    Unit.objects.filter(pk=pk).update(state=state)
                    if step == 0:
                        both_moved_once.wait()
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
            both_moved_once.abort()
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker, args=(name,)) for name in moves]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    _assert_counters_match()
    counts = selectors.campaign_counts(campaign=campaign)
    assert (counts.failed, counts.succeeded, counts.running, counts.pending) == (1, 1, 1, 1)
