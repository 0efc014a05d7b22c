"""Everything that reads campaign data for pages and commands.

Counts are aggregate queries over the (campaign, state) index: one query per
campaign page, one for the whole campaign list, never a loop over units.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db.models import Count, QuerySet

from .models import Attempt, Campaign, Reconciliation, Unit, UnitState


@dataclass
class Counts:
    pending: int = 0
    queued: int = 0
    running: int = 0
    succeeded: int = 0
    failed: int = 0
    needs_review: int = 0
    by_error: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return (
            self.pending
            + self.queued
            + self.running
            + self.succeeded
            + self.failed
            + self.needs_review
        )

    @property
    def done(self) -> int:
        return self.succeeded + self.failed + self.needs_review

    @property
    def active(self) -> bool:
        """Work is queued or running, so a page showing these counts should keep polling."""
        return bool(self.queued or self.running)

    @property
    def percent(self) -> int:
        return int(100 * self.done / self.total) if self.total else 0

    def as_dict(self, campaign: str) -> dict:
        return {
            "campaign": campaign,
            "total": self.total,
            "pending": self.pending,
            "queued": self.queued,
            "running": self.running,
            "succeeded": self.succeeded,
            "failed": self.failed,
            "needs_review": self.needs_review,
            "by_error": dict(sorted(self.by_error.items())),
        }


def _fill(counts: Counts, state: str, n: int) -> None:
    if state in UnitState.values:
        setattr(counts, state, getattr(counts, state) + n)


def campaign_counts(*, campaign: Campaign) -> Counts:
    counts = Counts()
    for row in Unit.objects.filter(campaign=campaign).values("state").annotate(n=Count("pk")):
        _fill(counts, row["state"], row["n"])
    counts.by_error = {
        row["error_class"]: row["n"]
        for row in Unit.objects.filter(campaign=campaign, state=UnitState.FAILED)
        .values("error_class")
        .annotate(n=Count("pk"))
    }
    return counts


def counts_by_campaign(*, campaign_ids: list[int]) -> dict[int, Counts]:
    result = {cid: Counts() for cid in campaign_ids}
    rows = (
        Unit.objects.filter(campaign_id__in=campaign_ids)
        .values("campaign_id", "state")
        .annotate(n=Count("pk"))
    )
    for row in rows:
        _fill(result[row["campaign_id"]], row["state"], row["n"])
    return result


def campaigns_for_user(user) -> QuerySet[Campaign]:
    qs = Campaign.objects.select_related("project", "current_version")
    if user.is_staff:
        return qs
    return qs.filter(project__members=user)


def last_reconciliation(*, campaign: Campaign) -> Reconciliation | None:
    return campaign.reconciliations.first()


def unit_lineage(*, campaign: Campaign, pk: int) -> tuple[Unit, list[Attempt]] | None:
    unit = Unit.objects.filter(campaign=campaign, pk=pk).select_related("batch").first()
    if unit is None:
        return None
    attempts = list(
        Attempt.objects.filter(unit=unit).select_related("version", "batch").order_by("started_at")
    )
    return unit, attempts


def failure_reasons(*, campaign: Campaign, limit: int = 50) -> QuerySet[Unit]:
    return (
        Unit.objects.filter(campaign=campaign, state=UnitState.FAILED)
        .order_by("error_class", "uid")
        .only("uid", "source_path", "error_class", "error_message")[:limit]
    )
