"""A parameter change committed while a batch of the old version is being
recorded (PostgreSQL, two connections): the batch's units still go back to
pending under the new version (campaigns/runs/recording.py, _outdated_to_pending)."""

from __future__ import annotations

import threading
import time
from unittest import mock

import pytest
from django.db import connection, connections

from campaigns.models import Attempt, Batch, Unit, UnitState
from campaigns.runs import recording, setup
from tests.campaigns.test_versions import started_without_checkpoint

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="SQLite runs one writing transaction at a time"
    ),
]


def _waiting_on_a_lock() -> bool:
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0] > 0


def test_a_switch_committed_during_the_recording_sends_the_batchs_units_back(
    make_campaign, output_root
):
    campaign = started_without_checkpoint(make_campaign("race", batch_size=4))
    first = campaign.current_version
    from gpuworker.runner.batch import run_batch

    running = Batch.objects.filter(campaign=campaign).order_by("pk").first()
    read, release = threading.Event(), threading.Event()
    real = recording.current_version_of

    def read_then_wait(campaign_id):
        current = real(campaign_id)
        read.set()  # the recording has read the current version …
        assert release.wait(30)  # … and commits only once the switch had its chance
        return current

    outcome: dict[str, object] = {}

    def record():
        try:
            with mock.patch.object(recording, "current_version_of", read_then_wait):
                outcome["batch"] = run_batch(running.pk)
        finally:
            connections.close_all()

    def switch():
        try:
            outcome["version"] = setup.version_create(
                campaign=campaign, params={**first.params, "pooling": "cls"}
            )
        finally:
            connections.close_all()

    recorder = threading.Thread(target=record)
    recorder.start()
    assert read.wait(60)
    switcher = threading.Thread(target=switch)
    switcher.start()
    # The switch either commits now, or waits for the recording to commit.
    deadline = time.monotonic() + 20
    while switcher.is_alive() and not _waiting_on_a_lock() and time.monotonic() < deadline:
        time.sleep(0.05)
    release.set()
    recorder.join(60)
    switcher.join(60)
    assert outcome["batch"] == "done" and "version" in outcome
    made = Unit.objects.filter(attempts__batch=running, attempts__outcome=Attempt.Outcome.SUCCEEDED)
    assert made.exists()
    # Made under the old version, so the new one has them to do.
    assert set(made.values_list("state", flat=True)) == {UnitState.PENDING}
