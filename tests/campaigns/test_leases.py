from __future__ import annotations

import datetime as dt
from unittest import mock

import pytest
from django.utils import timezone

from campaigns.models import Batch, Unit, UnitState
from campaigns.runs import leases, start

pytestmark = pytest.mark.django_db


@pytest.fixture
def running(make_campaign, django_capture_on_commit_callbacks):
    """Two batches taken by a worker: one whose lease ran out, one still renewed."""
    campaign = make_campaign("leased", batch_size=20)
    with (
        mock.patch.object(start.celery_app, "send_task"),
        django_capture_on_commit_callbacks(execute=True),
    ):
        start.campaign_run(campaign=campaign)
    dead, alive = Batch.objects.filter(campaign=campaign).order_by("pk")
    now = timezone.now()
    for batch, expires in (
        (dead, now - dt.timedelta(seconds=1)),
        (alive, now + dt.timedelta(seconds=60)),
    ):
        Batch.objects.filter(pk=batch.pk).update(
            state=Batch.State.RUNNING,
            lease_token=f"t{batch.pk}",
            lease_expires_at=expires,
            worker="host:123",
            deliveries=1,
        )
        Unit.objects.filter(batch=batch).update(state=UnitState.RUNNING)
    return campaign, dead, alive


def test_an_expired_lease_puts_the_batch_back_in_the_queue(
    running, django_capture_on_commit_callbacks
):
    campaign, dead, alive = running
    with (
        mock.patch.object(start.celery_app, "send_task") as send,
        django_capture_on_commit_callbacks(execute=True),
    ):
        assert leases.batches_requeue_expired() == [dead.pk]
    send.assert_called_once_with("gpuworker.tasks.run_batch", args=[dead.pk])
    dead.refresh_from_db()
    assert dead.state == Batch.State.QUEUED and "lease expired" in dead.error
    assert set(Unit.objects.filter(batch=dead).values_list("state", flat=True)) == {"queued"}
    assert set(Unit.objects.filter(batch=alive).values_list("state", flat=True)) == {"running"}


def test_a_batch_that_kills_its_worker_again_and_again_fails_instead(running, settings):
    campaign, dead, _alive = running
    settings.BATCH_MAX_DELIVERIES = 1
    with mock.patch.object(start.celery_app, "send_task") as send:
        assert leases.batches_requeue_expired() == []
    assert not send.called
    dead.refresh_from_db()
    assert dead.state == Batch.State.FAILED
    reasons = set(Unit.objects.filter(batch=dead).values_list("error_message", flat=True))
    assert len(reasons) == 1 and "worker died 1 times" in reasons.pop()


def test_a_finished_batch_is_never_swept(running):
    _campaign, dead, _alive = running
    Batch.objects.filter(pk=dead.pk).update(state=Batch.State.DONE)
    with mock.patch.object(start.celery_app, "send_task"):
        assert leases.batches_requeue_expired() == []
