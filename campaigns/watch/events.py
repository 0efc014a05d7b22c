"""The watch sweep: beat calls it every WATCH_SECONDS, in its own process
(portal/beat.py), so that a stall is noticed while the broker, the workers
or their queue are what stalled. It looks at every campaign that has work
queued, running or being planned, finished a batch in the last day, waits at
a checkpoint, or runs on a rental that ends within a day, raises the events
that hold (each once: Notification's key), then delivers what is pending.

Events and their keys (what makes a second raising the same event):
- checkpoint: a checkpoint waits for a decision — its id;
- stall: no progress (campaigns/watch/stall.py) — the instant of the last progress;
- done: nothing left to run — the last batch finished;
- failures: failed units over WATCH_FAILURE_MIN_UNITS processed, above the
  project's share — the campaign's current version;
- rental_ending: its rental ends within ORDER_END_REMINDER_HOURS and its outputs
  were not exported since its last batch — the rental.
"""

from __future__ import annotations

import datetime as dt
import logging

from django.conf import settings
from django.db.models import Max
from django.utils import timezone

from campaigns import selectors
from campaigns.models import Batch, Campaign, Checkpoint
from campaigns.watch import notify, state
from campaigns.watch.eta import duration
from campaigns.watch.rentals import Rental, rentals_ending

log = logging.getLogger(__name__)

#: Campaigns that finished a batch this recently are looked at (a "done" event
#: is raised once their last batch is in).
RECENT = dt.timedelta(days=1)


def watch_runs(*, now: dt.datetime | None = None, broker_check=None) -> list[str]:
    """Raise the events that hold and deliver pending notifications; returns
    the keys of the events raised."""
    now = now or timezone.now()
    raised: list[str] = []
    ending: dict[int, Rental] = {}
    for campaign_id, rental in rentals_ending(
        now=now, within=dt.timedelta(hours=settings.ORDER_END_REMINDER_HOURS)
    ):
        ending.setdefault(campaign_id, rental)
    ids = _watched(now=now) | set(ending)
    campaigns = Campaign.objects.filter(pk__in=ids).select_related("project", "current_version")
    counts = selectors.counts_by_campaign(campaign_ids=[c.pk for c in campaigns])
    for campaign in campaigns:
        try:
            raised += campaign_events(
                campaign=campaign,
                counts=counts[campaign.pk],
                now=now,
                rental=ending.get(campaign.pk),
                broker_check=broker_check,
            )
        except Exception:  # one campaign's trouble never stops the others' alerts
            log.exception("watch: campaign %s", campaign.pk)
    notify.deliver_pending()
    return raised


def _watched(*, now: dt.datetime) -> set[int]:
    busy = Batch.objects.filter(state__in=[Batch.State.QUEUED, Batch.State.RUNNING])
    recent = Batch.objects.filter(state=Batch.State.DONE, finished_at__gte=now - RECENT)
    planning = Campaign.objects.exclude(planning_at=None)
    waiting = Checkpoint.objects.filter(state=Checkpoint.State.PENDING)
    return (
        set(busy.values_list("campaign_id", flat=True).distinct())
        | set(recent.values_list("campaign_id", flat=True).distinct())
        | set(planning.values_list("pk", flat=True))
        | set(waiting.values_list("campaign_id", flat=True).distinct())
    )


def campaign_events(
    *,
    campaign: Campaign,
    counts: selectors.Counts,
    now: dt.datetime,
    rental: Rental | None = None,
    broker_check=None,
) -> list[str]:
    raised = []

    def event(kind: str, key: str, title: str, message: str, **payload) -> None:
        if notify.notification_raise(
            campaign=campaign, event=kind, key=key, title=title, message=message, payload=payload
        ):
            raised.append(f"{kind}:{key}")

    run = selectors.campaign_run_state(campaign_id=campaign.pk, counts=counts)
    if run.key == "checkpoint" and run.checkpoint_id is not None:
        event(
            "checkpoint",
            str(run.checkpoint_id),
            f"Checkpoint {run.checkpoint_id} waits for your decision",
            f"{run.label}: {run.detail}. The run does not go on until it is passed; "
            "the rented device is idle meanwhile.",
            checkpoint=run.checkpoint_id,
            counts=counts.as_dict(campaign.name),
        )
    last = Batch.objects.filter(campaign=campaign, state=Batch.State.DONE).aggregate(
        at=Max("finished_at"), pk=Max("pk")
    )
    if run.key == "done" and last["pk"] is not None:
        event(
            "done",
            str(last["pk"]),
            "The campaign is done",
            f"Every unit is processed: {counts.succeeded} succeeded, {counts.failed} failed, "
            f"{counts.needs_review} need review. Export the outputs before the rental ends.",
            counts=counts.as_dict(campaign.name),
        )
    found = state.campaign_stall(
        campaign=campaign, counts=counts, now=now, broker_check=broker_check
    )
    if found is not None:
        event(
            "stall",
            found.since.isoformat(),
            f"The run is stalled: {found.title.lower()}",
            f"No batch finished for {duration(found.waited)} "
            f"(allowed: {duration(found.limit)}). {found.advice}",
            cause=found.cause,
            since=found.since.isoformat(),
        )
    alerts = notify.alerts_of(campaign.project_id)
    processed = counts.done
    if (
        campaign.current_version_id
        and processed >= settings.WATCH_FAILURE_MIN_UNITS
        and counts.failed / processed > alerts.failure_share
    ):
        share = counts.failed / processed
        top = sorted(counts.by_error.items(), key=lambda kv: -kv[1])[:3]
        event(
            "failures",
            f"v{campaign.current_version_id}",
            f"{share:.0%} of the processed units failed",
            f"{counts.failed} of {processed} processed units failed "
            f"(threshold {alerts.failure_share:.0%}); the most common: "
            + ", ".join(f"{name or 'unclassified'} ({n})" for name, n in top)
            + ". The campaign page's Failures section says why, unit by unit.",
            share=round(share, 4),
            by_error=dict(top),
        )
    if rental is not None and _not_exported(campaign, last["at"]):
        left = (rental.ends_at - now).total_seconds()
        event(
            "rental_ending",
            rental.key,
            f"The rental ends in {duration(left)}; outputs not exported",
            f"{rental.label} ends at {rental.ends_at:%Y-%m-%d %H:%M} UTC and this campaign's "
            "outputs were not exported since its last batch: export them "
            f"(`campaign export {campaign.name} FOLDER`, or the page's downloads) "
            "before the machine is wiped.",
            ends_at=rental.ends_at.isoformat(),
        )
    return raised


def _not_exported(campaign: Campaign, last_batch_at: dt.datetime | None) -> bool:
    if last_batch_at is None:
        return False  # nothing made yet, nothing to lose
    return campaign.exported_at is None or campaign.exported_at < last_batch_at
