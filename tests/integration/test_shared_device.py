"""Several pool processes of one worker feeding one device (WORKERS_PER_DEVICE)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from django.db.models import Count

from campaigns.models import IN_FLIGHT, Attempt, Batch, Unit, UnitState
from campaigns.runs import start
from tests.vectors import unit_vector
from tests.worker import wait_until

pytestmark = pytest.mark.integration


def test_two_pool_processes_share_the_device_and_the_campaign(
    start_worker, make_campaign, output_root
):
    # given: a worker with two pool processes told they share its device
    worker = start_worker(concurrency=2, env_extra={"WORKERS_PER_DEVICE": "2"})
    campaign = make_campaign("shared-device", batch_size=2)
    total = Unit.objects.filter(campaign=campaign).count()
    worker.wait_ready()

    # when
    batches = start.campaign_run(campaign=campaign)
    wait_until(
        lambda: not Unit.objects.filter(campaign=campaign, state__in=IN_FLIGHT).exists(),
        timeout=240,
        worker=worker,
    )

    # then: both processes took batches, each on its half of the cores
    by_process = dict(
        Batch.objects.filter(campaign=campaign).values_list("worker").annotate(n=Count("pk"))
    )
    assert len(by_process) == 2, by_process
    assert sum(by_process.values()) == batches
    cores = len(os.sched_getaffinity(0))
    for metrics in Batch.objects.filter(campaign=campaign).values_list("metrics", flat=True):
        assert metrics["runtime"]["workers_per_device"] == 2
        assert metrics["runtime"]["threads"] == max(1, cores // 2)
    # and every unit ended once: the good ones with a unit-length vector
    ended = Attempt.objects.filter(unit__campaign=campaign).values("unit").annotate(n=Count("pk"))
    assert ended.count() == total
    assert not ended.filter(n__gt=1).exists()
    done = Unit.objects.filter(campaign=campaign, state=UnitState.SUCCEEDED)
    assert done.exists()
    for unit in done:
        vector = unit_vector(output_root, unit.output_path)
        assert vector.shape == (384,)
        assert abs(float(np.linalg.norm(vector)) - 1.0) < 1e-4
    assert "WORKERS_PER_DEVICE" not in worker.output()
    assert "Traceback" not in worker.output(), worker.output()[-3000:]


def test_a_worker_whose_processes_think_the_device_is_theirs_says_so(start_worker):
    # given: two pool processes, WORKERS_PER_DEVICE left at 1
    worker = start_worker(concurrency=2)

    # then: the worker starts, and its log says what to set
    worker.wait_ready()
    assert "2 pool processes share this worker's device but WORKERS_PER_DEVICE is 1" in (
        worker.output()
    )
    assert "set WORKERS_PER_DEVICE=2" in worker.output()
