"""The lease sweeps: running batches whose worker stopped renewing its lease
go back in the queue (or fail, after too many deliveries), and queued batches,
trainings and profiles whose broker message is gone get it sent again. The
periodic task and resume call these."""

from __future__ import annotations

import datetime as dt
import logging
import time

from celery import current_app as celery_app
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from campaigns.adaptation import services as adaptation
from campaigns.models import Batch, Campaign, ErrorClass, Profile, Training, Unit, UnitState
from campaigns.profiles.services import PROFILE_TASK
from campaigns.runs.start import batches_enqueue, work_send

# The queue batches go to (CELERY_TASK_ROUTES).
BATCH_QUEUE = "gpu"

log = logging.getLogger(__name__)


def batches_requeue_expired(*, campaign: Campaign | None = None) -> list[int]:
    """Put running batches whose lease expired back in the queue.

    Their worker died (SIGKILL, machine gone) without the broker necessarily
    knowing: the filesystem transport, for one, has already forgotten the
    message. The lease in the database is what guarantees nothing is lost.

    The periodic sweep (no campaign) also sends again the task of queued
    batches whose message the broker lost (batches_resend_lost); resume does
    that for its campaign by itself.
    """
    if campaign is None:
        batches_resend_lost()
    expired = Batch.objects.filter(state=Batch.State.RUNNING, lease_expires_at__lt=timezone.now())
    if campaign is not None:
        expired = expired.filter(campaign=campaign)
    requeued: list[int] = []
    for batch in expired.only("pk", "lease_token", "worker", "deliveries"):
        if batch.deliveries >= settings.BATCH_MAX_DELIVERIES:
            _fail_poison_batch(batch)
            continue
        with transaction.atomic():
            # Guarded by the token: a late heartbeat or a finishing worker wins.
            taken = Batch.objects.filter(
                pk=batch.pk, state=Batch.State.RUNNING, lease_token=batch.lease_token
            ).update(
                state=Batch.State.QUEUED,
                lease_token="",
                lease_expires_at=None,
                error=f"lease expired: worker {batch.worker} stopped renewing it; requeued",
            )
            if not taken:
                continue
            Unit.objects.filter(batch_id=batch.pk, state=UnitState.RUNNING).update(
                state=UnitState.QUEUED
            )
            requeued.append(batch.pk)
    if requeued:
        transaction.on_commit(lambda: batches_enqueue(batch_ids=requeued))
    return requeued


def batches_resend_lost(*, grace: float | None = None, confirm_after: float = 1.0) -> list[int]:
    """Send again the task of queued batches whose message the broker no longer holds.

    A broker restarted without persistence (Redis with appendonly no), a queue
    purged by hand, a worker that died after taking a message but before
    claiming its batch (Redis keeps that message aside for visibility_timeout),
    a broker that was down when the batch was planned: the batch stays queued
    and no message will ever start it. No lease covers it, since nobody
    claimed it. The broker only tells how many messages wait, so: when the
    queue holds fewer than there are batches queued for longer than `grace`
    (default: one lease), some of them have none, and all of them are sent
    again. A batch that still had its message runs once all the same: the
    second message finds it claimed and returns quietly.

    Queued trainings and profiles wait in the same queue and are claimed the
    same way: they count with the batches, and are sent again with them.

    The shortfall must hold twice, `confirm_after` seconds apart: a worker that
    has just taken a message has not claimed its batch yet, for a few
    milliseconds, and that alone must not double the queue. Returns the batches
    sent again.
    """
    grace = settings.BATCH_LEASE_SECONDS if grace is None else grace
    for check in range(2):
        if check:
            time.sleep(confirm_after)
        waiting = broker_queue_waiting(BATCH_QUEUE)
        before = timezone.now() - dt.timedelta(seconds=grace)
        stale = Batch.objects.filter(state=Batch.State.QUEUED, created_at__lt=before)
        trainings = Training.objects.filter(state=Training.State.QUEUED, created_at__lt=before)
        profiles = Profile.objects.filter(state=Profile.State.QUEUED, created_at__lt=before)
        queued = stale.count() + trainings.count() + profiles.count()
        if not queued or waiting is None or waiting >= queued:
            return []
    resend = list(stale.order_by("pk").values_list("pk", flat=True))
    others = {
        adaptation.TASK: list(trainings.order_by("pk").values_list("pk", flat=True)),
        PROFILE_TASK: list(profiles.order_by("pk").values_list("pk", flat=True)),
    }
    log.warning(
        "%s batches, trainings and profiles queued, %s messages in the broker's %s queue: "
        "sending again batches %s, %s",
        queued,
        waiting,
        BATCH_QUEUE,
        resend,
        others,
    )
    batches_enqueue(batch_ids=resend)
    for task, ids in others.items():
        for pk in ids:
            work_send(task=task, args=[pk], what=f"{task} {pk}")
    return resend


def broker_queue_waiting(queue: str) -> int | None:
    """Messages waiting in `queue` (not those a worker holds), or None when the
    broker does not answer. A passive declare tells it on Redis, RabbitMQ and
    the filesystem transport alike."""
    try:
        with celery_app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=5)
            try:
                return conn.default_channel.queue_declare(queue=queue, passive=True).message_count
            except conn.channel_errors:
                return 0  # Redis drops an empty list; RabbitMQ: a queue never declared
    except Exception:  # noqa: BLE001 — a broker that does not answer cannot say
        return None


def _fail_poison_batch(batch: Batch) -> None:
    """A batch whose worker died every time it ran it: its units fail, the rest goes on."""
    message = (
        f"the worker died {batch.deliveries} times while running this batch "
        f"(last: {batch.worker}); killed, or out of host memory?"
    )
    with transaction.atomic():
        taken = Batch.objects.filter(
            pk=batch.pk, state=Batch.State.RUNNING, lease_token=batch.lease_token
        ).update(state=Batch.State.FAILED, lease_token="", lease_expires_at=None, error=message)
        if taken:
            Unit.objects.filter(batch_id=batch.pk, state=UnitState.RUNNING).update(
                state=UnitState.FAILED,
                error_class=ErrorClass.PROCESSING_ERROR,
                error_message=message,
            )
