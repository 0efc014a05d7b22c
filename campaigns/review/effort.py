"""Correction effort: what review costs, and whether it keeps up with production.

Speed is useful only when quality control keeps up with volume. This module
measures both sides from what is recorded:

- **Time per decision**: each ReviewDecision keeps the seconds from the item
  shown to the reviewer (a signed show time in the decision form,
  `shown_token`) to the decision. A decision that took longer than
  REVIEW_IDLE_SECONDS is idle time (the reviewer was away): it is *excluded*
  from the review time and the rate, not capped, and counted as such. Bulk
  accepts are *marked* bulk and never timed: their time went into the list,
  not into each item. Reopens (undo) are counted apart and not timed.
- **Shares** accepted / rejected / requeued per flag reason and per category
  (of the items as they stand), and rejections per reject reason (the
  campaign's list, campaigns/review/reasons.py).
- **Throughput**: decisions per hour of active review time, beside the
  campaign's production rate (units of finished batches per hour of batches
  running, campaigns/db/production_time.py), and whether review keeps up: the
  items flagged per hour of production against the reviewer's rate, and the
  open backlog's time to clear at that rate.

Every figure is an aggregate in the database: a few grouped statements over
the campaign's items, decisions and batches, whatever their number.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.core import signing
from django.db.models import Count, Q, QuerySet, Sum

from campaigns.db import production_time
from campaigns.models import Batch, Campaign, ParameterVersion, ReviewDecision, ReviewItem
from campaigns.review.flags import FlagReason, reason_label

Item = ReviewItem.State
DECIDED = (Item.ACCEPTED, Item.REJECTED, Item.REQUEUED)
# Categories shown, the most reviewed first: a folder import may have many.
CATEGORIES_SHOWN = 20
_SALT = "campaigns.review.shown"
# A show time older than this is not believed: the form was kept for a day.
_SHOWN_MAX_AGE = 24 * 3600


# --- the show time ----------------------------------------------------------------


def shown_token(item_id: int) -> str:
    """The signed moment an item is shown, for its decision form."""
    return signing.dumps([item_id, round(time.time(), 3)], salt=_SALT, compress=False)


def shown_at(token: str, item_id: int) -> datetime | None:
    """When the item was shown, from its form's token; None when the token is
    missing, forged, too old, or another item's."""
    if not token:
        return None
    try:
        shown_item, at = signing.loads(token, salt=_SALT, max_age=_SHOWN_MAX_AGE)
    except (signing.BadSignature, TypeError, ValueError):
        return None
    if shown_item != item_id or not isinstance(at, int | float):
        return None
    return datetime.fromtimestamp(at, tz=UTC)


# --- the figures --------------------------------------------------------------------


@dataclass(frozen=True)
class Shares:
    """How the items of one flag reason or category stand."""

    key: str
    label: str
    items: int
    open: int
    accepted: int
    rejected: int
    requeued: int

    @property
    def decided(self) -> int:
        return self.accepted + self.rejected + self.requeued

    def _share(self, n: int) -> float | None:
        return n / self.decided if self.decided else None

    @property
    def accepted_share(self) -> float | None:
        return self._share(self.accepted)

    @property
    def rejected_share(self) -> float | None:
        return self._share(self.rejected)

    @property
    def requeued_share(self) -> float | None:
        return self._share(self.requeued)


@dataclass(frozen=True)
class ReviewerRate:
    name: str
    decisions: int
    timed: int
    seconds: float

    @property
    def per_hour(self) -> float | None:
        return self.timed * 3600 / self.seconds if self.seconds else None


@dataclass(frozen=True)
class Effort:
    idle_limit: int
    # Decisions taken (accept, reject, requeue): timed (within the idle limit),
    # idle (over it: excluded), bulk (never timed) or untimed (no show time:
    # the command line, an older form); reopens (undos) apart.
    decisions: int = 0
    timed: int = 0
    idle: int = 0
    untimed: int = 0
    bulk: int = 0
    reopened: int = 0
    active_seconds: float = 0.0
    by_reason: list[Shares] = field(default_factory=list)
    by_category: list[Shares] = field(default_factory=list)
    more_categories: bool = False
    rejected: int = 0
    reject_reasons: list[tuple[str, int]] = field(default_factory=list)
    reviewers: list[ReviewerRate] = field(default_factory=list)
    units_processed: int = 0
    production_seconds: float = 0.0
    # Items raised by flag rules and by hand (spot checks are one sample a version).
    flagged: int = 0
    backlog: int = 0

    @property
    def mean_seconds(self) -> float | None:
        return self.active_seconds / self.timed if self.timed else None

    @property
    def per_hour(self) -> float | None:
        """Reviewer throughput: decisions per hour of active review time."""
        return self.timed * 3600 / self.active_seconds if self.active_seconds else None

    @property
    def production_per_hour(self) -> float | None:
        if not self.production_seconds:
            return None
        return self.units_processed * 3600 / self.production_seconds

    @property
    def flagged_per_unit(self) -> float | None:
        return self.flagged / self.units_processed if self.units_processed else None

    @property
    def inflow_per_hour(self) -> float | None:
        """Items to review that production makes per hour."""
        rate, flagged = self.production_per_hour, self.flagged_per_unit
        return rate * flagged if rate is not None and flagged is not None else None

    @property
    def hours_to_clear(self) -> float | None:
        """The open backlog at the measured reviewer rate (0 when there is none)."""
        if not self.backlog:
            return 0.0
        return self.backlog / self.per_hour if self.per_hour else None

    @property
    def seconds_to_clear(self) -> float | None:
        hours = self.hours_to_clear
        return hours * 3600 if hours is not None else None

    @property
    def reviewer_share(self) -> float | None:
        """Hours of one reviewer needed per hour of production to keep up."""
        inflow, rate = self.inflow_per_hour, self.per_hour
        return inflow / rate if inflow is not None and rate else None

    @property
    def keeps_up(self) -> bool | None:
        """Whether one reviewer at the measured rate keeps up with the flags
        production makes (None: not measured yet)."""
        if self.inflow_per_hour == 0:
            return True
        share = self.reviewer_share
        return share <= 1 if share is not None else None

    def as_dict(self) -> dict[str, Any]:
        """Every figure, the derived ones included, for the export."""
        figures = asdict(self)
        for name in (
            "mean_seconds",
            "per_hour",
            "production_per_hour",
            "flagged_per_unit",
            "inflow_per_hour",
            "hours_to_clear",
            "seconds_to_clear",
            "reviewer_share",
            "keeps_up",
        ):
            figures[name] = getattr(self, name)
        for key, rows in (("by_reason", self.by_reason), ("by_category", self.by_category)):
            figures[key] = [
                {
                    **asdict(row),
                    "accepted_share": row.accepted_share,
                    "rejected_share": row.rejected_share,
                    "requeued_share": row.requeued_share,
                }
                for row in rows
            ]
        figures["reject_reasons"] = [
            {"reason": reason, "rejected": n} for reason, n in self.reject_reasons
        ]
        figures["reviewers"] = [{**asdict(r), "per_hour": r.per_hour} for r in self.reviewers]
        return figures


def review_effort(*, campaign: Campaign, version: ParameterVersion | None = None) -> Effort:
    """The correction effort of a campaign's review, or of one parameter version's."""
    items = ReviewItem.objects.filter(campaign=campaign)
    decisions = ReviewDecision.objects.filter(item__campaign=campaign)
    batches = Batch.objects.filter(campaign=campaign, state=Batch.State.DONE)
    if version is not None:
        items = items.filter(version=version)
        decisions = decisions.filter(item__version=version)
        batches = batches.filter(version=version)
    limit = settings.REVIEW_IDLE_SECONDS
    by_reason = _shares(items, "reason", reason_label)
    categories = _shares(items, "unit__category", lambda c: c or "(none)", CATEGORIES_SHOWN + 1)
    rejected = dict(
        items.filter(state=Item.REJECTED)
        .values_list("reject_reason")
        .annotate(n=Count("pk"))
        .values_list("reject_reason", "n")
    )
    units = batches.aggregate(n=Sum("size"))["n"] or 0
    return Effort(
        idle_limit=limit,
        **_decision_counts(decisions, limit),
        by_reason=by_reason,
        by_category=categories[:CATEGORIES_SHOWN],
        more_categories=len(categories) > CATEGORIES_SHOWN,
        rejected=sum(rejected.values()),
        reject_reasons=sorted(
            ((reason or "", n) for reason, n in rejected.items()), key=lambda r: (-r[1], r[0])
        ),
        reviewers=_reviewers(decisions, limit),
        units_processed=units,
        production_seconds=production_time.busy_seconds(
            campaign_id=campaign.pk,
            version_id=version.pk if version is not None else None,
            gap_seconds=limit,
        )
        if units
        else 0.0,
        flagged=sum(r.items for r in by_reason if r.key != FlagReason.SPOT_CHECK),
        backlog=sum(r.open for r in by_reason),
    )


def _state_counts() -> dict[str, Count]:
    return {
        "items": Count("pk"),
        **{state: Count("pk", filter=Q(state=state)) for state in (Item.OPEN, *DECIDED)},
    }


def _shares(
    items: QuerySet[ReviewItem],
    column: str,
    label: Callable[[str], str],
    limit: int | None = None,
) -> list[Shares]:
    rows = items.values(column).annotate(**_state_counts()).order_by("-items", column)
    if limit is not None:
        rows = rows[:limit]
    return [
        Shares(
            key=row[column] or "",
            label=label(row[column] or ""),
            items=row["items"],
            open=row[Item.OPEN],
            accepted=row[Item.ACCEPTED],
            rejected=row[Item.REJECTED],
            requeued=row[Item.REQUEUED],
        )
        for row in rows
    ]


def _timed(limit: int) -> Q:
    return Q(to_state__in=DECIDED, seconds__isnull=False, seconds__lte=limit)


def _decision_counts(decisions: QuerySet[ReviewDecision], limit: int) -> dict[str, Any]:
    decided = Q(to_state__in=DECIDED)
    counts = decisions.aggregate(
        decisions=Count("pk", filter=decided),
        timed=Count("pk", filter=_timed(limit)),
        idle=Count("pk", filter=decided & Q(seconds__gt=limit)),
        untimed=Count("pk", filter=decided & Q(seconds__isnull=True, bulk=False)),
        bulk=Count("pk", filter=decided & Q(bulk=True)),
        # An undo: a decided item opened again (a manual flag records open → open).
        reopened=Count("pk", filter=Q(to_state=Item.OPEN) & ~Q(from_state=Item.OPEN)),
        active_seconds=Sum("seconds", filter=_timed(limit)),
    )
    counts["active_seconds"] = float(counts["active_seconds"] or 0)
    return counts


def _reviewers(decisions: QuerySet[ReviewDecision], limit: int) -> list[ReviewerRate]:
    rows = (
        decisions.filter(to_state__in=DECIDED)
        .values("reviewer__username")
        .annotate(
            n=Count("pk"),
            timed=Count("pk", filter=_timed(limit)),
            seconds=Sum("seconds", filter=_timed(limit)),
        )
        .order_by("-n", "reviewer__username")
    )
    return [
        ReviewerRate(
            name=row["reviewer__username"] or "(deleted user)",
            decisions=row["n"],
            timed=row["timed"],
            seconds=float(row["seconds"] or 0),
        )
        for row in rows
    ]
