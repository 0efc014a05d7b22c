"""Open review items counted by database triggers equal a fresh COUNT after every kind of change.

Runs on SQLite (row triggers, one row per campaign) and PostgreSQL (statement
triggers appending deltas, folded by compaction); CI runs the suite on both.
"""

from __future__ import annotations

import importlib

import pytest
from django.db import connection
from django.db.models import Count, Sum

from campaigns import selectors
from campaigns.models import Campaign, ReviewCount, ReviewItem, Unit
from campaigns.review import queue as review

OPEN = ReviewItem.State.OPEN


def _fresh() -> dict[int, int]:
    rows = (
        ReviewItem.objects.filter(state=OPEN)
        .values_list("campaign_id")
        .annotate(n=Count("pk"))
        .order_by()
    )
    return dict(rows)


def _counted() -> dict[int, int]:
    rows = ReviewCount.objects.values_list("campaign_id").annotate(n=Sum("n")).order_by()
    return {cid: n for cid, n in rows if n}


def _assert_counters_match() -> None:
    fresh = _fresh()
    assert _counted() == fresh
    for campaign in Campaign.objects.all():
        assert selectors.open_review_items(campaign=campaign) == fresh.get(campaign.pk, 0)


def _flag(campaign: Campaign, owner, n: int) -> list[ReviewItem]:
    units = Unit.objects.filter(campaign=campaign).order_by("pk")[:n]
    return [review.unit_flag(unit=unit, user=owner, note="looks wrong") for unit in units]


def test_open_review_counts_follow_flags_decisions_and_deletion(make_campaign, owner):
    texts, other = make_campaign("texts"), make_campaign("other")
    _assert_counters_match()
    assert selectors.open_review_items(campaign=texts) == 0

    # manual flags, one statement each; the page shows the number
    items = _flag(texts, owner, 6)
    _flag(other, owner, 2)
    _assert_counters_match()
    assert selectors.open_review_items(campaign=texts) == 6

    # each decision closes one; a decided item edited again changes nothing
    review.review_decide(item=items[0], decision="accepted", user=owner)
    review.review_decide(item=items[1], decision="rejected", user=owner, note="wrong language")
    review.review_decide(item=items[2], decision="requeued", user=owner)
    ReviewItem.objects.filter(pk=items[0].pk).update(note="edited later")
    _assert_counters_match()
    assert selectors.open_review_items(campaign=texts) == 3

    # a bulk accept, a bulk insert (as the batch runner's flag rules write),
    # a raw reopen of every item of a campaign
    review.review_bulk_accept(items=ReviewItem.objects.filter(pk=items[3].pk), user=owner)
    unit = Unit.objects.filter(campaign=other).order_by("-pk").first()
    ReviewItem.objects.bulk_create(
        ReviewItem(campaign=other, unit=unit, version=other.current_version, reason=f"rule-{i}")
        for i in range(5)
    )
    _assert_counters_match()
    ReviewItem.objects.filter(campaign=texts).update(state=OPEN)
    _assert_counters_match()
    assert selectors.open_review_items(campaign=texts) == 6

    # items deleted with their unit, then a whole campaign
    Unit.objects.filter(pk=items[5].unit_id).delete()
    _assert_counters_match()
    texts.delete()
    _assert_counters_match()
    assert set(ReviewCount.objects.values_list("campaign_id", flat=True)) == {other.pk}
    assert selectors.open_review_items(campaign=other) == 7


def test_the_campaign_page_shows_the_counted_open_items(client, owner, make_campaign):
    campaign = make_campaign("texts")
    _flag(campaign, owner, 3)
    client.force_login(owner)
    html = client.get(f"/campaigns/{campaign.name}/").content.decode()
    assert 'id="open-review-items">3 open review items</a>' in html


def test_the_migration_backfill_counts_existing_open_items(make_campaign, owner):
    campaign = make_campaign("texts")
    items = _flag(campaign, owner, 4)
    review.review_decide(item=items[0], decision="accepted", user=owner)
    migration = importlib.import_module("campaigns.migrations.0016_review_counters")
    ReviewCount.objects.all().delete()
    with connection.cursor() as cursor:
        cursor.execute(migration.OPEN_REVIEW_ITEMS.backfill)
    _assert_counters_match()
    assert selectors.open_review_items(campaign=campaign) == 3


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's delta rows")
def test_compaction_folds_a_campaigns_deltas_into_one_row(make_campaign, owner):
    campaign = make_campaign("texts")
    items = _flag(campaign, owner, 10)
    for item in items[:4]:
        review.review_decide(item=item, decision="accepted", user=owner)
    with connection.cursor() as cursor:
        cursor.execute("SELECT campaigns_reviewcount_compact(%s)", [campaign.pk])
    assert list(ReviewCount.objects.filter(campaign=campaign).values_list("n", flat=True)) == [6]
    _assert_counters_match()
