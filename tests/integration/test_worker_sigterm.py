"""SIGTERM (a deploy, a scale-down): the worker finishes the batch it holds, then stops;
a new worker takes the rest; no unit is processed twice."""

from __future__ import annotations

import os
import signal

import pytest

from campaigns import selectors
from campaigns.models import Attempt, Batch
from campaigns.runs import setup, start
from tests.integration.test_worker_killed import _corpus
from tests.worker import wait_until

pytestmark = pytest.mark.integration


# "1": batches handed to the finisher thread once their model ran (BATCH_PIPELINE).
@pytest.mark.parametrize("pipeline", ["0", "1"])
def test_sigterm_lets_the_running_batch_finish_and_nothing_runs_twice(
    start_worker, project, tmp_path, output_root, pipeline
):
    corpus = tmp_path / "long-corpus"
    corpus.mkdir()
    _corpus(corpus, 48)
    campaign, _ = setup.campaign_create(
        name="terminated",
        processor="text-embedding",
        project=project,
        input_folder=corpus,
        params={"batch_size": 8},
        checkpoint_after=0,
    )
    start.campaign_run(campaign=campaign)

    # when: SIGTERM while the worker holds a batch
    worker = start_worker(env_extra={"BATCH_PIPELINE": pipeline})
    running = Batch.objects.filter(campaign=campaign, state=Batch.State.RUNNING)
    wait_until(running.exists, timeout=120, interval=0.02, worker=worker)
    held = running.first()
    os.kill(worker.proc.pid, signal.SIGTERM)  # the main process: Celery's warm shutdown
    worker.proc.wait(timeout=120)

    # then: the batch it held was finished and recorded, not abandoned
    held.refresh_from_db()
    assert held.state == Batch.State.DONE, worker.output()[-2000:]
    assert not running.exists()

    # and a new worker finishes the campaign with one attempt per unit
    worker = start_worker(env_extra={"BATCH_PIPELINE": pipeline})
    wait_until(
        lambda: not selectors.campaign_counts(campaign=campaign).active, timeout=240, worker=worker
    )
    counts = selectors.campaign_counts(campaign=campaign)
    assert counts.succeeded == 48 and counts.failed == 1
    per_unit = Attempt.objects.filter(unit__campaign=campaign).values_list("unit_id", flat=True)
    assert len(per_unit) == len(set(per_unit)) == 49
