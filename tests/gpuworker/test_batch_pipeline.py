"""A worker hands a batch's writes and recording to its finisher thread and starts
the next batch meanwhile: the batch stays leased until recorded, nothing is lost
when recording fails, and a shutdown drains what was handed off."""

from __future__ import annotations

import threading
from unittest import mock

import pytest

from campaigns import services
from campaigns.models import Attempt, Batch, Unit, UnitState
from gpuworker import batch_runner
from gpuworker.batch_runner import finisher, pipeline_enabled, run_batch

# The finisher thread has its own database connection: it must see committed rows.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def queued(make_campaign, output_root):
    campaign = make_campaign(batch_size=8)
    with mock.patch.object(services.celery_app, "send_task"):
        services.campaign_run(campaign=campaign)
    yield campaign
    finisher.drain()  # no thread of this test outlives it


def test_a_handed_off_batch_stays_leased_until_the_finisher_records_it(queued):
    first, second = Batch.objects.filter(campaign=queued).order_by("pk")[:2]
    release = threading.Event()
    record = batch_runner._record

    def slow_record(*args, **kwargs):
        release.wait(timeout=30)
        return record(*args, **kwargs)

    with mock.patch.object(batch_runner, "_record", slow_record):
        assert run_batch(first.pk, hand_off=True) == "handed off"
        # The model ran; the batch is still the worker's, nothing recorded yet.
        first.refresh_from_db()
        assert first.state == Batch.State.RUNNING and first.lease_expires_at is not None
        assert not Attempt.objects.filter(batch=first).exists()
        # Meanwhile the worker runs the next batch's model.
        assert run_batch(second.pk, hand_off=True) == "handed off"
        release.set()
        finisher.drain()

    for batch in (first, second):
        batch.refresh_from_db()
        assert batch.state == Batch.State.DONE
        assert batch.lease_expires_at is None
        assert Attempt.objects.filter(batch=batch).count() == batch.size
        assert not Unit.objects.filter(batch=batch, state=UnitState.RUNNING).exists()


def test_a_batch_the_finisher_cannot_record_is_left_to_its_lease(queued):
    batch = Batch.objects.filter(campaign=queued).order_by("pk").first()

    def database_gone(*args, **kwargs):
        raise batch_runner.DatabaseError("server closed the connection")

    with mock.patch.object(batch_runner, "_record", database_gone):
        assert run_batch(batch.pk, hand_off=True) == "handed off"
        finisher.drain()

    # Still running under its lease (now no longer renewed): the sweeper
    # requeues it once the lease is over, and the outputs written are adopted.
    batch.refresh_from_db()
    assert batch.state == Batch.State.RUNNING
    Batch.objects.filter(pk=batch.pk).update(lease_expires_at=batch.started_at)
    assert services.batches_requeue_expired(campaign=queued) == [batch.pk]
    assert run_batch(batch.pk) == "done"
    adopted = Attempt.objects.filter(batch=batch, metrics__adopted=True).count()
    assert adopted == Attempt.objects.filter(batch=batch, outcome="succeeded").count() > 0


@pytest.mark.parametrize(
    ("setting", "cuda", "expected"),
    [("auto", False, False), ("auto", True, True), ("1", False, True), ("0", True, False)],
)
def test_the_pipeline_is_on_where_the_model_runs_on_cuda_unless_told(
    settings, setting, cuda, expected
):
    settings.BATCH_PIPELINE = setting
    with mock.patch("torch.cuda.is_available", return_value=cuda):
        assert pipeline_enabled() is expected
