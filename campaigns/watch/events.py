"""The watch sweep: beat calls it every WATCH_SECONDS, in its own process
(portal/beat.py), so that a stall is noticed while the broker, the workers
or their queue are what stalled. It looks at every campaign that has work
queued, running or being planned, finished a batch in the last RECENT hours,
waits at a checkpoint opened in the last day, or runs on a rental that ends
within a day, raises the events that hold (each once: Notification's key),
then delivers what is pending (in beat, from a thread of its own).

Events and their keys (what makes a second raising the same event):
- checkpoint: a checkpoint waits for a decision — its id;
- stall: no progress (campaigns/watch/stall.py) — the instant of the last progress;
- done: nothing left to run — the last batch finished;
- failures: over the current version's last FAILURE_BATCHES batches, once
  WATCH_FAILURE_MIN_UNITS are processed, a failed share above the project's
  — the version;
- rental_ending: its rental ends within ORDER_END_REMINDER_HOURS and its outputs
  were not exported since its last batch — the rental.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading

from django.conf import settings
from django.db import connection
from django.db.models import Sum
from django.utils import timezone

from campaigns import selectors
from campaigns.models import Batch, Campaign, Checkpoint, UnitCount, UnitState, WorkerBeat
from campaigns.watch import notify, state
from campaigns.watch.eta import duration
from campaigns.watch.rentals import Rental, rentals_ending

log = logging.getLogger(__name__)

#: Campaigns that finished a batch this recently are looked at (a "done" event
#: is raised once their last batch is in), and checkpoints opened this
#: recently: a checkpoint left waiting for weeks is not news.
RECENT = dt.timedelta(hours=6)
CHECKPOINTS_RECENT = dt.timedelta(days=1)
#: A failure share is measured over the version's last this many batches.
FAILURE_BATCHES = 500

_delivering = threading.Lock()


def watch_runs(
    *, now: dt.datetime | None = None, broker_check=None, deliver: str = "here"
) -> list[str]:
    """Raise the events that hold and deliver pending notifications; returns
    the keys of the events raised. `deliver`: "here", or "thread" (beat: a
    slow mail server or webhook must not hold up the lease sweeps that run
    on beat's tick after this one)."""
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
    WorkerBeat.objects.filter(beat_at__lt=now - state.BEATS_KEPT).delete()
    if deliver == "thread":
        if _delivering.acquire(blocking=False):  # one delivery thread at a time
            try:
                threading.Thread(target=_deliver_then_release, name="watch-deliver").start()
            except RuntimeError:  # no thread to be had: the next sweep tries again
                _delivering.release()
                log.exception("watch: cannot start the delivery thread")
    else:
        notify.deliver_pending()
    return raised


def _deliver_then_release() -> None:
    try:
        notify.deliver_pending()
    except Exception:
        log.exception("watch: delivering notifications")
    finally:
        connection.close()  # this thread's own
        _delivering.release()


def _watched(*, now: dt.datetime) -> set[int]:
    """The campaigns worth a look, each read by an index: work queued or
    running (the unit counters), a batch finished lately, a planner at work,
    a checkpoint opened lately."""
    busy = (
        UnitCount.objects.filter(state__in=[UnitState.QUEUED, UnitState.RUNNING])
        .values("campaign_id")
        .annotate(n=Sum("n"))
        .filter(n__gt=0)
    )
    recent = Batch.objects.filter(state=Batch.State.DONE, finished_at__gte=now - RECENT)
    planning = Campaign.objects.exclude(planning_at=None)
    waiting = Checkpoint.objects.filter(
        state=Checkpoint.State.PENDING, created_at__gte=now - CHECKPOINTS_RECENT
    )
    return (
        {row["campaign_id"] for row in busy}
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
    last = (
        Batch.objects.filter(campaign=campaign, state=Batch.State.DONE)
        .order_by("-finished_at")
        .values("pk", "finished_at")
        .first()
    ) or {"pk": None, "finished_at": None}
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
    # A proven cause shows at once on the page; a notification waits a lease
    # (a worker restarted for a deploy registers again within it) and never
    # comes for what the sweeper mends by itself.
    worth_telling = (
        found is not None
        and found.notify
        and found.waited >= max(3 * settings.WORKER_BEAT_SECONDS, settings.BATCH_LEASE_SECONDS)
    )
    if found is not None and worth_telling:
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
    version = campaign.current_version_id
    failed, processed = _version_failures(version) if version else (0, 0)
    if processed >= settings.WATCH_FAILURE_MIN_UNITS and failed / processed > alerts.failure_share:
        share = failed / processed
        top = sorted(counts.by_error.items(), key=lambda kv: -kv[1])[:3]
        event(
            "failures",
            f"v{version}",
            f"{share:.0%} of the processed units failed",
            f"{failed} of the {processed} units the current version processed lately failed "
            f"(threshold {alerts.failure_share:.0%}); the campaign's most common failures: "
            + ", ".join(f"{name or 'unclassified'} ({n})" for name, n in top)
            + ". The campaign page's Failures section says why, unit by unit.",
            share=round(share, 4),
            by_error=dict(top),
        )
    if rental is not None and _not_exported(campaign, last["finished_at"]):
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


def _version_failures(version_id: int) -> tuple[int, int]:
    """(failed, processed) over the version's last FAILURE_BATCHES finished
    batches (each records its failures: campaigns/runs/recording.py): the unit
    rows keep input errors across versions, a new version's share must not
    start with them."""
    recent = Batch.objects.filter(version_id=version_id, state=Batch.State.DONE).order_by(
        "-finished_at"
    )[:FAILURE_BATCHES]
    failed = processed = 0
    for size, metrics in recent.values_list("size", "metrics"):
        processed += size
        failed += int((metrics or {}).get("failed") or 0)
    # A batch whose workers kept dying (BATCH_MAX_DELIVERIES) failed whole:
    # its units failed, and no recording counted them.
    for size in (
        Batch.objects.filter(version_id=version_id, state=Batch.State.FAILED)
        .order_by("-pk")
        .values_list("size", flat=True)[:FAILURE_BATCHES]
    ):
        processed += size
        failed += size
    return failed, processed


def _not_exported(campaign: Campaign, last_batch_at: dt.datetime | None) -> bool:
    if last_batch_at is None:
        return False  # nothing made yet, nothing to lose
    return campaign.exported_at is None or campaign.exported_at < last_batch_at
