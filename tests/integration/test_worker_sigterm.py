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


@pytest.mark.parametrize("pipeline", ["0", "1"])
def test_sigterm_to_the_whole_process_group_still_records_the_running_batch(
    start_worker, project, tmp_path, output_root, pipeline
):
    # given: a worker running a campaign's first batch
    corpus = tmp_path / "long-corpus"
    corpus.mkdir()
    _corpus(corpus, 24)
    campaign, _ = setup.campaign_create(
        name="group-terminated",
        processor="text-embedding",
        project=project,
        input_folder=corpus,
        params={"batch_size": 8},
        checkpoint_after=0,
    )
    start.campaign_run(campaign=campaign)
    worker = start_worker(env_extra={"BATCH_PIPELINE": pipeline})
    running = Batch.objects.filter(campaign=campaign, state=Batch.State.RUNNING)
    wait_until(running.exists, timeout=120, interval=0.02, worker=worker)
    held = running.first()

    # when: SIGTERM to every process of the worker at once (systemd's default
    # KillMode=control-group, `kill -TERM -PGID`)
    os.killpg(worker.proc.pid, signal.SIGTERM)
    worker.proc.wait(timeout=120)

    # then: the pool process finished and recorded its batch; nothing was lost
    held.refresh_from_db()
    log = worker.output()
    assert "WorkerLostError" not in log, log[-3000:]
    assert held.state == Batch.State.DONE, log[-3000:]
    assert not running.exists()
    # every unit of it has its outcome (the empty text fails as it should)
    assert Attempt.objects.filter(batch=held).count() == held.size


def test_the_shipped_systemd_units_stop_the_worker_with_kill_mode_mixed():
    # KillMode=mixed: SIGTERM to the main process only, which lets the batch
    # finish, and SIGKILL to all of them only after TimeoutStopSec.
    from pathlib import Path

    units = sorted((Path(__file__).resolve().parents[2] / "deploy" / "systemd").glob("*.service"))
    workers = [u for u in units if "celery -A portal worker" in u.read_text()]
    assert workers, units
    for unit in workers:
        lines = [line.strip() for line in unit.read_text().splitlines()]
        assert "KillMode=mixed" in lines, unit
        stop = [line for line in lines if line.startswith("TimeoutStopSec=")]
        assert stop and int(stop[0].split("=")[1].rstrip("s")) >= 60 * 60, unit
