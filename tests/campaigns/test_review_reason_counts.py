"""Review items counted per campaign, state and reason by database triggers
(migration 0023_review_reason_counters) equal a fresh GROUP BY after every kind
of change, and the review queue shows the same counts as counting the items.

Runs on SQLite (row triggers, one row per key) and PostgreSQL (statement
triggers appending deltas, folded by compaction); CI runs the suite on both.
"""

from __future__ import annotations

import importlib
import re

import pytest
from django.db import connection
from django.db.models import Count, Sum
from django.template.loader import render_to_string

from campaigns.models import Campaign, ReviewItem, ReviewReasonCount, Unit, UnitState
from campaigns.review import queue as review
from campaigns.runs import setup
from campaigns.specs import processors as processor_specs
from campaigns.templatetags.campaign_extras import review_rows
from campaigns.web.review_views import Filters

QUEUE = "/review/"


def _fresh() -> dict[tuple[int, str, str], int]:
    rows = (
        ReviewItem.objects.values_list("campaign_id", "state", "reason")
        .annotate(n=Count("pk"))
        .order_by()
    )
    return {(cid, state, reason): n for cid, state, reason, n in rows}


def _counted() -> dict[tuple[int, str, str], int]:
    rows = (
        ReviewReasonCount.objects.values_list("campaign_id", "state", "reason")
        .annotate(n=Sum("n"))
        .order_by()
    )
    return {(cid, state, reason): n for cid, state, reason, n in rows if n}


def _assert_counters_match() -> None:
    assert _counted() == _fresh()
    for campaign in Campaign.objects.all():
        for state in (*ReviewItem.State.values, None):
            items = ReviewItem.objects.filter(campaign=campaign)
            if state is not None:
                items = items.filter(state=state)
            kept = review.reason_counts_kept(campaign_ids=[campaign.pk], state=state)
            assert kept == review.reason_counts(items=items), (campaign.name, state)


def _flag(campaign: Campaign, owner, n: int) -> list[ReviewItem]:
    units = Unit.objects.filter(campaign=campaign).order_by("pk")[:n]
    return [review.unit_flag(unit=unit, user=owner, note="looks wrong") for unit in units]


def test_reason_counts_follow_flags_decisions_and_deletion(make_campaign, owner):
    texts, other = make_campaign("texts"), make_campaign("other")
    _assert_counters_match()
    assert review.reason_counts_kept(campaign_ids=[texts.pk], state="open") == {}

    # created: manual flags one statement each, rule flags in one bulk insert
    items = _flag(texts, owner, 6)
    _flag(other, owner, 2)
    unit = Unit.objects.filter(campaign=texts).order_by("-pk").first()
    ReviewItem.objects.bulk_create(
        ReviewItem(campaign=texts, unit=unit, version=texts.current_version, reason=reason)
        for reason in ("truncated", "truncated", "abnormal_norm")
    )
    _assert_counters_match()
    assert review.reason_counts_kept(campaign_ids=[texts.pk], state="open") == {
        "abnormal_norm": 1,
        "manual": 6,
        "truncated": 2,
    }
    assert review.reason_counts_kept(campaign_ids=[texts.pk, other.pk], state="open") == {
        "abnormal_norm": 1,
        "manual": 8,
        "truncated": 2,
    }

    # decided: each decision moves one item from open to its state; an undo back
    review.review_decide(item=items[0], decision="accepted", user=owner)
    review.review_decide(item=items[1], decision="rejected", user=owner, note="wrong language")
    review.review_decide(item=items[2], decision="requeued", user=owner)
    review.review_decide(item=items[2], decision="open", user=owner)
    ReviewItem.objects.filter(pk=items[0].pk).update(note="edited later")
    _assert_counters_match()
    assert review.reason_counts_kept(campaign_ids=[texts.pk], state="accepted") == {"manual": 1}
    assert review.reason_counts_kept(campaign_ids=[texts.pk], state=None)["manual"] == 6

    # a bulk accept, a reason changed in place, a raw reopen of a whole campaign
    review.review_bulk_accept(items=ReviewItem.objects.filter(pk__in=[items[3].pk]), user=owner)
    ReviewItem.objects.filter(campaign=texts, reason="abnormal_norm").update(reason="truncated")
    _assert_counters_match()
    ReviewItem.objects.filter(campaign=texts).update(state="open")
    _assert_counters_match()

    # deleted with their unit, then a whole campaign
    Unit.objects.filter(pk=items[5].unit_id).delete()
    _assert_counters_match()
    texts.delete()
    _assert_counters_match()
    assert set(ReviewReasonCount.objects.values_list("campaign_id", flat=True)) == {other.pk}


def test_the_migration_backfill_counts_existing_items(make_campaign, owner):
    campaign = make_campaign("texts")
    items = _flag(campaign, owner, 4)
    review.review_decide(item=items[0], decision="accepted", user=owner)
    migration = importlib.import_module("campaigns.migrations.0023_review_reason_counters")
    ReviewReasonCount.objects.all().delete()
    with connection.cursor() as cursor:
        cursor.execute(migration.REVIEW_ITEMS_BY_REASON.backfill)
    _assert_counters_match()
    assert review.reason_counts_kept(campaign_ids=[campaign.pk], state="open") == {"manual": 3}


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's delta rows")
def test_compaction_folds_a_campaigns_deltas_into_one_row_per_key(make_campaign, owner):
    campaign = make_campaign("texts")
    items = _flag(campaign, owner, 10)
    for item in items[:4]:
        review.review_decide(item=item, decision="accepted", user=owner)
    with connection.cursor() as cursor:
        cursor.execute("SELECT campaigns_reviewreasoncount_compact(%s)", [campaign.pk])
    rows = ReviewReasonCount.objects.filter(campaign=campaign).values_list("state", "reason", "n")
    assert sorted(rows) == [("accepted", "manual", 4), ("open", "manual", 6)]
    _assert_counters_match()


# --- after reruns ----------------------------------------------------------------


@pytest.fixture
def stats(settings, project, corpus, output_root, run_here) -> Campaign:
    """The demo texts through the text-stats plugin (no model), without a checkpoint."""
    settings.BRIEFGPU_PROCESSORS = ["tests.plugins.text_stats.SPEC"]
    processor_specs._registry.cache_clear()
    campaign, _ = setup.campaign_create(
        name="stats",
        processor="text-stats",
        project=project,
        input_folder=corpus,
        checkpoint_after=0,
        holdout_share=0,
    )
    run_here(campaign)
    yield campaign
    processor_specs._registry.cache_clear()


def test_reason_counts_stay_right_across_a_requeue_and_a_rerun(stats, owner, run_here):
    unit = Unit.objects.get(campaign=stats, uid="news/solar-farm.txt")
    old = review.unit_flag(unit=unit, user=owner, note="v1 looks off")
    review.review_decide(item=old, decision="requeued", user=owner)
    _assert_counters_match()

    # a new version, the requeued unit run again under it, flagged again
    setup.version_create(
        campaign=stats, params={**stats.current_version.params, "lowercase": "yes"}
    )
    stats.refresh_from_db()
    run_here(stats)
    assert Unit.objects.get(pk=unit.pk).state == UnitState.SUCCEEDED
    _assert_counters_match()
    new = review.unit_flag(unit=unit, user=owner, note="and v2?")
    review.review_decide(item=new, decision="accepted", user=owner)
    review.review_decide(item=old, decision="open", user=owner)
    _assert_counters_match()
    assert review.reason_counts_kept(campaign_ids=[stats.pk], state="open") == {"manual": 1}
    assert review.reason_counts_kept(campaign_ids=[stats.pk], state="accepted") == {"manual": 1}


# --- the queue page ----------------------------------------------------------------


def _reasons_shown(html: str) -> dict[str, int]:
    found = re.findall(r'data-reason="([^"]+)"[^>]*>[^<]*<span class="count">(\d+)</span>', html)
    return {reason: int(n) for reason, n in found}


def test_the_queue_shows_the_counted_reasons_for_every_filter(client, owner, make_campaign):
    texts, other = make_campaign("texts"), make_campaign("other")
    Unit.objects.filter(campaign=texts, uid__startswith="news/").update(category="news")
    items = _flag(texts, owner, 5) + _flag(other, owner, 2)
    units = Unit.objects.filter(campaign=texts).order_by("pk")[:3]
    ReviewItem.objects.bulk_create(
        ReviewItem(campaign=texts, unit=u, version=texts.current_version, reason="truncated")
        for u in units
    )
    review.review_decide(item=items[0], decision="accepted", user=owner)
    review.review_decide(item=items[1], decision="rejected", user=owner, note="no")
    client.force_login(owner)

    for params in (
        {},
        {"campaign": "texts"},
        {"campaign": "texts", "state": "accepted"},
        {"campaign": "texts", "state": "all"},
        {"campaign": "texts", "reason": "truncated"},
        {"campaign": "texts", "category": "news"},
        {"state": "all"},
        {"campaign": "nonesuch"},
    ):
        html = client.get(QUEUE, params).content.decode()
        items = ReviewItem.objects.filter(campaign__project__members=owner)
        if params.get("campaign"):
            items = items.filter(campaign__name=params["campaign"])
        if params.get("category"):
            items = items.filter(unit__category=params["category"])
        state = params.get("state", "open")
        if state != "all":
            items = items.filter(state=state)
        counted = review.reason_counts(items=items)
        assert _reasons_shown(html) == counted, params
        total = counted.get(params["reason"], 0) if "reason" in params else sum(counted.values())
        assert f"<h2>{total} item" in html, params


def test_the_queue_rows_are_the_markup_of_the_row_partial(rf, make_campaign, owner):
    campaign = make_campaign("texts")
    items = _flag(campaign, owner, 3)
    filters = Filters(campaign="texts", reason="manual")
    rows = ReviewItem.objects.filter(campaign=campaign).order_by("pk")
    tuples = rows.values_list("pk", "state", "reason", "campaign__name", "unit__uid")
    for current in (None, items[1]):
        partial = "".join(
            render_to_string(
                "campaigns/review_queue.html#queue-row",
                {"row": row, "filters": filters, "item": current},
            )
            for row in rows.select_related("campaign", "unit")
        )
        assert str(review_rows(list(tuples), filters.item_prefix, current)) == partial
