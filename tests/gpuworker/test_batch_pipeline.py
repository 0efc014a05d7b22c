"""A worker hands a batch's writes and recording to its finisher thread and starts
the next batch meanwhile: the batch stays leased until recorded, nothing is lost
when recording fails, and a shutdown drains what was handed off."""

from __future__ import annotations

import threading
from unittest import mock

import pytest
from django.db import DatabaseError, connection

from campaigns.models import Attempt, Batch, Unit, UnitState
from campaigns.runs import leases, start
from gpuworker.processors.text_embedding import TextEmbeddingProcessor
from gpuworker.runner import pipeline
from gpuworker.runner.batch import run_batch
from gpuworker.runner.pipeline import finisher, pipeline_enabled
from gpuworker.runner.prefetch import prefetch
from tests.conftest import DEMO_BAD, DEMO_GOOD

# The finisher thread has its own database connection: it must see committed rows.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def queued(make_campaign, output_root):
    campaign = make_campaign(batch_size=8)
    with mock.patch.object(start.celery_app, "send_task"):
        start.campaign_run(campaign=campaign)
    yield campaign
    prefetch.drop()
    finisher.drain()  # no thread of this test outlives it


def test_a_handed_off_batch_stays_leased_until_the_finisher_records_it(queued):
    first, second = Batch.objects.filter(campaign=queued).order_by("pk")[:2]
    release = threading.Event()
    record = pipeline.batch_record

    def slow_record(*args, **kwargs):
        release.wait(timeout=30)
        return record(*args, **kwargs)

    with mock.patch.object(pipeline, "batch_record", slow_record):
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
        raise DatabaseError("server closed the connection")

    with mock.patch.object(pipeline, "batch_record", database_gone):
        assert run_batch(batch.pk, hand_off=True) == "handed off"
        finisher.drain()

    # Still running under its lease (now no longer renewed): the sweeper
    # requeues it once the lease is over, and the outputs written are adopted.
    batch.refresh_from_db()
    assert batch.state == Batch.State.RUNNING
    Batch.objects.filter(pk=batch.pk).update(lease_expires_at=batch.started_at)
    assert leases.batches_requeue_expired(campaign=queued) == [batch.pk]
    assert run_batch(batch.pk) == "done"
    adopted = Attempt.objects.filter(batch=batch, metrics__adopted=True).count()
    assert adopted == Attempt.objects.filter(batch=batch, outcome="succeeded").count() > 0


def test_the_next_batchs_inputs_are_prepared_while_the_model_runs(queued):
    first, second = Batch.objects.filter(campaign=queued).order_by("pk")[:2]
    prepared_ahead = threading.Event()
    prepare, run = TextEmbeddingProcessor.prepare, TextEmbeddingProcessor.run

    def watched_prepare(self, data):
        if threading.current_thread().name.startswith("input-prefetch"):
            prepared_ahead.set()
        return prepare(self, data)

    def model_run(self, items):
        # The first batch's model waits for the prefetch to be under way:
        # without the overlap it would wait in vain.
        overlapped.append(prepared_ahead.wait(timeout=30))
        return run(self, items)

    overlapped: list[bool] = []
    with (
        mock.patch.object(TextEmbeddingProcessor, "prepare", watched_prepare),
        mock.patch.object(TextEmbeddingProcessor, "run", model_run),
    ):
        assert run_batch(first.pk, hand_off=True) == "handed off"
    assert overlapped == [True]
    # Every batch after runs on inputs prepared while the one before ran.
    for batch in Batch.objects.filter(campaign=queued).order_by("pk")[1:]:
        assert run_batch(batch.pk, hand_off=True) == "handed off"
    finisher.drain()
    second.refresh_from_db()
    assert second.metrics["prefetched"] == second.size
    # Same outcomes as read in the batch: the good inputs embed, the bad fail with a reason.
    states = Unit.objects.filter(campaign=queued)
    assert states.filter(state=UnitState.SUCCEEDED).count() == DEMO_GOOD
    failed = states.filter(state=UnitState.FAILED)
    assert failed.count() == DEMO_BAD and all(u.error_message for u in failed)


def test_a_wrong_guess_is_dropped_and_that_batch_reads_its_own_inputs(queued):
    first, second, third = Batch.objects.filter(campaign=queued).order_by("pk")[:3]
    assert run_batch(first.pk, hand_off=True) == "handed off"  # guesses the second
    # A peer process took the second: this one gets the third.
    assert run_batch(third.pk, hand_off=True) == "handed off"
    assert run_batch(second.pk) == "done"
    finisher.drain()
    for batch in (second, third):
        batch.refresh_from_db()
        assert batch.state == Batch.State.DONE and "prefetched" not in batch.metrics
    assert not Unit.objects.filter(batch__in=[second, third], state=UnitState.RUNNING).exists()


def test_an_input_prepared_ahead_that_differs_from_its_import_is_read_again(queued, corpus):
    first, second = Batch.objects.filter(campaign=queued).order_by("pk")[:2]
    unit = Unit.objects.filter(batch=second, state=UnitState.QUEUED).order_by("pk").first()
    # Changed before the prefetch: the bytes prepared ahead are not the import's.
    (corpus / unit.source_path).write_text("rewritten after import")
    assert run_batch(first.pk, hand_off=True) == "handed off"
    assert run_batch(second.pk, hand_off=True) == "handed off"
    finisher.drain()
    unit.refresh_from_db()
    assert (unit.state, unit.error_class) == (UnitState.FAILED, "input_changed")
    second.refresh_from_db()
    assert second.metrics["prefetched"] == second.size - 1


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


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="PostgreSQL's health checks (CONN_HEALTH_CHECKS)"
)
def test_the_finisher_replaces_a_connection_the_database_broke_between_batches(queued):
    # given: the finisher thread recorded a batch, then its connection broke
    # (the server restarted) without the thread noticing
    first, second = Batch.objects.filter(campaign=queued).order_by("pk")[:2]
    assert run_batch(first.pk, hand_off=True) == "handed off"
    finisher._pending[-1].result()
    finisher._pool.submit(lambda: connection.connection.close()).result()

    # when: the next batch is handed off
    assert run_batch(second.pk, hand_off=True) == "handed off"
    outcome = finisher._pending[-1].result()

    # then: recorded on a new connection, not left to its lease
    second.refresh_from_db()
    assert (outcome, second.state) == ("done", Batch.State.DONE)
