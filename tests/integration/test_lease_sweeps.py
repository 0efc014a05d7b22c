"""The lease sweep never waits behind queued work: a batch whose worker died comes
back within about one lease however many batches wait in the queue."""

from __future__ import annotations

import datetime as dt
import time

import pytest
from django.utils import timezone

from campaigns.models import Batch, Unit, UnitState
from campaigns.runs import start
from tests.integration.test_several_workers import image_campaign, image_corpus
from tests.worker import wait_until

pytestmark = pytest.mark.integration

LEASE = 3
QUEUED = 400


def test_a_dead_workers_batch_comes_back_within_a_lease_while_hundreds_are_queued(
    start_worker, project, tmp_path, output_root, settings
):
    # given: 400 one-image batches queued, and a worker (with its beat) taking them
    settings.BATCH_LEASE_SECONDS = LEASE
    image_corpus(tmp_path / "images", QUEUED)
    campaign = image_campaign(project, tmp_path / "images", name="swept", batch_size=1)
    assert start.campaign_run(campaign=campaign) == QUEUED
    worker = start_worker(beat=True)
    batches = Batch.objects.filter(campaign=campaign)
    wait_until(lambda: batches.filter(state=Batch.State.DONE).exists(), timeout=120, worker=worker)

    # when: a batch near the back of the queue is held by a worker that died:
    # running, its lease just run out, nobody renewing it
    dead = batches.filter(state=Batch.State.QUEUED).order_by("-pk")[10]
    expired_at = timezone.now()
    Batch.objects.filter(pk=dead.pk).update(
        state=Batch.State.RUNNING,
        lease_token="dead-worker-token",
        lease_expires_at=expired_at - dt.timedelta(milliseconds=1),
        worker="gone@nowhere",
        deliveries=1,
    )
    Unit.objects.filter(batch_id=dead.pk).update(state=UnitState.RUNNING)
    clock = time.monotonic()

    # then: the sweep puts it back within about one lease, long before the queue drains
    wait_until(
        lambda: not batches.filter(pk=dead.pk, state=Batch.State.RUNNING).exists(),
        timeout=LEASE * 4,
        interval=0.05,
        worker=worker,
    )
    came_back_after = time.monotonic() - clock
    still_queued = batches.filter(state=Batch.State.QUEUED).exclude(pk=dead.pk).count()
    assert still_queued >= QUEUED // 4, f"the sweep waited for the queue ({still_queued} left)"
    assert came_back_after <= LEASE + 1.5, came_back_after
    dead.refresh_from_db()
    assert dead.state == Batch.State.QUEUED, dead.error
    assert "lease expired" in dead.error
    assert not Unit.objects.filter(batch_id=dead.pk, state=UnitState.RUNNING).exists()
