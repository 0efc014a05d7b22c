"""Maintenance tasks; no torch here, any worker can run them."""

from __future__ import annotations

import logging
from datetime import datetime

from celery import shared_task
from celery.signals import worker_ready
from django.core.exceptions import ValidationError

from campaigns.models import Campaign
from campaigns.runs.leases import batches_requeue_expired
from campaigns.runs.start import campaign_run_rest

log = logging.getLogger(__name__)


@shared_task(name="campaigns.tasks.requeue_expired_batches")
def requeue_expired_batches() -> list[int]:
    requeued = batches_requeue_expired()
    if requeued:
        log.warning("requeued batches whose worker stopped renewing the lease: %s", requeued)
    return requeued


@shared_task(name="campaigns.tasks.plan_campaign")
def plan_campaign(campaign_id: int, since: str, stamp: str | None = None) -> int:
    """The rest of a run a web request started at `since` (ISO time;
    campaigns/runs/start.py, campaign_start); nothing once the campaign was paused after it.
    `stamp`: the planning stamp the request left (ISO time), cleared when done."""
    campaign = Campaign.objects.filter(pk=campaign_id).first()
    if campaign is None:
        return 0
    try:
        return campaign_run_rest(
            campaign=campaign,
            since=datetime.fromisoformat(since),
            stamp=datetime.fromisoformat(stamp) if stamp else None,
        )
    except ValidationError as exc:
        # The campaign changed meanwhile (a failed checkpoint): its page says so.
        log.warning("campaign %s: the rest of the run was not planned: %s", campaign_id, exc)
        return 0


@shared_task(name="campaigns.tasks.requeue_stale_trainings")
def requeue_stale_trainings() -> list[int]:
    from campaigns.adaptation.services import trainings_requeue_stale

    return trainings_requeue_stale()


@shared_task(name="campaigns.tasks.fail_stale_profiles")
def fail_stale_profiles() -> list[int]:
    from campaigns.profiles.services import profiles_fail_stale

    return profiles_fail_stale()


@shared_task(name="campaigns.tasks.watch_runs")
def watch_runs() -> list[str]:
    """The events runs raised (checkpoint, stall, done, failures, rental
    ending), each notified once (campaigns/watch/events.py)."""
    from campaigns.runs.leases import BATCH_QUEUE, broker_queue_waiting
    from campaigns.watch.events import watch_runs as sweep

    return sweep(broker_check=lambda: broker_queue_waiting(BATCH_QUEUE), deliver="thread")


@worker_ready.connect
def _requeue_on_start(**kwargs) -> None:
    # A worker that starts after a crash picks up what the dead one held.
    requeue_expired_batches.delay()
