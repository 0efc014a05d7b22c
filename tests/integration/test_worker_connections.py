"""A worker keeps its database connection from one batch to the next."""

from __future__ import annotations

import time

import pytest
from django.db import connection

from campaigns import selectors
from campaigns.runs import start
from tests.worker import wait_until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL counts its sessions"),
]


def _sessions() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
        return cursor.fetchone()[0]


def test_a_worker_opens_no_database_session_a_batch(start_worker, make_campaign):
    # given: a worker that has started and run one batch (its connections open)
    worker = start_worker()
    warm = make_campaign("warm-up", batch_size=40)
    start.campaign_run(campaign=warm)
    wait_until(
        lambda: not selectors.campaign_counts(campaign=warm).active, timeout=180, worker=worker
    )
    campaign = make_campaign("connections", batch_size=2)
    time.sleep(1.5)  # sessions are counted by each server process, flushed within a second
    before = _sessions()

    # when: it runs twenty batches
    batches = start.campaign_run(campaign=campaign)
    wait_until(
        lambda: not selectors.campaign_counts(campaign=campaign).active, timeout=180, worker=worker
    )
    time.sleep(1.5)

    # then: a handful of sessions at most (a connection's age runs out, a
    # thread's own), not one or two a batch as when each task closed them
    assert batches == 20
    assert _sessions() - before < 5
