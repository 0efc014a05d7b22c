"""Correction effort: time per decision (idle gaps left out), shares per reason
and category, reviewer throughput beside production, the backlog's time to clear."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from campaigns.models import Batch, Campaign, ReviewDecision, ReviewItem, Unit, UnitState
from campaigns.review import effort, reasons
from campaigns.review import queue as review

Item = ReviewItem.State


@pytest.fixture
def campaign(make_campaign) -> Campaign:
    return make_campaign("texts")


def _items(campaign: Campaign, n: int, *, reason: str = "manual", category: str = "") -> list:
    """n items on units not reviewed yet, their units in this category."""
    taken = ReviewItem.objects.filter(campaign=campaign).values("unit_id")
    units = list(Unit.objects.filter(campaign=campaign).exclude(pk__in=taken).order_by("pk")[:n])
    Unit.objects.filter(pk__in=[u.pk for u in units]).update(
        category=category, state=UnitState.NEEDS_REVIEW
    )
    return [
        ReviewItem.objects.create(
            campaign=campaign,
            unit=unit,
            version=campaign.current_version,
            source=ReviewItem.Source.SPOT_CHECK if reason == "spot_check" else "rule",
            reason=reason,
        )
        for unit in units
    ]


def _decide(item, decision, user, *, seconds=None, **extra):
    shown = timezone.now() - timedelta(seconds=seconds) if seconds is not None else None
    return review.review_decide(
        item=item,
        decision=decision,
        user=user,
        shown_at=shown,
        note=extra.pop("note", "x"),
        **extra,
    )


def _batch(campaign: Campaign, start: float, end: float, size: int) -> Batch:
    t0 = timezone.now().replace(microsecond=0) - timedelta(days=1)
    return Batch.objects.create(
        campaign=campaign,
        version=campaign.current_version,
        size=size,
        state=Batch.State.DONE,
        started_at=t0 + timedelta(seconds=start),
        finished_at=t0 + timedelta(seconds=end),
    )


# --- time per decision -------------------------------------------------------------


def test_a_decision_records_the_seconds_from_the_item_shown(campaign, owner):
    (item,) = _items(campaign, 1)

    _decide(item, Item.ACCEPTED, owner, seconds=12)

    decision = ReviewDecision.objects.get(item=item)
    assert decision.seconds == pytest.approx(12, abs=1)
    assert decision.bulk is False


def test_a_decision_over_the_idle_limit_is_left_out_of_the_review_time(campaign, owner, settings):
    # given: the idle limit at 5 minutes; two decisions of 10 and 20 s, and one
    # taken an hour after its item was shown (the reviewer went to lunch)
    settings.REVIEW_IDLE_SECONDS = 300
    first, second, third = _items(campaign, 3)
    _decide(first, Item.ACCEPTED, owner, seconds=10)
    _decide(second, Item.ACCEPTED, owner, seconds=20)
    _decide(third, Item.ACCEPTED, owner, seconds=3600)

    # when
    figures = effort.review_effort(campaign=campaign)

    # then: the hour is excluded (not capped): 30 s of review for 2 timed decisions
    assert (figures.decisions, figures.timed, figures.idle) == (3, 2, 1)
    assert figures.active_seconds == pytest.approx(30, abs=1)
    assert figures.mean_seconds == pytest.approx(15, abs=0.5)
    assert figures.per_hour == pytest.approx(240, rel=0.05)  # 2 decisions in 30 s
    # the limit is read when measuring: raised, the hour counts
    settings.REVIEW_IDLE_SECONDS = 7200
    assert effort.review_effort(campaign=campaign).timed == 3


def test_bulk_accepts_are_marked_bulk_and_never_timed(campaign, owner):
    _items(campaign, 3)

    accepted = review.review_bulk_accept(
        items=ReviewItem.objects.filter(campaign=campaign), user=owner
    )

    figures = effort.review_effort(campaign=campaign)
    assert accepted == 3
    assert set(ReviewDecision.objects.values_list("bulk", "seconds")) == {(True, None)}
    assert (figures.decisions, figures.bulk, figures.timed, figures.untimed) == (3, 3, 0, 0)
    assert figures.per_hour is None


def test_an_undo_is_counted_apart_and_not_timed(campaign, owner):
    (item,) = _items(campaign, 1)
    _decide(item, Item.REJECTED, owner, seconds=5, note="blurred")

    _decide(item, Item.OPEN, owner, seconds=2)

    figures = effort.review_effort(campaign=campaign)
    assert (figures.decisions, figures.reopened, figures.timed) == (1, 1, 1)
    assert ReviewDecision.objects.get(to_state=Item.OPEN).seconds is None


def test_the_show_time_is_believed_only_signed_and_for_its_own_item():
    token = effort.shown_token(41)

    assert effort.shown_at(token, 41) is not None
    assert effort.shown_at(token, 42) is None  # another item's form
    assert effort.shown_at(token[:-2] + "xx", 41) is None  # tampered
    assert effort.shown_at("", 41) is None


# --- shares ------------------------------------------------------------------------


def test_shares_per_flag_reason_and_per_category(campaign, owner):
    # given: 4 truncated items in news (2 accepted, 1 rejected, 1 requeued) and
    # 2 spot checks in recipes (1 accepted, 1 open)
    news = _items(campaign, 4, reason="truncated", category="news")
    recipes = _items(campaign, 2, reason="spot_check", category="recipes")
    for item, decision in zip(
        news, (Item.ACCEPTED, Item.ACCEPTED, Item.REJECTED, Item.REQUEUED), strict=True
    ):
        _decide(item, decision, owner, seconds=4)
    _decide(recipes[0], Item.ACCEPTED, owner, seconds=4)

    # when
    figures = effort.review_effort(campaign=campaign)

    # then
    reasons_ = {row.key: row for row in figures.by_reason}
    truncated = reasons_["truncated"]
    assert (truncated.items, truncated.accepted, truncated.rejected, truncated.requeued) == (
        4,
        2,
        1,
        1,
    )
    assert (truncated.accepted_share, truncated.rejected_share) == (0.5, 0.25)
    assert truncated.label == "input truncated beyond the allowed share"
    spot = reasons_["spot_check"]
    assert (spot.open, spot.accepted, spot.accepted_share) == (1, 1, 1.0)
    categories = {row.key: row for row in figures.by_category}
    assert categories["news"].requeued_share == 0.25
    assert (categories["recipes"].items, categories["recipes"].rejected_share) == (2, 0.0)
    # spot checks are one sample a version, not what production makes to review
    assert (figures.flagged, figures.backlog) == (4, 1)


def test_rejections_count_per_reason_from_the_campaigns_list(campaign, owner):
    # given: the campaign's own list
    reasons.reject_reasons_set(campaign=campaign, text="wrong label\n  blurred  \nwrong label\n")
    assert reasons.reject_reasons(campaign) == ["wrong label", "blurred"]
    first, second, third, fourth = _items(campaign, 4)

    # when: three rejections with a reason from the list (one with a note beside
    # it), one with a note alone
    _decide(first, Item.REJECTED, owner, reject_reason="wrong label", note="")
    _decide(second, Item.REJECTED, owner, reject_reason="wrong label", note="a cat, not a dog")
    _decide(third, Item.REJECTED, owner, reject_reason="blurred", note="")
    _decide(fourth, Item.REJECTED, owner, note="cropped badly")

    # then
    figures = effort.review_effort(campaign=campaign)
    assert figures.rejected == 4
    assert figures.reject_reasons == [("wrong label", 2), ("", 1), ("blurred", 1)]
    second.refresh_from_db()
    assert second.reject_reason == "wrong label"
    unit = Unit.objects.get(pk=second.unit_id)
    assert unit.error_message == "rejected in review (manual): wrong label: a cat, not a dog"


def test_a_reject_reason_must_be_on_the_list_and_a_rejection_needs_one_or_a_note(campaign, owner):
    (item,) = _items(campaign, 1)
    with pytest.raises(ValidationError, match="not one of this campaign's reject reasons"):
        _decide(item, Item.REJECTED, owner, reject_reason="made up", note="")
    with pytest.raises(ValidationError, match="a rejection needs a reason"):
        _decide(item, Item.REJECTED, owner, note=" ")
    assert ReviewItem.objects.get(pk=item.pk).state == Item.OPEN

    # the default list serves a campaign that has none of its own
    _decide(item, Item.REJECTED, owner, reject_reason=reasons.DEFAULT_REJECT_REASONS[0], note="")
    # reopened, the item no longer counts as rejected for that reason
    _decide(item, Item.OPEN, owner)
    assert ReviewItem.objects.get(pk=item.pk).reject_reason is None


def test_an_empty_list_of_reject_reasons_restores_the_default(campaign):
    reasons.reject_reasons_set(campaign=campaign, text="one")
    reasons.reject_reasons_set(campaign=campaign, text="\n  \n")
    assert reasons.reject_reasons(campaign) == list(reasons.DEFAULT_REJECT_REASONS)
    with pytest.raises(ValidationError, match="at most"):
        reasons.reject_reasons_clean("\n".join(f"r{i}" for i in range(21)))


# --- throughput, production, backlog ----------------------------------------------


def test_production_rate_counts_the_time_batches_ran_leaving_out_long_gaps(campaign, settings):
    # given: two workers' overlapping batches (0-60 s and 30-90 s), then after an
    # hour at the checkpoint one more (3690-3750 s): 150 s of production
    settings.REVIEW_IDLE_SECONDS = 300
    _batch(campaign, 0, 60, size=10)
    _batch(campaign, 30, 90, size=10)
    _batch(campaign, 3690, 3750, size=10)
    # a batch still running counts neither units nor time
    Batch.objects.create(
        campaign=campaign, version=campaign.current_version, size=50, state="running"
    )

    figures = effort.review_effort(campaign=campaign)

    assert figures.units_processed == 30
    assert figures.production_seconds == pytest.approx(150, abs=0.01)
    assert figures.production_per_hour == pytest.approx(720, rel=0.001)  # 30 units in 150 s


def test_backlog_time_to_clear_and_whether_review_keeps_up(campaign, owner, settings):
    # given: production of 100 units in 100 s (3600 units/h) that flagged 10
    # (10%: 360 items/h to review); a reviewer deciding 4 of them at 10 s each
    # (360 items/h of active time); 6 still open
    settings.REVIEW_IDLE_SECONDS = 300
    _batch(campaign, 0, 100, size=100)
    items = _items(campaign, 10, reason="truncated")
    for item in items[:4]:
        _decide(item, Item.ACCEPTED, owner, seconds=10)

    figures = effort.review_effort(campaign=campaign)

    assert figures.per_hour == pytest.approx(360, rel=0.05)
    assert figures.flagged_per_unit == pytest.approx(0.10)
    assert figures.inflow_per_hour == pytest.approx(360, rel=0.001)
    assert figures.backlog == 6
    assert figures.hours_to_clear == pytest.approx(6 / 360, rel=0.05)  # one minute
    assert figures.reviewer_share == pytest.approx(1.0, rel=0.05)
    # twice as slow a reviewer does not keep up
    ReviewDecision.objects.update(seconds=20)
    slower = effort.review_effort(campaign=campaign)
    assert slower.keeps_up is False
    assert slower.hours_to_clear == pytest.approx(6 / 180, rel=0.001)


def test_no_measurement_yet_says_unknown_rather_than_zero(campaign):
    figures = effort.review_effort(campaign=campaign)

    assert (figures.decisions, figures.per_hour, figures.production_per_hour) == (0, None, None)
    assert figures.keeps_up is None and figures.hours_to_clear == 0.0


def test_a_versions_effort_counts_its_own_items_and_batches_only(campaign, owner):
    from campaigns.runs import setup

    _batch(campaign, 0, 100, size=100)
    (old,) = _items(campaign, 1, reason="truncated")
    _decide(old, Item.ACCEPTED, owner, seconds=10)
    v2 = setup.version_create(campaign=campaign, params={"max_tokens": 128})

    figures = effort.review_effort(campaign=campaign, version=v2)

    assert (figures.decisions, figures.units_processed, figures.flagged) == (0, 0, 0)
    assert effort.review_effort(campaign=campaign).decisions == 1
