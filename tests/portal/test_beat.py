"""Beat's scheduler runs the database sweeps itself; a failing sweep does not stop beat."""

from __future__ import annotations

import datetime as dt
import logging
from types import SimpleNamespace
from unittest import mock

import pytest
from celery.beat import ScheduleEntry
from django.utils import timezone

import campaigns.tasks  # noqa: F401 — registers the sweeps, as a worker or beat does
from campaigns.models import Batch
from campaigns.runs import start
from portal import beat
from portal.celery import app


@pytest.mark.django_db(transaction=True)
def test_the_lease_sweep_runs_in_the_beat_process_and_sends_no_sweep_message(
    make_campaign, tmp_path
):
    campaign = make_campaign("swept-here")
    with mock.patch.object(start.celery_app, "send_task"):
        start.campaign_run(campaign=campaign)
    batch = Batch.objects.filter(campaign=campaign).first()
    Batch.objects.filter(pk=batch.pk).update(
        state=Batch.State.RUNNING,
        lease_token="t",
        lease_expires_at=timezone.now() - dt.timedelta(seconds=1),
    )
    scheduler = beat.SweepScheduler(app=app, schedule_filename=str(tmp_path / "schedule"))
    entry = ScheduleEntry(
        name="requeue-expired-leases",
        task="campaigns.tasks.requeue_expired_batches",
        schedule=dt.timedelta(seconds=30),
        app=app,
    )
    with mock.patch.object(app, "send_task") as sent:
        requeued = scheduler.apply_entry(entry, producer=None)
    assert requeued == [batch.pk]
    # only the batch's own task goes out again, never the sweep as a message
    assert [c.args[0] for c in sent.call_args_list] == [start.RUN_BATCH_TASK]


def test_a_sweep_that_fails_is_logged_and_beat_goes_on(caplog):
    def broken():
        raise RuntimeError("database restarting")

    fake = SimpleNamespace(tasks={"campaigns.tasks.requeue_expired_batches": broken})
    with caplog.at_level(logging.ERROR, logger="portal.beat"):
        assert beat.sweep_here(fake, "campaigns.tasks.requeue_expired_batches") is None
    assert "next tick tries again" in caplog.text
