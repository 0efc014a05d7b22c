"""Each worker process's heartbeat row (the live workers panel reads it), and
the GPU utilisation a batch records where NVML answers."""

from __future__ import annotations

import os
import threading

import pytest
import torch

from campaigns.db import run_timeline
from campaigns.models import Batch, WorkerBeat
from campaigns.watch import charts, state
from gpuworker import beat, memory, nvml
from tests.worker import wait_until


@pytest.mark.parametrize(
    ("argv", "queues"),
    [
        (["celery", "-A", "portal", "worker", "-Q", "gpu,portal", "-c", "1"], "gpu,portal"),
        (["celery", "worker", "--queues=gpu"], "gpu"),
        (["celery", "worker", "-Qportal"], "portal"),
        (["celery", "worker", "--queues", "gpu"], "gpu"),
    ],
)
def test_the_queues_come_from_the_command_line(monkeypatch, argv, queues):
    monkeypatch.setattr("sys.argv", argv)
    assert beat.queues() == queues


def test_without_q_the_queues_are_those_celery_consumes(monkeypatch):
    monkeypatch.setattr("sys.argv", ["celery", "worker"])
    assert "celery" in beat.queues().split(",")  # the default queue


def test_a_worker_process_registers_beats_and_says_when_it_stops(
    transactional_db, settings, monkeypatch
):
    settings.WORKER_BEAT_SECONDS = 0.2
    monkeypatch.setattr("sys.argv", ["celery", "worker", "-Q", "gpu"])
    keeper = beat._Beat()
    keeper.start()
    try:
        wait_until(lambda: WorkerBeat.objects.filter(name=beat.name()).exists(), timeout=20)
        row = WorkerBeat.objects.get()
        assert (row.queues, row.stopped_at, row.host) == ("gpu", None, beat.name().split(":")[0])
        assert row.device.startswith("cpu (")
        first = row.beat_at
        keeper.batches_done = 3
        wait_until(
            lambda: (
                WorkerBeat.objects.get().beat_at > first
                and WorkerBeat.objects.get().batches_done == 3
            ),
            timeout=20,
        )
        # An operator removed the row: the next beat writes it again.
        WorkerBeat.objects.all().delete()
        wait_until(lambda: WorkerBeat.objects.exists(), timeout=20)
    finally:
        keeper.stopped()
        keeper.thread.join(timeout=10)
    assert WorkerBeat.objects.get().stopped_at is not None
    listed = state.workers(now=WorkerBeat.objects.get().beat_at)
    assert [w.stopped for w in listed] == [True] and not listed[0].live


def test_naming_the_device_leaves_the_process_its_share_of_the_cores(settings):
    # given: a process told it shares its device with another, whose beat
    # thread names the device before the process's first batch
    settings.WORKERS_PER_DEVICE = 2
    before = torch.get_num_threads()
    memory.work_device.cache_clear()
    try:
        named = []
        thread = threading.Thread(target=lambda: named.append(beat.device()))
        thread.start()
        thread.join()
        # when: the process takes its device for a batch
        memory.work_device()
        # then: its batches run on half the cores
        assert named[0].startswith("cpu (")
        assert torch.get_num_threads() == max(1, len(os.sched_getaffinity(0)) // 2)
    finally:
        memory.work_device.cache_clear()
        torch.set_num_threads(before)


def test_a_batch_records_the_gpu_utilisation_nvml_gives(
    make_campaign, run_here, output_root, monkeypatch
):
    monkeypatch.setattr(nvml, "utilization", lambda since=None: 73)
    campaign = make_campaign("texts")
    campaign.checkpoint_after = 0
    campaign.save(update_fields=["checkpoint_after"])
    run_here(campaign)
    done = Batch.objects.filter(campaign=campaign, state="done")
    assert done.exists() and all(b.metrics.get("gpu_util") == 73 for b in done)
    drawn = charts.worker_charts(
        run_timeline.timeline(campaign_id=campaign.pk, slices=charts.BUCKETS)
    )
    assert [c.label for c in drawn] == [
        "worker process RSS per worker",
        "GPU utilisation, % per worker",
    ]


def test_nvml_answers_a_percentage_or_nothing():
    """A percentage where NVIDIA's driver is there, None without it (a CPU worker)."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        assert nvml.utilization() is None
    else:
        assert 0 <= nvml.utilization() <= 100


def test_the_pool_decides_which_process_beats(monkeypatch):
    """Prefork: each pool child beats (worker_process_init), not the main
    process that runs no task; solo and threads pools run tasks in the main
    process, which beats from worker_ready."""
    from types import SimpleNamespace

    from celery.concurrency.prefork import TaskPool as PreforkPool
    from celery.concurrency.solo import TaskPool as SoloPool
    from celery.concurrency.thread import TaskPool as ThreadPool

    started = []
    monkeypatch.setattr(beat._beat, "start", lambda: started.append(1))
    for pool, beats in ((PreforkPool, False), (SoloPool, True), (ThreadPool, True)):
        started.clear()
        beat._ready(sender=SimpleNamespace(controller=SimpleNamespace(pool_cls=pool)))
        assert bool(started) is beats, pool
    started.clear()
    beat._child_started()
    assert started
