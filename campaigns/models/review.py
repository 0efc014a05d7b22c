"""Human review: the Checkpoint after a version's first group, the ReviewItems
about outputs, their per-campaign open count, and every decision taken."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from campaigns.models.campaign import Campaign, ParameterVersion
from campaigns.models.unit import Attempt, Unit


class Checkpoint(models.Model):
    """The stop after the first group of units of a parameter version: a spot check."""

    class State(models.TextChoices):
        PENDING = "pending", "checkpoint pending"
        PASSED = "passed"
        FAILED = "failed"

    campaign = models.ForeignKey(Campaign, on_delete=models.CASCADE, related_name="checkpoints")
    version = models.ForeignKey(ParameterVersion, on_delete=models.RESTRICT, related_name="+")
    after_units = models.PositiveIntegerField()
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING)
    # The spot-check set: unit ids stratified by category and input size.
    sample = models.JSONField(default=list)
    reason = models.TextField(blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # The holdout report of this checkpoint's version as it stood when the
    # checkpoint opened, was decided and when the campaign ran out of work:
    # {"opened" | "decided" | "finished": report with "at"}. Kept, since the
    # live report follows whichever outputs exist now.
    holdout_snapshots = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            # One checkpoint per version: opening it twice (two workers) is one.
            models.UniqueConstraint(
                fields=["campaign", "version"], name="one_checkpoint_per_version"
            )
        ]


class ReviewItem(models.Model):
    """An output a human should look at: flagged by a rule, by hand, or a spot check."""

    class State(models.TextChoices):
        OPEN = "open"
        ACCEPTED = "accepted"
        REJECTED = "rejected"
        REQUEUED = "requeued"

    class Source(models.TextChoices):
        RULE = "rule"
        MANUAL = "manual"
        SPOT_CHECK = "spot_check", "spot check"

    campaign = models.ForeignKey(Campaign, on_delete=models.CASCADE, related_name="review_items")
    unit = models.ForeignKey(Unit, on_delete=models.CASCADE, related_name="review_items")
    version = models.ForeignKey(ParameterVersion, on_delete=models.RESTRICT, related_name="+")
    checkpoint = models.ForeignKey(
        Checkpoint, on_delete=models.CASCADE, null=True, blank=True, related_name="items"
    )
    # The try whose output this item judges. Only items about the unit's latest
    # attempt move the unit: a decision on an older output is recorded, no more.
    # Null on items made before it was recorded (then: made after the latest attempt).
    attempt = models.ForeignKey(
        Attempt, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    source = models.CharField(max_length=12, choices=Source.choices, default=Source.RULE)
    reason = models.CharField(max_length=50)
    detail = models.TextField(blank=True)
    state = models.CharField(max_length=10, choices=State.choices, default=State.OPEN)
    reviewer = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True
    )
    note = models.TextField(blank=True)
    # While rejected: the reason picked from the campaign's list (blank: the
    # note alone says why). Nullable without a default so that SQLite adds the
    # column in place: remaking the table would drop its counter triggers.
    reject_reason = models.CharField(max_length=100, null=True, blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "pk"]
        indexes = [
            # The queue lists a campaign's items of one state (and reason) in id
            # order, 100 at a time and from an item on: an index range read,
            # however many items are open (bench/RESULTS.md, "Pages at scale").
            models.Index(fields=["campaign", "state", "id"], name="review_queue_order"),
            models.Index(fields=["campaign", "state", "reason", "id"], name="review_queue_reason"),
        ]


class ReviewCount(models.Model):
    """How many review items of a campaign are open: the campaign page's figure.

    Written only by database triggers on campaigns_reviewitem (migration 0016),
    as UnitCount is: on PostgreSQL deltas appended per statement (SUM them;
    campaigns_reviewcount_compact() folds them), on SQLite one row a campaign.
    Counting open items on every page view is what it spares (bench/RESULTS.md,
    "Pages at scale — `bench/pages_scale.py`").
    """

    # As UnitCount's: Django deletes the items first (their trigger appends
    # deltas), then the campaign, whose trigger deletes these rows.
    campaign = models.ForeignKey(
        Campaign,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_index=False,
        related_name="+",
    )
    n = models.BigIntegerField()

    class Meta:
        indexes = [models.Index(fields=["campaign"], name="reviewcount_campaign")]


class ReviewReasonCount(models.Model):
    """How many review items of a campaign are in each state, per reason: the
    review queue's reason list and total.

    Written only by database triggers on campaigns_reviewitem (migration
    0023_review_reason_counters), as ReviewCount is: on PostgreSQL deltas
    appended per statement (SUM them; campaigns_reviewreasoncount_compact()
    folds them), on SQLite one row a key. A COUNT ... GROUP BY reason over the
    open items is what it spares: it grows with the queue.
    """

    campaign = models.ForeignKey(
        Campaign,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_index=False,
        related_name="+",
    )
    state = models.CharField(max_length=10)
    reason = models.CharField(max_length=50)
    n = models.BigIntegerField()

    class Meta:
        indexes = [models.Index(fields=["campaign", "state"], name="reviewreasoncount_campaign")]


class ReviewDecision(models.Model):
    """Every decision, kept: a later one undoes an earlier one without erasing it."""

    item = models.ForeignKey(ReviewItem, on_delete=models.CASCADE, related_name="decisions")
    from_state = models.CharField(max_length=10, choices=ReviewItem.State.choices)
    to_state = models.CharField(max_length=10, choices=ReviewItem.State.choices)
    reviewer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True)
    note = models.TextField(blank=True)
    reject_reason = models.CharField(max_length=100, blank=True, default="")
    # From the item shown to the reviewer to this decision, as measured (idle
    # time included: campaigns/review/effort.py leaves out what is over the
    # idle limit when it sums). None: not measured (a bulk accept, a reopen,
    # the command line, a form without its signed show time).
    seconds = models.FloatField(null=True, blank=True)
    # One of a bulk accept's decisions: counted, never timed.
    bulk = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "pk"]
