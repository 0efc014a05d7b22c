"""A real worker on the embedded broker keeps running while messages race its polls."""

from __future__ import annotations

import time

import pytest
from django.conf import settings

from portal.celery import app as celery_app

pytestmark = pytest.mark.integration

PINGS = 1000


def test_an_idle_worker_answers_a_thousand_pings_and_keeps_running(start_worker):
    if not settings.CELERY_BROKER_URL.startswith("filesystem://"):
        pytest.skip("the embedded broker's own test; the services pass runs on Redis")
    # given an idle worker polling the embedded broker every 10 ms
    worker = start_worker()
    worker.wait_ready()

    # when a thousand pings are sent one after the other: each is a message file
    # the worker's consumer races to read, and its reply one this process races to
    # read (the worker's own beat sends its sweeps the same way)
    started = time.monotonic()
    answered = 0
    for _ in range(PINGS):
        answered += len(celery_app.control.ping(timeout=2.0, limit=1))
        assert worker.proc.poll() is None, worker.output()[-3000:]

    # then every ping was answered, and the worker still runs
    assert answered == PINGS
    assert worker.proc.poll() is None
    assert "Unrecoverable error" not in worker.output()
    assert time.monotonic() - started < 60
